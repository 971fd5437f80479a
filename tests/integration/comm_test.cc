// Communicators against a reference sum: every backend, world sizes 1-8,
// node splits 1xN, Nx1, 2x2, 2x3, 3+1, message sizes 0, 1, odd, 4 KiB-16 MiB,
// as threads against an in-process coordinator.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/clock.h"
#include "tests/integration/comm_harness.h"
#include "trainer/comm/forwarding.h"
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

// Whether every node of `c` holds as many ranks.
bool NodesOfEqualSize(const Case& c) {
  std::map<int, int> per_node;
  for (int n : c.split) ++per_node[n];
  return std::all_of(per_node.begin(), per_node.end(),
                     [&](const auto& n) { return n.second == per_node.begin()->second; });
}

// ReduceScatter and AllGather over segments of `counts` on `comm` (rank
// `rank` of counts.size()): each rank ends with its segment's sum, then
// with every rank's segment. Where `only_own` (a real reduce-scatter, not
// an all-reduce), the other segments keep what this rank put there.
void ExpectReduceScatterAndAllGather(Communicator& comm, int rank,
                                     const std::vector<size_t>& counts, absl::Time deadline,
                                     bool only_own) {
  const int w = static_cast<int>(counts.size());
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  std::vector<size_t> offset(w + 1, 0);
  for (int r = 0; r < w; ++r) offset[r + 1] = offset[r] + counts[r];
  std::vector<float> rs(total);
  for (size_t i = 0; i < total; ++i) rs[i] = TestValue(rank, i);
  ASSERT_TRUE(
      comm.ReduceScatter(rs.data(), counts, DataType::kFloat32, ReduceOp::kSum, deadline).ok());
  for (size_t i = offset[rank]; i < offset[rank + 1]; ++i) {
    float expected = 0;
    for (int r = 0; r < w; ++r) expected += TestValue(r, i);
    ASSERT_EQ(rs[i], expected) << "reduce-scatter i=" << i;
  }
  for (size_t i = 0; only_own && i < total; ++i) {
    if (i < offset[rank] || i >= offset[rank + 1]) {
      ASSERT_EQ(rs[i], TestValue(rank, i)) << comm.name() << " wrote another segment, i=" << i;
    }
  }
  std::vector<float> ag(total, -1.0f);
  for (size_t i = offset[rank]; i < offset[rank + 1]; ++i) ag[i] = static_cast<float>(rank);
  ASSERT_TRUE(comm.AllGather(ag.data(), counts, DataType::kFloat32, deadline).ok());
  for (int r = 0; r < w; ++r) {
    for (size_t i = offset[r]; i < offset[r + 1]; ++i) {
      ASSERT_EQ(ag[i], static_cast<float>(r)) << "all-gather i=" << i;
    }
  }
}

// The ranks of each node gather among themselves alone where the
// communicator knows its nodes (hierarchical, nodes of equal size): each
// rank of a node ends with its node's segments, and nothing from another
// node. Elsewhere the node is not known and the gather is refused.
void ExpectGatherInNode(Communicator& comm, const Case& c, int rank, absl::Time deadline) {
  std::map<int, int> per_node;
  for (int n : c.split) ++per_node[n];
  const int local_size = per_node.begin()->second;
  const bool even = NodesOfEqualSize(c);
  const std::vector<int> node = comm.NodeRanks();
  std::vector<size_t> counts(std::max<size_t>(node.size(), 1));
  for (size_t l = 0; l < counts.size(); ++l) counts[l] = 50 + 13 * l;
  std::vector<float> data(TotalCount(counts), -1.0f);
  if (c.backend != Backend::kHier || !even) {
    EXPECT_TRUE(node.empty()) << comm.name();
    EXPECT_EQ(comm.AllGatherInNode(data.data(), counts, DataType::kFloat32, deadline).code(),
              absl::StatusCode::kUnimplemented);
    return;
  }
  ASSERT_EQ(static_cast<int>(node.size()), local_size) << comm.name();
  const int local = rank % local_size;
  for (int l = 0; l < local_size; ++l) EXPECT_EQ(node[l], rank - local + l);
  size_t at = 0;
  for (int l = 0; l < local; ++l) at += counts[l];
  std::fill(data.begin() + at, data.begin() + at + counts[local], static_cast<float>(rank));
  ASSERT_TRUE(comm.AllGatherInNode(data.data(), counts, DataType::kFloat32, deadline).ok());
  at = 0;
  for (int l = 0; l < local_size; ++l) {
    for (size_t i = 0; i < counts[l]; ++i) {
      ASSERT_EQ(data[at + i], static_cast<float>(node[l])) << "segment " << l << " i=" << i;
    }
    at += counts[l];
  }
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
    // Reduce-scatter and all-gather over uneven segments, then over
    // segments of 0 elements (a sharded sync's bucket smaller than a
    // shard): only the odd ranks own any.
    std::vector<size_t> counts(w), sparse(w);
    for (int r = 0; r < w; ++r) {
      counts[r] = 100 + 37 * r;
      sparse[r] = r % 2 == 1 || w == 1 ? 41 : 0;
    }
    // Gloo and the hierarchical one on nodes of equal size send each rank
    // only its own segment's pieces.
    const bool only_own =
        c.backend == Backend::kGloo || (c.backend == Backend::kHier && NodesOfEqualSize(c));
    ExpectReduceScatterAndAllGather(comm, rank, counts, deadline, only_own);
    ExpectReduceScatterAndAllGather(comm, rank, sparse, deadline, only_own);
    if (c.backend == Backend::kHier && NodesOfEqualSize(c)) {
      // Segments past a round of its scratch (16 MiB in all): several
      // rounds, each a piece of every segment, of unequal lengths.
      std::vector<size_t> large(w);
      for (int r = 0; r < w; ++r) large[r] = (size_t{16} << 20) / (4 * w) * 2 + 123 * r;
      ExpectReduceScatterAndAllGather(comm, rank, large, deadline, only_own);
    }
    // An average too.
    std::vector<float> rs_avg(TotalCount(counts), static_cast<float>(rank * 2));
    ASSERT_TRUE(comm.ReduceScatter(rs_avg.data(), counts, DataType::kFloat32, ReduceOp::kAverage,
                                   deadline).ok());
    size_t own_at = 0;
    for (int r = 0; r < rank; ++r) own_at += counts[r];
    EXPECT_FLOAT_EQ(rs_avg[own_at + counts[rank] - 1], static_cast<float>(w - 1));
    ExpectGatherInNode(comm, c, rank, deadline);
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

// A communicator that forwards to another and says when it is destroyed.
class Watched : public ForwardingCommunicator {
 public:
  Watched(std::unique_ptr<Communicator> inner, std::atomic<bool>* destroyed)
      : ForwardingCommunicator(std::move(inner)), destroyed_(destroyed) {}
  ~Watched() override { *destroyed_ = true; }

 private:
  std::atomic<bool>* const destroyed_;
};

// Two nodes of two ranks move on to a next world with the same members.
// Node 0's ranks may all keep their node-local communicator and keep it;
// on node 1 one rank has none to keep (its own collective had failed), so
// both of node 1's ranks build a new one. Either way the next world reduces.
TEST(NodeCommKeepTest, ANodeKeepsItsCommunicatorOnlyWhenEveryRankOfItMay) {
  CommHarness h({0, 0, 1, 1}, "keep" + std::to_string(::getpid()));
  CommOptions o;
  o.backend = Backend::kHier;
  o.gloo.hostname = "127.0.0.1";
  o.clock = RealClock::Get();  // the next world's build below
  std::vector<int> node_of(4, -1);
  std::vector<std::atomic<bool>> destroyed(4);
  ASSERT_TRUE(h.Run(o, [&](RankContext& rc) {
    const int rank = rc.world.rank;
    node_of[rank] = rc.world.node_rank();
    WorldInfo next = rc.world;
    next.generation += 1;
    KeptNodeCommunicator kept = KeepNodeCommunicator(std::move(rc.comm), rc.world);
    ASSERT_NE(kept.comm, nullptr) << "an untouched node-local communicator is handed on";
    kept.comm = std::make_unique<Watched>(std::move(kept.comm), &destroyed[rank]);
    if (rc.world.node_rank() == 1 && rc.world.local_rank() == 1) kept = {};
    auto store = NewPrefixStore(rc.store.get(), "next");
    auto comm = BuildCommunicator(next, store.get(), o, absl::Now() + absl::Seconds(30), &kept);
    ASSERT_TRUE(comm.ok()) << comm.status();
    EXPECT_EQ(kept.comm, nullptr) << "consumed";
    std::vector<float> data(1000);
    for (size_t i = 0; i < data.size(); ++i) data[i] = TestValue(rank, i);
    ASSERT_TRUE((*comm)->AllReduce(data.data(), data.size(), DataType::kFloat32, ReduceOp::kSum,
                                   absl::Now() + absl::Seconds(30)).ok());
    for (size_t i = 0; i < data.size(); ++i) {
      float expected = 0;
      for (int r = 0; r < 4; ++r) expected += TestValue(r, i);
      ASSERT_EQ(data[i], expected) << "rank " << rank << " i=" << i;
    }
    // Still in use by the next world's communicator, or gone.
    EXPECT_EQ(destroyed[rank].load(), node_of[rank] == 1) << "rank " << rank;
  }).ok());
  for (int r = 0; r < 4; ++r) EXPECT_GE(node_of[r], 0);
}

// Where a Shrinkable fails, if anywhere.
enum class ShrinkFault { kNone, kReady, kShrink };

// A node-local communicator that can shrink, and records how: Shrink
// answers one of the smaller size and sets `shrunk` to the excluded ranks;
// `fault` makes ReadyToShrink or Shrink fail.
class Shrinkable : public Communicator {
 public:
  Shrinkable(int rank, int size, std::vector<int>* shrunk,
             ShrinkFault fault = ShrinkFault::kNone)
      : rank_(rank), size_(size), shrunk_(shrunk), fault_(fault) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "shrinkable"; }
  absl::Status AllReduce(void*, size_t, DataType, ReduceOp, absl::Time) override {
    return absl::OkStatus();
  }
  absl::Status ReduceScatter(void*, const std::vector<size_t>&, DataType, ReduceOp,
                             absl::Time) override {
    return absl::OkStatus();
  }
  absl::Status AllGather(void*, const std::vector<size_t>&, DataType, absl::Time) override {
    return absl::OkStatus();
  }
  absl::Status Broadcast(void*, size_t, DataType, int, absl::Time) override {
    return absl::OkStatus();
  }
  absl::Status Barrier(absl::Time) override { return absl::OkStatus(); }
  void Abort(const absl::Status&) override {}
  bool CanShrink() const override { return true; }
  absl::Status ReadyToShrink(absl::Time) override {
    return fault_ == ShrinkFault::kReady ? absl::InternalError("still busy") : absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<Communicator>> Shrink(const std::vector<int>& excluded,
                                                       absl::Time) override {
    *shrunk_ = excluded;
    if (fault_ == ShrinkFault::kShrink) return absl::InternalError("shrink failed");
    return std::make_unique<Shrinkable>(RankAfterShrink(rank_, excluded),
                                        size_ - static_cast<int>(excluded.size()), shrunk_);
  }

 private:
  const int rank_;
  const int size_;
  std::vector<int>* const shrunk_;
  const ShrinkFault fault_;
};

// `world` without the member at local rank `gone` of node 0, one generation
// later, as its rank `self` of the world before sees it.
WorldInfo WithoutLocal(const WorldInfo& world, int gone) {
  WorldInfo next = world;
  next.generation += 1;
  if (world.node_rank() != 0) return next;
  next.node_peers.erase(next.node_peers.begin() + gone);
  for (size_t l = 0; l < next.node_peers.size(); ++l) {
    next.node_peers[l].local_rank = static_cast<int>(l);
    next.node_peers[l].local_world_size = static_cast<int>(next.node_peers.size());
    if (next.node_peers[l].member_id == world.self.member_id) next.self = next.node_peers[l];
  }
  return next;
}

// Node 0 of three ranks loses its local rank 1; node 1, of one, loses
// nobody. `fail_at`: the local rank of node 0 whose shrink fails with
// `fault` (-1: none).
// What each rank got, by "node/local rank" of the world before: the size of
// what ReuseNodeCommunicator gave (0: build) and the ranks its Shrink left
// out.
struct Reused {
  int size = -1;
  std::vector<int> excluded;
};
std::map<std::string, Reused> ReuseAfterALoss(int fail_at,
                                              ShrinkFault fault = ShrinkFault::kShrink) {
  CommHarness h({0, 0, 0, 1}, absl::StrCat("shrink", ::getpid(), "_", fail_at, "_",
                                           static_cast<int>(fault)));
  CommOptions o;
  o.backend = Backend::kGloo;
  o.gloo.hostname = "127.0.0.1";
  std::vector<Reused> by_rank(4);
  std::vector<std::string> where(4);
  EXPECT_TRUE(h.Run(o, [&](RankContext& rc) {
    const int rank = rc.world.rank;
    const bool node0 = rc.world.node_rank() == 0;
    where[rank] = absl::StrCat(rc.world.node_rank(), "/", rc.world.local_rank());
    if (node0 && rc.world.local_rank() == 1) return;  // the member that is gone
    KeptNodeCommunicator kept;
    kept.generation = rc.world.generation;
    kept.members = NodeMembers(rc.world);
    kept.touched = node0;  // node 0's failure broke its communicator
    kept.comm = std::make_unique<Shrinkable>(rc.world.local_rank(), rc.world.local_world_size(),
                                             &by_rank[rank].excluded,
                                             node0 && rc.world.local_rank() == fail_at
                                                 ? fault
                                                 : ShrinkFault::kNone);
    const WorldInfo next = WithoutLocal(rc.world, 1);
    auto node_store = NewPrefixStore(rc.store.get(), absl::StrCat("next/node", next.node_rank()));
    auto comm = ReuseNodeCommunicator(&kept, next, node_store.get(),
                                      absl::Now() + absl::Seconds(30), RealClock::Get());
    ASSERT_TRUE(comm.ok()) << comm.status();
    EXPECT_EQ(kept.comm, nullptr) << "consumed";
    by_rank[rank].size = *comm == nullptr ? 0 : (*comm)->size();
    if (*comm != nullptr) {
      EXPECT_EQ((*comm)->rank(), next.local_rank());
    }
  }).ok());
  std::map<std::string, Reused> out;
  for (int r = 0; r < 4; ++r) out[where[r]] = by_rank[r];
  return out;
}

TEST(NodeCommReuseTest, ANodeThatLostAMemberShrinksAndOneThatLostNobodyKeeps) {
  std::map<std::string, Reused> got = ReuseAfterALoss(-1);
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got["0/0"].size, 2);
  EXPECT_EQ(got["0/2"].size, 2);
  EXPECT_EQ(got["0/0"].excluded, std::vector<int>{1});
  EXPECT_EQ(got["0/2"].excluded, std::vector<int>{1});
  EXPECT_EQ(got["1/0"].size, 1);
  EXPECT_TRUE(got["1/0"].excluded.empty()) << "kept as it was";
}

TEST(NodeCommReuseTest, AShrinkThatFailsOnOneRankMakesTheWholeNodeBuild) {
  std::map<std::string, Reused> got = ReuseAfterALoss(2);
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got["0/0"].size, 0);
  EXPECT_EQ(got["0/2"].size, 0);
  EXPECT_EQ(got["0/0"].excluded, std::vector<int>{1}) << "it shrank, then dropped what it made";
  EXPECT_EQ(got["1/0"].size, 1);
}

// Shrinking is collective: a rank that cannot get ready says so in the
// vote, and nobody starts a shrink that would wait for it.
TEST(NodeCommReuseTest, ARankThatCannotGetReadyToShrinkMakesTheNodeBuildWithoutShrinking) {
  std::map<std::string, Reused> got = ReuseAfterALoss(0, ShrinkFault::kReady);
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got["0/0"].size, 0);
  EXPECT_EQ(got["0/2"].size, 0);
  EXPECT_TRUE(got["0/0"].excluded.empty());
  EXPECT_TRUE(got["0/2"].excluded.empty()) << "no shrink was started";
  EXPECT_EQ(got["1/0"].size, 1);
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
