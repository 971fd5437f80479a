#include "coordinator/catalog_rebuild.h"

#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "absl/strings/str_format.h"
#include "common/clock.h"

namespace muster {
namespace {

void Write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

std::string Manifest(int step, int bytes) {
  return absl::StrFormat(
      R"({"format": "muster-checkpoint-1", "step": %d, "epoch": 0, "sample_offset": 0,)"
      R"( "generation": 3, "world_size": 4, "files": {"model.safetensors":)"
      R"( {"bytes": %d, "xxh3": "00000000000000ab"}}})",
      step, bytes);
}

class CatalogRebuildTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/rebuild-" + std::to_string(::getpid());
    std::system(("rm -rf " + dir_ + " && mkdir -p " + dir_).c_str());
  }
  void Step(const std::string& name, const std::string& manifest, int data_bytes) {
    const std::string d = dir_ + "/" + name;
    ::mkdir(d.c_str(), 0755);
    if (data_bytes >= 0) Write(d + "/model.safetensors", std::string(data_bytes, 'x'));
    if (!manifest.empty()) Write(d + "/manifest.json", manifest);
  }
  std::string dir_;
};

TEST_F(CatalogRebuildTest, CompleteCheckpointsBecomeCommittedRecordsAndTheRestAreNamed) {
  Step("step-200", Manifest(200, 10), 10);
  Step("step-100", Manifest(100, 10), 10);
  Step("step-300", Manifest(300, 10), 7);    // cut short
  Step("step-400", Manifest(400, 10), -1);   // data file gone
  Step("step-500", "{not json", 10);
  Step("step-600", "", 10);                  // no manifest (a write that died)
  Step("step-700", Manifest(70, 10), 10);    // renamed
  Step("notes", "", -1);                     // not a step directory

  absl::StatusOr<RebuiltCatalog> c = RebuildCatalog(dir_, RealClock::Get());
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->records.size(), 2u);
  EXPECT_EQ(c->records[0].step, 100);
  EXPECT_EQ(c->records[0].id, 1u);
  EXPECT_EQ(c->records[1].step, 200);
  EXPECT_EQ(c->records[1].id, 2u);
  const CheckpointRecord& r = c->records[1];
  EXPECT_EQ(r.state, CheckpointState::kCommitted);
  EXPECT_EQ(r.generation, 3u);
  EXPECT_EQ(r.world_size(), 4u);
  ASSERT_EQ(r.files.size(), 2u);
  EXPECT_EQ(r.files[0].path, dir_ + "/step-200/model.safetensors");
  EXPECT_EQ(r.files[0].bytes, 10u);
  EXPECT_EQ(r.files[0].checksum, "00000000000000ab");
  // The manifest itself, checksummed as the trainers will check it.
  const std::string manifest = Manifest(200, 10);
  EXPECT_EQ(r.files[1].path, dir_ + "/step-200/manifest.json");
  EXPECT_EQ(r.files[1].bytes, manifest.size());
  EXPECT_EQ(r.files[1].checksum,
            absl::StrFormat("%016x", XXH3_64bits(manifest.data(), manifest.size())));

  ASSERT_EQ(c->skipped.size(), 5u);
  auto skipped = [&](const std::string& what) {
    for (const std::string& s : c->skipped) {
      if (s.find(what) != std::string::npos) return true;
    }
    return false;
  };
  EXPECT_TRUE(skipped("step-300: model.safetensors has 7 bytes, the manifest says 10"));
  EXPECT_TRUE(skipped("step-400: model.safetensors is missing"));
  EXPECT_TRUE(skipped("step-500: manifest.json: not a JSON object"));
  EXPECT_TRUE(skipped("step-600: no manifest.json"));
  EXPECT_TRUE(skipped("step-700: its manifest says step 70"));
}

TEST_F(CatalogRebuildTest, AMissingDirectoryIsNotFound) {
  EXPECT_EQ(RebuildCatalog(dir_ + "/absent", RealClock::Get()).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace muster
