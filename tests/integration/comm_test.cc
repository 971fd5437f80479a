// Communicators against a reference sum: every backend, world sizes 1-8,
// node splits 1xN, Nx1, 2x2, 2x3, 3+1, message sizes 0, 1, odd, 4 KiB-16 MiB,
// as threads against an in-process coordinator.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/integration/comm_harness.h"
#include "trainer/comm/reduce.h"
#include "trainer/comm/shm/shm_communicator.h"

namespace muster {
namespace {

struct Case {
  Backend backend;
  NodeSplit split;
};

std::string Name(const Case& c) {
  const char* b = c.backend == Backend::kGloo ? "gloo" : c.backend == Backend::kShm ? "shm" : "hier";
  std::vector<int> per_node;
  for (int n : c.split) {
    if (n >= static_cast<int>(per_node.size())) per_node.resize(n + 1);
    ++per_node[n];
  }
  return absl::StrCat(b, "_", absl::StrJoin(per_node, "_"));
}

class AllReduceTest : public ::testing::TestWithParam<Case> {};

TEST_P(AllReduceTest, MatchesReferenceSumForEverySize) {
  const Case& c = GetParam();
  const int w = static_cast<int>(c.split.size());
  std::vector<size_t> sizes = {0, 1, 1023, 1024, 262144};
  sizes.push_back(w <= 4 ? 4u << 20 : 1u << 20);  // 16 MiB of float32 (4 MiB at 8 ranks)
  CommHarness h(c.split, "ar" + std::to_string(::getpid()));
  CommOptions o;
  o.backend = c.backend;
  o.shm_slot_bytes = 256 << 10;  // several rounds even for mid sizes
  ASSERT_TRUE(h.Run(o, [&](RankContext& rc) {
    for (size_t n : sizes) {
      std::vector<float> data(n);
      for (size_t i = 0; i < n; ++i) data[i] = TestValue(rc.world.rank, i);
      ASSERT_TRUE(rc.comm->AllReduce(data.data(), n, DataType::kFloat32, ReduceOp::kSum,
                                     absl::Now() + absl::Seconds(60)).ok())
          << rc.comm->name() << " n=" << n;
      for (size_t i = 0; i < n; ++i) {
        float expected = 0;
        for (int r = 0; r < w; ++r) expected += TestValue(r, i);
        ASSERT_EQ(data[i], expected) << rc.comm->name() << " rank " << rc.world.rank
                                     << " n=" << n << " i=" << i;
      }
    }
  }).ok());
}

TEST_P(AllReduceTest, AverageHalfPrecisionAndTheOtherCollectives) {
  const Case& c = GetParam();
  const int w = static_cast<int>(c.split.size());
  CommHarness h(c.split, "co" + std::to_string(::getpid()));
  CommOptions o;
  o.backend = c.backend;
  o.shm_slot_bytes = 4096;
  ASSERT_TRUE(h.Run(o, [&](RankContext& rc) {
    const int rank = rc.world.rank;
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    Communicator& comm = *rc.comm;
    // Average.
    std::vector<float> avg(777, static_cast<float>(rank * 2));
    ASSERT_TRUE(comm.AllReduce(avg.data(), avg.size(), DataType::kFloat32, ReduceOp::kAverage,
                               deadline).ok());
    EXPECT_FLOAT_EQ(avg[500], static_cast<float>(w - 1));
    // float16 and bfloat16.
    for (DataType t : {DataType::kFloat16, DataType::kBFloat16}) {
      auto to = t == DataType::kFloat16 ? FloatToHalf : FloatToBFloat16;
      auto from = t == DataType::kFloat16 ? HalfToFloat : BFloat16ToFloat;
      std::vector<uint16_t> h16(3001);
      for (size_t i = 0; i < h16.size(); ++i) h16[i] = to(TestValue(rank, i));
      ASSERT_TRUE(comm.AllReduce(h16.data(), h16.size(), t, ReduceOp::kSum, deadline).ok());
      for (size_t i = 0; i < h16.size(); i += 97) {
        float expected = 0;
        for (int r = 0; r < w; ++r) expected += TestValue(r, i);
        ASSERT_EQ(from(h16[i]), expected) << DataTypeName(t) << " i=" << i;
      }
    }
    // Reduce-scatter and all-gather over uneven segments.
    std::vector<size_t> counts(w);
    for (int r = 0; r < w; ++r) counts[r] = 100 + 37 * r;
    const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
    std::vector<size_t> offset(w + 1, 0);
    for (int r = 0; r < w; ++r) offset[r + 1] = offset[r] + counts[r];
    std::vector<float> rs(total);
    for (size_t i = 0; i < total; ++i) rs[i] = TestValue(rank, i);
    ASSERT_TRUE(comm.ReduceScatter(rs.data(), counts, DataType::kFloat32, ReduceOp::kSum,
                                   deadline).ok());
    for (size_t i = offset[rank]; i < offset[rank + 1]; ++i) {
      float expected = 0;
      for (int r = 0; r < w; ++r) expected += TestValue(r, i);
      ASSERT_EQ(rs[i], expected) << "reduce-scatter i=" << i;
    }
    std::vector<float> ag(total, -1.0f);
    for (size_t i = offset[rank]; i < offset[rank + 1]; ++i) ag[i] = static_cast<float>(rank);
    ASSERT_TRUE(comm.AllGather(ag.data(), counts, DataType::kFloat32, deadline).ok());
    for (int r = 0; r < w; ++r) {
      EXPECT_EQ(ag[offset[r]], static_cast<float>(r));
      EXPECT_EQ(ag[offset[r + 1] - 1], static_cast<float>(r));
    }
    // Broadcast from the last rank, and a barrier.
    std::vector<float> b(10000, static_cast<float>(rank));
    ASSERT_TRUE(comm.Broadcast(b.data(), b.size(), DataType::kFloat32, w - 1, deadline).ok());
    EXPECT_EQ(b[9999], static_cast<float>(w - 1));
    EXPECT_TRUE(comm.Barrier(deadline).ok());
    EXPECT_EQ(comm.Broadcast(b.data(), 1, DataType::kFloat32, w, deadline).code(),
              absl::StatusCode::kInvalidArgument);
  }).ok());
}

INSTANTIATE_TEST_SUITE_P(
    Backends, AllReduceTest,
    ::testing::Values(Case{Backend::kGloo, {0}}, Case{Backend::kGloo, {0, 1}},
                      Case{Backend::kGloo, {0, 1, 2}}, Case{Backend::kGloo, {0, 0, 1, 1, 2}},
                      Case{Backend::kShm, {0}}, Case{Backend::kShm, {0, 0}},
                      Case{Backend::kShm, {0, 0, 0}}, Case{Backend::kShm, {0, 0, 0, 0, 0, 0, 0, 0}},
                      Case{Backend::kHier, {0, 1}}, Case{Backend::kHier, {0, 1, 2}},
                      Case{Backend::kHier, {0, 0, 1, 1}}, Case{Backend::kHier, {0, 0, 0, 1, 1, 1}},
                      Case{Backend::kHier, {0, 0, 0, 1}}, Case{Backend::kHier, {0, 0, 0, 0}},
                      Case{Backend::kHier, {0, 0, 1, 1, 2, 2, 3, 3}}),
    [](const ::testing::TestParamInfo<Case>& info) { return Name(info.param); });

TEST(HierarchyPlanTest, UnevenNodesOwnMoreSegments) {
  // Nodes of 3 and 1 members: three segments, each with its own owners.
  HierarchyPlan plan = PlanHierarchy({3, 1});
  EXPECT_EQ(plan.segments, 3);
  ASSERT_EQ(plan.groups.size(), 3u);
  EXPECT_EQ(plan.owned_begin.at(1), (std::vector<int>{0, 3}));
  EXPECT_EQ(plan.owned_begin.at(3), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(plan.Owner(3, 1), 1);
  EXPECT_EQ(plan.Owner(1, 1), 0);
  // Two nodes of two: one group per local rank.
  HierarchyPlan even = PlanHierarchy({2, 2});
  ASSERT_EQ(even.groups.size(), 2u);
  EXPECT_EQ(even.Owner(2, even.groups[0].first_segment), 0);
  EXPECT_EQ(even.Owner(2, even.groups[1].first_segment), 1);
}

TEST(HierarchyPlanTest, SegmentsWithTheSameOwnersShareAGroup) {
  // Nodes of 4 and 2: the node of 2 owns two segments per member, so the
  // owners change at every segment on the node of 4: four groups.
  EXPECT_EQ(PlanHierarchy({4, 2}).groups.size(), 4u);
  // Only nodes of 1: one segment, one group of every node.
  HierarchyPlan flat = PlanHierarchy({1});
  EXPECT_EQ(flat.segments, 1);
  ASSERT_EQ(flat.groups.size(), 1u);
  // Repeats and order do not change the plan.
  EXPECT_EQ(PlanHierarchy({2, 3, 2, 3}).owned_begin, PlanHierarchy({3, 2}).owned_begin);
}

TEST(CommFactoryTest, ShmAcrossNodesIsRefused) {
  CommHarness h({0, 1}, "refuse" + std::to_string(::getpid()));
  CommOptions o;
  o.backend = Backend::kShm;
  absl::Status s = h.Run(o, [](RankContext&) {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("one node"), std::string::npos);
  EXPECT_EQ(ParseBackend("tcp").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace muster
