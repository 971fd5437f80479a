#include <zlib.h>

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

  env = {{"SLURM_PROCID", "x"}};
  auto bad = ResolveLaunchIdentity({}, get, "h");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("SLURM_PROCID"), std::string::npos);
  EXPECT_EQ(*TasksOnNode("2(x3),1", 3), 1);
  EXPECT_FALSE(TasksOnNode("2(x3)", 3).ok());
}

}  // namespace
}  // namespace muster
