// Keeping a node's communicator between worlds (node_comm.h) and what a
// hierarchical communicator hands on (hierarchical.h), with communicators
// that record what they were asked.
#include "trainer/comm/node_comm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "trainer/comm/hierarchical.h"

namespace muster {
namespace {

// Records the calls it gets; every collective answers `answer`.
class RecordingCommunicator : public Communicator {
 public:
  RecordingCommunicator(int rank, int size, std::vector<std::string>* calls)
      : rank_(rank), size_(size), calls_(calls) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "recording"; }
  absl::Status AllReduce(void*, size_t, DataType, ReduceOp, absl::Time) override {
    return Record("AllReduce");
  }
  absl::Status ReduceScatter(void*, const std::vector<size_t>&, DataType, ReduceOp,
                             absl::Time) override {
    return Record("ReduceScatter");
  }
  absl::Status AllGather(void*, const std::vector<size_t>&, DataType, absl::Time) override {
    return Record("AllGather");
  }
  absl::Status Broadcast(void*, size_t, DataType, int, absl::Time) override {
    return Record("Broadcast");
  }
  absl::Status Barrier(absl::Time) override { return Record("Barrier"); }
  void Abort(const absl::Status&) override { calls_->push_back(name_ + ".Abort"); }
  bool CanShrink() const override { return can_shrink; }

  RecordingCommunicator* Named(std::string name) {
    name_ = std::move(name);
    return this;
  }
  absl::Status answer;
  bool can_shrink = false;

 private:
  absl::Status Record(const char* call) {
    calls_->push_back(absl::StrCat(name_, ".", call));
    return answer;
  }
  const int rank_;
  const int size_;
  std::vector<std::string>* const calls_;
  std::string name_;
};

// A hierarchical communicator of rank `local_rank` on a node of
// `local_size` among two nodes, with recording parts; `*intra` and
// `*inter` point at them.
std::unique_ptr<Communicator> TwoNodes(int local_size, std::vector<std::string>* calls,
                                       RecordingCommunicator** intra,
                                       RecordingCommunicator** inter) {
  auto node = std::make_unique<RecordingCommunicator>(0, local_size, calls);
  auto across = std::make_unique<RecordingCommunicator>(0, 2, calls);
  *intra = node->Named("intra");
  *inter = across->Named("inter");
  HierarchyPlan plan = PlanHierarchy({local_size});
  std::vector<std::unique_ptr<Communicator>> inters;
  inters.push_back(std::move(across));
  return NewHierarchicalCommunicator(0, 2 * local_size, plan, local_size, std::move(node),
                                     {plan.groups.at(0)}, std::move(inters));
}

WorldInfo World(uint64_t generation, std::vector<std::pair<std::string, uint64_t>> node) {
  WorldInfo w;
  w.generation = generation;
  for (size_t l = 0; l < node.size(); ++l) {
    PeerInfo p;
    p.member_id = node[l].first;
    p.incarnation = node[l].second;
    p.local_rank = static_cast<int>(l);
    p.local_world_size = static_cast<int>(node.size());
    w.node_peers.push_back(p);
  }
  w.self = w.node_peers.at(0);
  return w;
}

TEST(HierarchicalHandOnTest, AFailureAcrossNodesLeavesANodeOfOneRankWholeToKeep) {
  std::vector<std::string> calls;
  RecordingCommunicator *intra, *inter;
  std::unique_ptr<Communicator> hier = TwoNodes(1, &calls, &intra, &inter);
  inter->answer = absl::UnavailableError("peer gone");
  float x[4] = {};
  EXPECT_EQ(hier->AllReduce(x, 4, DataType::kFloat32, ReduceOp::kSum, absl::InfiniteFuture())
                .code(),
            absl::StatusCode::kUnavailable);
  hier->Abort(absl::AbortedError("member b/0 failed"));  // the coordinator's notice
  EXPECT_EQ(std::count(calls.begin(), calls.end(), "intra.Abort"), 0);
  EXPECT_EQ(std::count(calls.begin(), calls.end(), "inter.Abort"), 2);
  // Broken: it answers ABORTED without asking its parts.
  calls.clear();
  EXPECT_EQ(hier->Barrier(absl::InfiniteFuture()).code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(calls.empty());
  bool touched = true;
  std::unique_ptr<Communicator> node = hier->ReleaseNodeCommunicator(&touched);
  EXPECT_EQ(node.get(), intra);
  EXPECT_FALSE(touched);
  EXPECT_EQ(hier->ReleaseNodeCommunicator(&touched), nullptr);  // handed on once
}

TEST(HierarchicalHandOnTest, AFailureAcrossNodesAbortsANodeWithPeersAndNothingIsKept) {
  std::vector<std::string> calls;
  RecordingCommunicator *intra, *inter;
  std::unique_ptr<Communicator> hier = TwoNodes(2, &calls, &intra, &inter);
  inter->answer = absl::UnavailableError("peer gone");
  float x[4] = {};
  EXPECT_FALSE(
      hier->AllReduce(x, 4, DataType::kFloat32, ReduceOp::kSum, absl::InfiniteFuture()).ok());
  // Its node's peers wait for this rank's shard: they are woken.
  EXPECT_EQ(std::count(calls.begin(), calls.end(), "intra.Abort"), 1);
  bool touched = false;
  EXPECT_EQ(hier->ReleaseNodeCommunicator(&touched), nullptr);
  EXPECT_TRUE(touched);
}

TEST(HierarchicalHandOnTest, ANodeCommunicatorThatCanShrinkIsHandedOnTouched) {
  std::vector<std::string> calls;
  RecordingCommunicator *intra, *inter;
  std::unique_ptr<Communicator> hier = TwoNodes(2, &calls, &intra, &inter);
  intra->can_shrink = true;
  hier->Abort(absl::AbortedError("member a/1 failed"));
  bool touched = false;
  std::unique_ptr<Communicator> node = hier->ReleaseNodeCommunicator(&touched);
  EXPECT_EQ(node.get(), intra);
  EXPECT_TRUE(touched) << "it may shrink, never be kept as it is";
}

TEST(HierarchicalHandOnTest, ANodeCommunicatorThatFailedIsNotKept) {
  std::vector<std::string> calls;
  RecordingCommunicator *intra, *inter;
  std::unique_ptr<Communicator> hier = TwoNodes(1, &calls, &intra, &inter);
  intra->answer = absl::InternalError("device error");
  float x[4] = {};
  EXPECT_FALSE(
      hier->AllReduce(x, 4, DataType::kFloat32, ReduceOp::kSum, absl::InfiniteFuture()).ok());
  bool touched = false;
  EXPECT_EQ(hier->ReleaseNodeCommunicator(&touched), nullptr);
  EXPECT_TRUE(touched);
}

TEST(HierarchicalHandOnTest, AnUntouchedNodeWithPeersIsHandedOnAtABoundary) {
  std::vector<std::string> calls;
  RecordingCommunicator *intra, *inter;
  std::unique_ptr<Communicator> hier = TwoNodes(2, &calls, &intra, &inter);
  float x[4] = {};
  ASSERT_TRUE(
      hier->AllReduce(x, 4, DataType::kFloat32, ReduceOp::kSum, absl::InfiniteFuture()).ok());
  EXPECT_EQ(calls, (std::vector<std::string>{"intra.ReduceScatter", "inter.AllReduce",
                                             "intra.AllGather"}));
  calls.clear();
  bool touched = true;
  std::unique_ptr<Communicator> node = hier->ReleaseNodeCommunicator(&touched);
  EXPECT_EQ(node.get(), intra);
  EXPECT_FALSE(touched);
  EXPECT_EQ(calls, std::vector<std::string>{"inter.Abort"}) << "what goes on is not aborted";
  EXPECT_EQ(hier->Barrier(absl::InfiniteFuture()).code(), absl::StatusCode::kAborted);
}

// What a rank of node a (local rank `local` of the world before, which had
// a/0, a/1, a/2 at generation 3) would do in `next`.
NodeCommChoice Choice(int local, bool touched, bool can_shrink, const WorldInfo& next,
                      std::vector<std::string>* calls) {
  auto comm = std::make_unique<RecordingCommunicator>(local, 3, calls);
  comm->can_shrink = can_shrink;
  KeptNodeCommunicator kept{3, {"a/0#11", "a/1#12", "a/2#13"}, touched, std::move(comm)};
  return ChooseNodeComm(kept, next);
}

// `world` seen from its local rank `local`.
WorldInfo As(WorldInfo world, int local) {
  world.self = world.node_peers.at(local);
  return world;
}

TEST(NodeCommTest, TheSameMembersInTheSameOrderInALaterWorldKeepWhatNothingTouched) {
  std::vector<std::string> calls;
  EXPECT_EQ(NodeMembers(World(3, {{"a/0", 11}, {"a/1", 12}})),
            (std::vector<std::string>{"a/0#11", "a/1#12"}));
  const WorldInfo same = World(4, {{"a/0", 11}, {"a/1", 12}, {"a/2", 13}});
  NodeCommChoice keep = Choice(1, false, false, As(same, 1), &calls);
  EXPECT_EQ(keep.plan, NodeCommPlan::kKeep);
  EXPECT_EQ(keep.vote, Choice(0, false, false, As(same, 0), &calls).vote)
      << "the ranks of a node vote alike";
  EXPECT_EQ(Choice(1, false, false, As(World(9, {{"a/0", 11}, {"a/1", 12}, {"a/2", 13}}), 1),
                   &calls)
                .plan,
            NodeCommPlan::kKeep);
  // Touched: nobody left, so there is nothing to shrink it for.
  EXPECT_EQ(Choice(1, true, true, As(same, 1), &calls).plan, NodeCommPlan::kBuild);
  // Not a later world.
  EXPECT_EQ(Choice(1, false, false, As(World(3, {{"a/0", 11}, {"a/1", 12}, {"a/2", 13}}), 1),
                   &calls)
                .plan,
            NodeCommPlan::kBuild);
  EXPECT_EQ(ChooseNodeComm(KeptNodeCommunicator{}, same).plan, NodeCommPlan::kBuild);
}

TEST(NodeCommTest, ANodeThatOnlyLostMembersShrinksWhereItCanAndBuildsOtherwise) {
  std::vector<std::string> calls;
  const WorldInfo less = World(4, {{"a/0", 11}, {"a/2", 13}});
  NodeCommChoice shrink = Choice(2, true, true, As(less, 1), &calls);
  EXPECT_EQ(shrink.plan, NodeCommPlan::kShrink);
  EXPECT_EQ(shrink.excluded, std::vector<int>{1});
  EXPECT_EQ(shrink.vote, Choice(0, false, true, As(less, 0), &calls).vote);
  EXPECT_NE(shrink.vote, kAbstain);
  NodeCommChoice alone = Choice(0, true, true, World(4, {{"a/0", 11}}), &calls);
  EXPECT_EQ(alone.plan, NodeCommPlan::kShrink);
  EXPECT_EQ(alone.excluded, (std::vector<int>{1, 2}));
  // Shared memory cannot shrink.
  NodeCommChoice shm = Choice(2, true, false, As(less, 1), &calls);
  EXPECT_EQ(shm.plan, NodeCommPlan::kBuild);
  EXPECT_EQ(shm.vote, kAbstain);
  // A join, a restart (new incarnation), another order: build.
  for (const WorldInfo& next :
       {World(4, {{"a/0", 11}, {"a/2", 13}, {"a/3", 5}}), World(4, {{"a/0", 11}, {"a/2", 14}}),
        World(4, {{"a/2", 13}, {"a/0", 11}})}) {
    EXPECT_EQ(Choice(0, true, true, next, &calls).plan, NodeCommPlan::kBuild);
  }
  // A rank that is not where the shrunk communicator would put it.
  EXPECT_EQ(Choice(2, true, true, As(less, 0), &calls).plan, NodeCommPlan::kBuild);
}

TEST(NodeCommTest, KeepNodeCommunicatorTakesOnlyWhatTheWorldHandsOn) {
  std::vector<std::string> calls;
  RecordingCommunicator *intra, *inter;
  const WorldInfo w = World(5, {{"b/0", 7}});
  KeptNodeCommunicator kept = KeepNodeCommunicator(TwoNodes(1, &calls, &intra, &inter), w);
  EXPECT_EQ(kept.comm.get(), intra);
  EXPECT_EQ(kept.generation, 5u);
  EXPECT_EQ(kept.members, std::vector<std::string>{"b/0#7"});
  EXPECT_FALSE(kept.touched);
  // A flat communicator has no node-local part to hand on.
  KeptNodeCommunicator none =
      KeepNodeCommunicator(std::make_unique<RecordingCommunicator>(0, 1, &calls), w);
  EXPECT_EQ(none.comm, nullptr);
  EXPECT_EQ(KeepNodeCommunicator(nullptr, w).comm, nullptr);
}

}  // namespace
}  // namespace muster
