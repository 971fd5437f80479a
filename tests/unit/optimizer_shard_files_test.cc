#include "trainer/checkpoint/optimizer_shard_files.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/checkpoint_manifest.h"

namespace muster {
namespace {

// Two groups as an optimizer of Adam holds them: group 0 of "fc.weight"
// [2, 3] and "fc.bias" [3] (9 elements), group 1 of "out.weight" [5];
// per element "exp_avg", and a scalar "step" per group.
struct Model {
  std::vector<float> exp_avg0, exp_avg1;
  int64_t step0 = 7, step1 = 9;
  Model() : exp_avg0(9), exp_avg1(5) {
    std::iota(exp_avg0.begin(), exp_avg0.end(), 1.0f);
    std::iota(exp_avg1.begin(), exp_avg1.end(), 100.0f);
  }
};

// The groups of shard `shard` of `world` (ranges as ShardLayout cuts them).
std::vector<ShardFileGroup> Shard(const Model& m, int shard, int world) {
  auto range = [&](int64_t n) {
    const int64_t base = n / world, extra = n % world;
    const int64_t begin = shard * base + std::min<int64_t>(shard, extra);
    return std::make_pair(begin, begin + base + (shard < extra ? 1 : 0));
  };
  std::vector<ShardFileGroup> groups(2);
  const auto [b0, e0] = range(9);
  groups[0] = {9, b0, e0, {{"fc.weight", {2, 3}}, {"fc.bias", {3}}}, {}};
  groups[0].fields = {{"exp_avg", true, {"", "F32", {e0 - b0}, m.exp_avg0.data() + b0}},
                      {"step", false, {"", "I64", {}, &m.step0}}};
  const auto [b1, e1] = range(5);
  groups[1] = {5, b1, e1, {{"out.weight", {5}}}, {}};
  groups[1].fields = {{"exp_avg", true, {"", "F32", {e1 - b1}, m.exp_avg1.data() + b1}},
                      {"step", false, {"", "I64", {}, &m.step1}}};
  return groups;
}

class OptimizerShardFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/shards-", ::getpid(), "-",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    ASSERT_TRUE(DefaultFileSystem()->CreateDir(dir_).ok());
  }
  void TearDown() override { DefaultFileSystem()->RemoveAll(dir_).IgnoreError(); }

  // Writes the `world` shard files and a manifest naming them.
  void WriteAll(const Model& m, int world) {
    CheckpointManifest manifest;
    manifest.meta.step = 40;
    for (int r = 0; r < world; ++r) {
      const std::string name = ShardFileName(r, world);
      auto w = WriteShardFile(DefaultFileSystem(), dir_ + "/" + name, r, world, Shard(m, r, world));
      ASSERT_TRUE(w.ok()) << w.status();
      manifest.files[name] = {w->bytes, w->xxh3};
    }
    ASSERT_TRUE(WriteFileAtomically(DefaultFileSystem(), dir_ + "/" + kManifestName,
                                    EncodeManifest(manifest))
                    .ok());
  }
  std::map<std::string, SafetensorsFile> Read(int world) {
    std::map<std::string, SafetensorsFile> files;
    for (int r = 0; r < world; ++r) {
      const std::string name = ShardFileName(r, world);
      auto bytes = DefaultFileSystem()->ReadFile(dir_ + "/" + name, 1 << 20);
      EXPECT_TRUE(bytes.ok()) << bytes.status();
      auto parsed = ParseSafetensors(bytes.value_or(""), name);
      EXPECT_TRUE(parsed.ok()) << parsed.status();
      if (parsed.ok()) files[name] = *std::move(parsed);
    }
    return files;
  }

  std::string dir_;
};

template <typename T>
std::vector<T> Values(const SafetensorsFile& f, const std::string& name) {
  auto it = f.tensors.find(name);
  if (it == f.tensors.end()) return {};
  std::vector<T> v(it->second.size / sizeof(T));
  std::memcpy(v.data(), it->second.data, it->second.size);
  return v;
}

TEST(ShardFileNameTest, NamesShardAndWorld) {
  EXPECT_EQ(ShardFileName(2, 4), "optimizer-shard-2-of-4.safetensors");
  EXPECT_TRUE(IsShardFileName("optimizer-shard-0-of-1.safetensors"));
  EXPECT_FALSE(IsShardFileName("optimizer-shard-4-of-4.safetensors"));
  EXPECT_FALSE(IsShardFileName("optimizer.safetensors"));
  EXPECT_FALSE(IsShardFileName("optimizer-shard-1-of-2.safetensors.tmp"));
}

// Every world from 1 to 6 (ranges cutting through parameters, and empty
// ones where a group has fewer elements than shards): the consolidated file
// holds each parameter's field in its own shape, as an unsharded
// checkpoint names it, with the shards' elements in order.
TEST_F(OptimizerShardFilesTest, ShardsOfAnyWorldConsolidateIntoEveryParametersState) {
  const Model m;
  for (int world = 1; world <= 6; ++world) {
    WriteAll(m, world);
    auto whole = ConsolidateShards(Read(world), dir_);
    ASSERT_TRUE(whole.ok()) << world << ": " << whole.status();
    EXPECT_EQ(whole->tensors.size(), 6u) << world;
    EXPECT_EQ(whole->tensors.at("fc.weight.exp_avg").shape, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(Values<float>(*whole, "fc.weight.exp_avg"),
              std::vector<float>(m.exp_avg0.begin(), m.exp_avg0.begin() + 6))
        << world;
    EXPECT_EQ(Values<float>(*whole, "fc.bias.exp_avg"),
              std::vector<float>(m.exp_avg0.begin() + 6, m.exp_avg0.end()))
        << world;
    EXPECT_EQ(Values<float>(*whole, "out.weight.exp_avg"), m.exp_avg1) << world;
    EXPECT_EQ(Values<int64_t>(*whole, "fc.bias.step"), std::vector<int64_t>{7}) << world;
    EXPECT_EQ(Values<int64_t>(*whole, "out.weight.step"), std::vector<int64_t>{9}) << world;
    for (int r = 0; r < world; ++r) {
      DefaultFileSystem()->Remove(dir_ + "/" + ShardFileName(r, world)).IgnoreError();
    }
  }
}

// The command's path: the manifest's shard files, checked, consolidated
// into optimizer.safetensors beside them.
TEST_F(OptimizerShardFilesTest, ACheckpointDirectoryGetsItsOptimizerFile) {
  const Model m;
  WriteAll(m, 3);
  auto path = ConsolidateCheckpointDir(DefaultFileSystem(), dir_);
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*path, dir_ + "/optimizer.safetensors");
  auto bytes = DefaultFileSystem()->ReadFile(*path, 1 << 20);
  ASSERT_TRUE(bytes.ok());
  auto parsed = ParseSafetensors(*bytes, *path);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(Values<float>(*parsed, "out.weight.exp_avg"), m.exp_avg1);
}

// What is wrong is named, and nothing is written.
TEST_F(OptimizerShardFilesTest, AMissingOrDamagedShardIsDataLossNamingIt) {
  const Model m;
  WriteAll(m, 3);
  std::map<std::string, SafetensorsFile> files = Read(3);
  files.erase(ShardFileName(1, 3));
  absl::StatusOr<SafetensorsFile> whole = ConsolidateShards(files, dir_);
  EXPECT_TRUE(absl::IsDataLoss(whole.status())) << whole.status();
  EXPECT_NE(whole.status().message().find("optimizer-shard-1-of-3.safetensors is missing"),
            std::string::npos)
      << whole.status();

  // A shard that claims another range than its place.
  auto w =
      WriteShardFile(DefaultFileSystem(), dir_ + "/" + ShardFileName(1, 3), 1, 3, Shard(m, 2, 3));
  ASSERT_TRUE(w.ok()) << w.status();
  whole = ConsolidateShards(Read(3), dir_);
  EXPECT_TRUE(absl::IsDataLoss(whole.status())) << whole.status();
  EXPECT_NE(whole.status().message().find("optimizer-shard-1-of-3.safetensors: group 0"),
            std::string::npos)
      << whole.status();

  // The manifest's checksum no longer matches that file.
  auto path = ConsolidateCheckpointDir(DefaultFileSystem(), dir_);
  EXPECT_TRUE(absl::IsDataLoss(path.status())) << path.status();
  EXPECT_NE(path.status().message().find("damaged file"), std::string::npos) << path.status();
  EXPECT_FALSE(DefaultFileSystem()->Stat(dir_ + "/optimizer.safetensors").ok());

  EXPECT_TRUE(absl::IsNotFound(ConsolidateShards({}, dir_).status()));
}

}  // namespace
}  // namespace muster
