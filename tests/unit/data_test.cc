#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>

#include <gtest/gtest.h>

#include "common/launch_env.h"
#include "trainer/data/dataset.h"
#include "trainer/data/idx.h"
#include "trainer/data/sampler.h"

namespace muster {
namespace {

TEST(SamplerTest, EverySampleOncePerEpochAcrossRanks) {
  DistributedSampler s(1003, 7);
  for (int world : {1, 3, 4}) {
    std::multiset<int64_t> seen;
    int64_t offset = 0;
    while (offset < 1003) {
      int64_t global = 0;
      for (int r = 0; r < world; ++r) {
        SampledBatch b = s.Next(offset, world, r, 32);
        EXPECT_EQ(b.epoch, 0);
        seen.insert(b.indices.begin(), b.indices.end());
        global = b.global_batch;
      }
      offset += global;
    }
    EXPECT_EQ(offset, 1003);
    EXPECT_EQ(seen.size(), 1003u);
    EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), 1003u) << "world " << world;
  }
}

TEST(SamplerTest, ReshardingMidEpochKeepsExactlyOnce) {
  DistributedSampler s(1000, 3);
  std::multiset<int64_t> seen;
  int64_t offset = 0;
  int world = 4;
  for (int step = 0; offset < 1000; ++step) {
    if (step == 3) world = 3;  // a member failed
    if (step == 6) world = 5;  // two joined
    int64_t global = 0;
    for (int r = 0; r < world; ++r) {
      SampledBatch b = s.Next(offset, world, r, 16);
      seen.insert(b.indices.begin(), b.indices.end());
      global = b.global_batch;
    }
    offset += global;
  }
  EXPECT_EQ(seen.size(), 1000u);
  EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), 1000u);
}

TEST(SamplerTest, GlobalBatchDoesNotDependOnTheSplit) {
  DistributedSampler s(500, 11);
  std::vector<int64_t> one = s.Next(64, 1, 0, 64).indices;
  std::vector<int64_t> four;
  for (int r = 0; r < 4; ++r) {
    auto b = s.Next(64, 4, r, 16).indices;
    four.insert(four.end(), b.begin(), b.end());
  }
  EXPECT_EQ(one, four);
  EXPECT_NE(s.Permutation(0), s.Permutation(1));  // reshuffled per epoch
  EXPECT_EQ(s.Next(500, 2, 0, 8).epoch, 1);
}

// The global batch of a step: every rank's share, in rank order.
std::vector<int64_t> GlobalBatch(DistributedSampler& s, const SamplerPosition& at, int world,
                                 int batch) {
  std::vector<int64_t> out;
  for (int r = 0; r < world; ++r) {
    auto b = s.Next(at, world, r, batch).indices;
    out.insert(out.end(), b.begin(), b.end());
  }
  return out;
}

TEST(SamplerTest, ASalvagedStepThatLostTheLastShareContinuesLikeTheSmallerWorld) {
  DistributedSampler s(300, 5);
  SamplerPosition at{40, 0, {}};
  // Step at world 4 whose rank 3 died: ranks 0-2 trained, rank 3's share is returned.
  const SampledBatch step = s.Next(at, 4, 0, 8);
  SamplerPosition salvaged = s.Advance(at, step, 4, 8, {3});
  EXPECT_EQ(salvaged.offset, 72);
  EXPECT_EQ(salvaged.returned, s.Next(at, 4, 3, 8).indices);
  // The reference: world 3 from that step on.
  SamplerPosition reference{40, 0, {}};
  reference.offset += s.Next(reference, 3, 0, 8).global_batch;
  for (int k = 0; k < 5; ++k) {
    ASSERT_EQ(GlobalBatch(s, salvaged, 3, 8), GlobalBatch(s, reference, 3, 8)) << "step " << k;
    salvaged = s.Advance(salvaged, s.Next(salvaged, 3, 0, 8), 3, 8, {});
    reference = s.Advance(reference, s.Next(reference, 3, 0, 8), 3, 8, {});
  }
  EXPECT_EQ(salvaged, reference);
}

TEST(SamplerTest, ReturnedExamplesKeepExactlyOncePerEpochThroughLossesAndResizes) {
  DistributedSampler s(997, 13);
  std::map<int64_t, std::multiset<int64_t>> seen;  // epoch -> examples trained on
  SamplerPosition at;
  int world = 5;
  uint32_t rng = 1;
  for (int step = 0; !s.Done(at, 3); ++step) {
    rng = rng * 1103515245u + 12345u;
    std::vector<int> lost;
    if (rng % 7 == 0) lost = {static_cast<int>((rng >> 8) % world)};  // one share lost
    if (rng % 11 == 0 && world > 1) lost = {0, world - 1};           // two lost
    const SampledBatch any = s.Next(at, world, 0, 16);
    for (int r = 0; r < world; ++r) {
      if (std::find(lost.begin(), lost.end(), r) != lost.end()) continue;
      const SampledBatch b = s.Next(at, world, r, 16);
      seen[b.epoch].insert(b.indices.begin(), b.indices.end());
    }
    at = s.Advance(at, any, world, 16, lost);
    if (!lost.empty()) world = std::max(1, world - 1);  // then the world shrinks...
    if (step % 9 == 8) world = std::min(6, world + 2);   // ...and grows again
  }
  ASSERT_EQ(seen.size(), 3u);
  for (const auto& [epoch, examples] : seen) {
    EXPECT_EQ(examples.size(), 997u) << "epoch " << epoch;
    EXPECT_EQ(std::set<int64_t>(examples.begin(), examples.end()).size(), 997u) << "epoch " << epoch;
  }
  EXPECT_EQ(s.Remaining(at, 3), 0);
}

TEST(SamplerTest, ReturnedExamplesOfAnEpochFinishItBeforeTheNextBegins) {
  DistributedSampler s(100, 2);
  SamplerPosition at{96, 0, {}};  // the last, short step of epoch 0
  const SampledBatch last = s.Next(at, 2, 0, 8);
  EXPECT_EQ(last.global_batch, 4);
  at = s.Advance(at, last, 2, 8, {1});
  EXPECT_EQ(at.offset, 100);
  EXPECT_FALSE(s.Done(at, 1));  // two examples of epoch 0 still untrained
  const SampledBatch next = s.Next(at, 2, 0, 8);
  EXPECT_EQ(next.epoch, 0);
  EXPECT_EQ(next.global_batch, 2);  // no example of epoch 1 joins them
  EXPECT_EQ(next.from_permutation, 0);
  at = s.Advance(at, next, 2, 8, {});
  EXPECT_TRUE(s.Done(at, 1));
}

std::string WriteGz(const std::string& name, const std::string& bytes) {
  const std::string path = ::testing::TempDir() + "/" + name;
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
  return path;
}

std::string Be32(uint32_t v) {
  return std::string{static_cast<char>(v >> 24), static_cast<char>(v >> 16),
                     static_cast<char>(v >> 8), static_cast<char>(v)};
}

TEST(IdxTest, ReadsAndRejectsDamagedFiles) {
  std::string good = Be32(0x803) + Be32(2) + Be32(2) + Be32(2) + std::string(8, '\x07');
  auto ok = ReadIdx(WriteGz("good.gz", good), 3);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->dims, (std::vector<uint32_t>{2, 2, 2}));
  EXPECT_EQ(ok->data[7], 7);

  auto truncated = ReadIdx(WriteGz("trunc.gz", good.substr(0, good.size() - 3)), 3);
  EXPECT_EQ(truncated.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(truncated.status().message().find("trunc.gz"), std::string::npos);
  EXPECT_NE(truncated.status().message().find("truncated"), std::string::npos);

  auto magic = ReadIdx(WriteGz("magic.gz", Be32(0x801) + good.substr(4)), 3);
  EXPECT_EQ(magic.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(magic.status().message().find("magic"), std::string::npos);

  EXPECT_EQ(ReadIdx("/nonexistent/x.gz", 3).status().code(), absl::StatusCode::kNotFound);
}

TEST(FashionMnistTest, MissingFileIsNamed) {
  auto d = LoadFashionMnist(::testing::TempDir() + "/no-such-dir", true);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(d.status().message().find("train-images-idx3-ubyte.gz"), std::string::npos);
}

TEST(FashionMnistTest, DebianPackageLoads) {
  auto d = LoadFashionMnist(kDefaultFashionMnistDir, false);
  if (!d.ok()) GTEST_SKIP() << "dataset-fashion-mnist not installed: " << d.status();
  EXPECT_EQ((*d)->size(), 10000);
  std::vector<float> img(784);
  int64_t label = -1, idx = 0;
  (*d)->Fill(&idx, 1, img.data(), &label);
  EXPECT_GE(label, 0);
  EXPECT_LT(label, 10);
}

TEST(LaunchEnvTest, SlurmTorchrunOpenMpiAndFlags) {
  std::map<std::string, std::string> env = {{"SLURM_PROCID", "5"},      {"SLURM_LOCALID", "1"},
                                            {"SLURM_NODEID", "2"},      {"SLURM_NTASKS", "8"},
                                            {"SLURMD_NODENAME", "jwc042"},
                                            {"SLURM_TASKS_PER_NODE", "2(x4)"}};
  auto get = [&](const char* n) -> const char* {
    auto it = env.find(n);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  auto id = ResolveLaunchIdentity({}, get, "host");
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(id->source, "slurm");
  EXPECT_EQ(id->member_id(), "jwc042/1");
  EXPECT_EQ(id->local_world_size, 2);
  EXPECT_EQ(id->rank, 5);

  env = {{"RANK", "3"}, {"LOCAL_RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "2"}};
  id = ResolveLaunchIdentity({}, get, "gpu7");
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(id->source, "torchrun");
  EXPECT_EQ(id->member_id(), "gpu7/1");

  env = {{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
         {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}};
  id = ResolveLaunchIdentity({"override", -1}, get, "h");
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(id->member_id(), "override/0");
  EXPECT_EQ(id->local_world_size, 4);

  // mpirun inside a Slurm allocation: every rank inherits the allocation's
  // SLURM_PROCID=0 and SLURM_LOCALID=0; OpenMPI's variables tell them apart.
  env = {{"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"}, {"SLURMD_NODENAME", "jwc007"},
         {"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
         {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"}};
  id = ResolveLaunchIdentity({}, get, "h");
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(id->source, "openmpi");
  EXPECT_EQ(id->member_id(), "jwc007/1");
  EXPECT_EQ(id->rank, 3);

  // Under `srun muster-agent`, the agent's variables beat Slurm's.
  env = {{"SLURM_PROCID", "1"}, {"SLURM_LOCALID", "0"}, {"SLURMD_NODENAME", "jwc042"},
         {"MUSTER_LOCAL_RANK", "3"}, {"MUSTER_LOCAL_WORLD_SIZE", "4"},
         {"MUSTER_NODE_ID", "jwc042"}};
  id = ResolveLaunchIdentity({}, get, "h");
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(id->source, "muster-agent");
  EXPECT_EQ(id->member_id(), "jwc042/3");
  EXPECT_EQ(id->local_world_size, 4);
  EXPECT_FALSE(id->spare);
  env["MUSTER_SPARE"] = "1";
  id = ResolveLaunchIdentity({}, get, "h");
  ASSERT_TRUE(id.ok());
  EXPECT_TRUE(id->spare);

  env = {{"SLURM_PROCID", "x"}};
  auto bad = ResolveLaunchIdentity({}, get, "h");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("SLURM_PROCID"), std::string::npos);
  EXPECT_EQ(*TasksOnNode("2(x3),1", 3), 1);
  EXPECT_FALSE(TasksOnNode("2(x3)", 3).ok());
}

}  // namespace
}  // namespace muster
