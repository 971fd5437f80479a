#include "common/checkpoint_manifest.h"

#include <gtest/gtest.h>

#include "absl/status/status.h"

namespace muster {
namespace {

TEST(CheckpointManifestTest, WhatIsWrittenReadsBackTheSame) {
  CheckpointManifest m;
  m.meta.step = 120;
  m.meta.epoch = 2;
  m.meta.sample_offset = 3840;
  m.meta.generation = 7;
  m.meta.world_size = 4;
  m.meta.lr_world_size = 2;
  m.meta.returned_epoch = 2;
  m.meta.returned_examples = {9, 4};
  m.meta.model = "mlp";
  m.meta.optimizer = "adamw";
  m.meta.rng_state = "00ff";
  m.files["model.safetensors"] = {1024, "0123456789abcdef"};
  m.files["optimizer.safetensors"] = {2048, "fedcba9876543210"};
  absl::StatusOr<CheckpointManifest> back = DecodeManifest(EncodeManifest(m), "m");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->meta.step, 120);
  EXPECT_EQ(back->meta.epoch, 2);
  EXPECT_EQ(back->meta.sample_offset, 3840);
  EXPECT_EQ(back->meta.generation, 7u);
  EXPECT_EQ(back->meta.world_size, 4);
  EXPECT_EQ(back->meta.lr_world_size, 2);
  EXPECT_EQ(back->meta.returned_epoch, 2);
  EXPECT_EQ(back->meta.returned_examples, (std::vector<int64_t>{9, 4}));
  EXPECT_EQ(back->meta.model, "mlp");
  EXPECT_EQ(back->meta.optimizer, "adamw");
  EXPECT_EQ(back->meta.rng_state, "00ff");
  ASSERT_EQ(back->files.size(), 2u);
  EXPECT_EQ(back->files["optimizer.safetensors"].bytes, 2048u);
  EXPECT_EQ(back->files["model.safetensors"].xxh3, "0123456789abcdef");
}

// Loading and the catalog rebuild refuse the same manifests, naming why.
TEST(CheckpointManifestTest, WhatIsNotAManifestIsNamed) {
  const std::string files = R"("files": {"model.safetensors": {"bytes": 1, "xxh3": "ab"}})";
  auto decode = [&](const std::string& fields) {
    return DecodeManifest("{" + fields + "}", "dir/manifest.json");
  };
  const std::string good =
      R"("format": "muster-checkpoint-1", "step": 5, "epoch": 0, "sample_offset": 0,)"
      R"( "generation": 1, "world_size": 2, )";
  EXPECT_TRUE(decode(good + files).ok());
  EXPECT_TRUE(absl::IsDataLoss(DecodeManifest("[1]", "p").status()));
  absl::Status other = decode(R"("format": "other", )" + good.substr(33) + files).status();
  EXPECT_TRUE(absl::IsInvalidArgument(other)) << other;
  EXPECT_NE(other.message().find("\"other\""), std::string::npos) << other;
  absl::Status negative =
      decode(R"("format": "muster-checkpoint-1", "step": -5, "epoch": 0, "sample_offset": 0,)"
             R"( "generation": 1, "world_size": 2, )" + files)
          .status();
  EXPECT_TRUE(absl::IsDataLoss(negative)) << negative;
  EXPECT_NE(negative.message().find("step"), std::string::npos) << negative;
  absl::Status no_files = decode(good + R"("files": {})").status();
  EXPECT_TRUE(absl::IsDataLoss(no_files)) << no_files;
  absl::Status escape =
      decode(good + R"("files": {"../x": {"bytes": 1, "xxh3": "ab"}})").status();
  EXPECT_TRUE(absl::IsDataLoss(escape)) << escape;
  EXPECT_NE(escape.message().find("../x"), std::string::npos) << escape;
}

TEST(StepDirNameTest, OnlyStepDashANumberIsACheckpointsDirectory) {
  int64_t step = -1;
  EXPECT_TRUE(ParseStepDirName("step-20", &step));
  EXPECT_EQ(step, 20);
  EXPECT_FALSE(ParseStepDirName("step-", &step));
  EXPECT_FALSE(ParseStepDirName("step-20.tmp", &step));
  EXPECT_FALSE(ParseStepDirName("stepx20", &step));
  EXPECT_FALSE(ParseStepDirName("optimizer-shard-0-of-2.safetensors", &step));
}

}  // namespace
}  // namespace muster
