// PartitionHolds (coordinator/partition_holds.h): whom a lost link leaves
// out, and for how long; time is plain absl::Time values.
#include "coordinator/partition_holds.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/time/time.h"

namespace muster {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1'000'000);

// A world of generation 1 with `per_node[i]` members on node "n<i>", ranks
// in node order.
World WorldOf(const std::vector<int>& per_node, uint64_t generation = 1) {
  World w;
  w.generation = generation;
  uint32_t rank = 0;
  for (size_t n = 0; n < per_node.size(); ++n) {
    for (int i = 0; i < per_node[n]; ++i) {
      Assignment a;
      a.member = {"n" + std::to_string(n) + "/" + std::to_string(i), 1};
      a.node = "n" + std::to_string(n);
      a.rank = rank++;
      w.members.push_back(a);
    }
  }
  w.node_count = static_cast<uint32_t>(per_node.size());
  return w;
}

// Two nodes that lost the link between them: the one with the higher first
// rank leaves, whichever side reports.
TEST(PartitionHoldsTest, OfTwoEqualNodesTheNewerLeavesWhoeverReports) {
  const World w = WorldOf({2, 2});
  PartitionHolds from0, from3;
  EXPECT_EQ(from0.LeaveOut(w, 0, {2}), std::vector<std::string>{"n1"});
  EXPECT_EQ(from3.LeaveOut(w, 3, {1}), std::vector<std::string>{"n1"});
}

TEST(PartitionHoldsTest, TheNodeWithFewerMembersLeaves) {
  const World w = WorldOf({1, 3});
  PartitionHolds holds;
  EXPECT_EQ(holds.LeaveOut(w, 1, {0}), std::vector<std::string>{"n0"});
}

// A node cut from all its peers leaves, not the peers that cannot reach it,
// once reports from both sides are in.
TEST(PartitionHoldsTest, ANodeCutFromEveryPeerLeavesAlone) {
  const World w = WorldOf({1, 1, 1, 1});
  PartitionHolds holds;
  EXPECT_EQ(holds.LeaveOut(w, 2, {0, 1, 3}), std::vector<std::string>{"n2"});
  PartitionHolds peer_first;
  // n0 reports n2 first: a tie of one pair each, n2 has the higher rank.
  EXPECT_EQ(peer_first.LeaveOut(w, 0, {2}), std::vector<std::string>{"n2"});
  // Reports about the same world add up.
  EXPECT_EQ(peer_first.LeaveOut(w, 1, {2}), std::vector<std::string>{"n2"});
}

TEST(PartitionHoldsTest, RanksOfTheReportersOwnNodeAndUnknownRanksAreIgnored) {
  const World w = WorldOf({2, 2});
  PartitionHolds holds;
  EXPECT_TRUE(holds.LeaveOut(w, 0, {1}).empty());
  EXPECT_TRUE(holds.LeaveOut(w, 0, {7}).empty());
  EXPECT_TRUE(holds.LeaveOut(w, 9, {2}).empty());
}

// Two separate lost links: one node of each pair leaves.
TEST(PartitionHoldsTest, EachLostLinkLeavesOneOfItsNodesOut) {
  const World w = WorldOf({1, 1, 1, 1});
  PartitionHolds holds;
  holds.LeaveOut(w, 0, {1});
  EXPECT_EQ(holds.LeaveOut(w, 2, {3}), (std::vector<std::string>{"n3", "n1"}));
}

// Pairs reported about an older world are forgotten.
TEST(PartitionHoldsTest, ANewWorldStartsWithoutTheOldPairs) {
  PartitionHolds holds;
  holds.LeaveOut(WorldOf({1, 1, 1}, 1), 0, {1});
  EXPECT_EQ(holds.LeaveOut(WorldOf({1, 1, 1}, 2), 0, {2}), std::vector<std::string>{"n2"});
}

TEST(PartitionHoldsTest, AHoldDoublesEachTimeUpToTheMaximumAndIsForgottenLater) {
  PartitionHoldOptions o;
  o.first_hold = absl::Seconds(10);
  o.max_hold = absl::Seconds(35);
  o.forget_after = absl::Minutes(10);
  PartitionHolds holds(o);
  EXPECT_TRUE(holds.empty());
  EXPECT_FALSE(holds.NextEnd().has_value());
  EXPECT_EQ(holds.Hold("n1", kT0), absl::Seconds(10));
  EXPECT_TRUE(holds.Held("n1", kT0 + absl::Seconds(9)));
  EXPECT_FALSE(holds.Held("n0", kT0));
  EXPECT_EQ(*holds.NextEnd(), kT0 + absl::Seconds(10));
  EXPECT_TRUE(holds.Ended(kT0 + absl::Seconds(9)).empty());
  EXPECT_EQ(holds.Ended(kT0 + absl::Seconds(10)), std::vector<std::string>{"n1"});
  EXPECT_FALSE(holds.Held("n1", kT0 + absl::Seconds(10)));
  EXPECT_TRUE(holds.empty());
  EXPECT_EQ(holds.Hold("n1", kT0 + absl::Seconds(12)), absl::Seconds(20));
  EXPECT_EQ(holds.Hold("n1", kT0 + absl::Seconds(40)), absl::Seconds(35));
  EXPECT_EQ(holds.Hold("n1", kT0 + absl::Seconds(80)), absl::Seconds(35));
  // Ten minutes without a hold: the next one is short again.
  EXPECT_EQ(holds.Hold("n1", kT0 + absl::Seconds(80) + absl::Minutes(11)), absl::Seconds(10));
}

}  // namespace
}  // namespace muster
