#include "coordinator/rendezvous.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

namespace muster {
namespace {

Candidate C(const std::string& id, const std::string& node, uint32_t local, bool incumbent = false,
            int64_t step = 0, int joined_s = 0) {
  Candidate c;
  c.member = {id, 1};
  c.node = node;
  c.local_rank = local;
  c.incumbent = incumbent;
  c.step = step;
  c.joined = absl::FromUnixSeconds(joined_s);
  return c;
}

TEST(RendezvousRulesTest, Validate) {
  RendezvousRules r;
  EXPECT_TRUE(r.Validate().ok());
  r.min_members = 0;
  EXPECT_FALSE(r.Validate().ok());
  r.min_members = 4;
  r.max_members = 3;
  EXPECT_NE(r.Validate().message().find("max_members"), std::string::npos);
  r.max_members = 5;
  r.world_size_multiple = 8;
  EXPECT_FALSE(r.Validate().ok());
}

TEST(RendezvousRulesTest, UsableWorldSize) {
  RendezvousRules r;
  r.min_members = 2;
  r.max_members = 7;
  r.world_size_multiple = 2;
  EXPECT_EQ(UsableWorldSize(1, r), 0u);
  EXPECT_EQ(UsableWorldSize(3, r), 2u);
  EXPECT_EQ(UsableWorldSize(6, r), 6u);
  EXPECT_EQ(UsableWorldSize(100, r), 6u);
}

TEST(AssignWorldTest, GroupsByNodeWithContiguousRanks) {
  World w = AssignWorld(3, {C("b1", "nodeB", 1), C("a0", "nodeA", 0), C("b0", "nodeB", 0),
                            C("c0", "nodeC", 0), C("a1", "nodeA", 1)},
                        5);
  ASSERT_EQ(w.size(), 5u);
  EXPECT_EQ(w.generation, 3u);
  EXPECT_EQ(w.node_count, 3u);
  std::vector<std::string> order;
  for (const Assignment& a : w.members) order.push_back(a.member.id);
  EXPECT_EQ(order, (std::vector<std::string>{"a0", "a1", "b0", "b1", "c0"}));
  EXPECT_EQ(w.members[3].node_rank, 1u);
  EXPECT_EQ(w.members[3].local_rank, 1u);
  EXPECT_EQ(w.members[3].local_world_size, 2u);
  EXPECT_EQ(w.members[4].node_rank, 2u);
  EXPECT_EQ(w.members[4].local_world_size, 1u);
  for (uint32_t i = 0; i < w.size(); ++i) EXPECT_EQ(w.members[i].rank, i);
}

// AssignWorld's rules written as plainly as they read: the candidates
// themselves sorted (who is kept, then where), node sizes counted in a map.
World PlainAssign(uint64_t generation, std::vector<Candidate> candidates, uint32_t size) {
  std::stable_sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    if (a.incumbent != b.incumbent) return a.incumbent;
    return std::tie(a.spare, a.joined, a.member.id) < std::tie(b.spare, b.joined, b.member.id);
  });
  if (candidates.size() > size) candidates.resize(size);
  std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    return std::tie(a.node, a.local_rank, a.member.id) <
           std::tie(b.node, b.local_rank, b.member.id);
  });
  std::map<std::string, uint32_t> per_node;
  for (const Candidate& c : candidates) ++per_node[c.node];
  World world;
  world.generation = generation;
  world.node_count = static_cast<uint32_t>(per_node.size());
  uint32_t node_rank = 0, local_rank = 0;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const Candidate& c = candidates[i];
    if (i > 0 && c.node != candidates[i - 1].node) {
      ++node_rank;
      local_rank = 0;
    }
    Assignment a;
    a.member = c.member;
    a.node = c.node;
    a.state_address = c.state_address;
    a.rank = static_cast<uint32_t>(i);
    a.node_rank = node_rank;
    a.local_rank = local_rank++;
    a.local_world_size = per_node[c.node];
    a.step = c.step;
    world.members.push_back(std::move(a));
  }
  world.Index();
  ChooseStateSource(&world);
  return world;
}

TEST(AssignWorldTest, AgreesWithThePlainRulesOnRandomCandidates) {
  std::mt19937 rng(11);
  for (int round = 0; round < 300; ++round) {
    const int n = 1 + static_cast<int>(rng() % 60);
    const int nodes = 1 + static_cast<int>(rng() % 9);
    std::vector<Candidate> candidates;
    for (int i = 0; i < n; ++i) {
      Candidate c = C("m" + std::to_string(rng() % 1000) + "_" + std::to_string(i),
                      "node" + std::to_string(rng() % nodes), static_cast<uint32_t>(rng() % 4),
                      rng() % 2 == 0, static_cast<int64_t>(rng() % 5),
                      static_cast<int>(rng() % 3));
      c.spare = rng() % 4 == 0;
      c.state_address = "h" + std::to_string(i);
      candidates.push_back(c);
    }
    const uint32_t size = 1 + static_cast<uint32_t>(rng() % (n + 3));
    const World got = AssignWorld(5, candidates, size);
    const World want = PlainAssign(5, candidates, size);
    ASSERT_EQ(got.size(), want.size()) << "round " << round;
    EXPECT_EQ(got.node_count, want.node_count) << "round " << round;
    EXPECT_EQ(got.state_source_rank, want.state_source_rank) << "round " << round;
    EXPECT_EQ(got.state_step, want.state_step) << "round " << round;
    for (uint32_t r = 0; r < got.size(); ++r) {
      const Assignment& a = got.members[r];
      const Assignment& b = want.members[r];
      ASSERT_TRUE(a.member == b.member && a.node == b.node && a.state_address == b.state_address &&
                  a.rank == b.rank && a.node_rank == b.node_rank &&
                  a.local_rank == b.local_rank && a.local_world_size == b.local_world_size &&
                  a.step == b.step)
          << "round " << round << ", rank " << r << ": " << a.member.id << " vs " << b.member.id;
    }
  }
}

TEST(AssignWorldTest, KeepsIncumbentsThenEarliestJoinersWhenCapped) {
  World w = AssignWorld(2, {C("new1", "n", 2, false, 0, 5), C("new0", "n", 3, false, 0, 1),
                            C("old", "n", 9, true)},
                        2);
  ASSERT_EQ(w.size(), 2u);
  EXPECT_GE(w.RankOf("old"), 0);
  EXPECT_GE(w.RankOf("new0"), 0);
  EXPECT_EQ(w.RankOf("new1"), -1);
}

TEST(AssignWorldTest, TakesSparesOnlyForPlacesNoOtherCandidateFills) {
  std::vector<Candidate> c = {C("spare0", "s", 0, false, 0, 1), C("a", "n", 0, false, 0, 2),
                              C("spare1", "s", 1, false, 0, 3), C("b", "n", 1, false, 0, 4)};
  c[0].spare = c[2].spare = true;
  World w = AssignWorld(1, c, 2);
  EXPECT_GE(w.RankOf("a"), 0);
  EXPECT_GE(w.RankOf("b"), 0);
  c[3].incumbent = false;
  c.pop_back();  // b is gone: the earliest spare takes its place
  w = AssignWorld(2, c, 2);
  EXPECT_GE(w.RankOf("a"), 0);
  EXPECT_GE(w.RankOf("spare0"), 0);
  c[0].incumbent = true;  // an incumbent spare keeps its place
  c.push_back(C("b", "n", 1, false, 0, 9));
  w = AssignWorld(3, c, 2);
  EXPECT_GE(w.RankOf("spare0"), 0);
  EXPECT_GE(w.RankOf("a"), 0);
  EXPECT_EQ(w.RankOf("b"), -1);
}

TEST(AssignWorldTest, SummarisesNodeSizesAndDigestsTheMembership) {
  World w = AssignWorld(1, {C("a0", "A", 0), C("a1", "A", 1), C("a2", "A", 2), C("b0", "B", 0),
                            C("c0", "C", 0), C("c1", "C", 1)},
                        6);
  EXPECT_EQ(w.node_sizes(), (std::vector<uint32_t>{1, 2, 3}));
  // The same members give the same digest, whatever order they came in;
  // another incarnation, node or rank changes it.
  World same = AssignWorld(1, {C("c1", "C", 1), C("b0", "B", 0), C("a2", "A", 2), C("a0", "A", 0),
                               C("c0", "C", 0), C("a1", "A", 1)},
                           6);
  EXPECT_EQ(same.digest(), w.digest());
  Candidate other = C("c1", "C", 1);
  other.member.incarnation = 2;
  World changed = AssignWorld(1, {C("a0", "A", 0), C("a1", "A", 1), C("a2", "A", 2),
                                  C("b0", "B", 0), C("c0", "C", 0), other},
                              6);
  EXPECT_NE(changed.digest(), w.digest());
  World moved = AssignWorld(1, {C("a0", "A", 0), C("a1", "A", 1), C("a2", "A", 2),
                                C("b0", "B", 0), C("c0", "C", 0), C("c1", "D", 0)},
                            6);
  EXPECT_NE(moved.digest(), w.digest());
  EXPECT_EQ(moved.node_sizes(), (std::vector<uint32_t>{1, 3}));
}

TEST(AssignWorldTest, StateSourceIsHighestStepLowestRank) {
  World w = AssignWorld(1, {C("a", "n", 0, false, 10), C("b", "n", 1, false, 12),
                            C("c", "n", 2, false, 12)},
                        3);
  EXPECT_EQ(w.state_source_rank, 1u);
  EXPECT_EQ(w.state_step, 12);
}

// 2..4 members, one second of last call.
RendezvousRules TimerRules() {
  RendezvousRules r;
  r.min_members = 2;
  r.max_members = 4;
  r.last_call = absl::Seconds(1);
  return r;
}

TEST(RendezvousTimerTest, LastCallThenForm) {
  RendezvousTimer t(TimerRules());
  const absl::Time t0 = absl::FromUnixSeconds(100);
  EXPECT_EQ(t.Decide(1, 1, true, false, t0), FormDecision::kNotEnough);
  EXPECT_EQ(t.Decide(2, 2, true, false, t0), FormDecision::kWait);
  EXPECT_EQ(*t.deadline(), t0 + absl::Seconds(1));
  EXPECT_EQ(t.Decide(3, 3, true, false, t0 + absl::Milliseconds(500)), FormDecision::kWait);
  EXPECT_EQ(t.Decide(3, 3, true, false, t0 + absl::Seconds(1)), FormDecision::kNow);
  t.Reset();
  EXPECT_EQ(t.Decide(4, 4, true, false, t0), FormDecision::kNow);  // max reached
  EXPECT_EQ(t.Decide(2, 2, true, true, t0), FormDecision::kNow);   // urgent
  EXPECT_EQ(t.Decide(2, 2, false, true, t0), FormDecision::kNothing);
}

// Spares fill a world only when last call ends: four candidates of which two
// are spares wait for more preferred members; urgency (a failure) forms at
// once.
TEST(RendezvousTimerTest, SparesDoNotCutLastCallShort) {
  RendezvousTimer t(TimerRules());
  const absl::Time t0 = absl::FromUnixSeconds(100);
  EXPECT_EQ(t.Decide(4, 2, true, false, t0), FormDecision::kWait);
  EXPECT_EQ(t.Decide(5, 3, true, false, t0 + absl::Milliseconds(500)), FormDecision::kWait);
  EXPECT_EQ(t.Decide(5, 4, true, false, t0 + absl::Milliseconds(600)), FormDecision::kNow);
  t.Reset();
  EXPECT_EQ(t.Decide(4, 2, true, false, t0), FormDecision::kWait);
  EXPECT_EQ(t.Decide(4, 2, true, false, t0 + absl::Seconds(1)), FormDecision::kNow);
  t.Reset();
  EXPECT_EQ(t.Decide(4, 1, true, true, t0), FormDecision::kNow);
}

// The job's first world waits spare_delay for the members meant for it
// before spares fill it: trainers meant for the world may start later than
// the spares (found by SlurmSpareNodeReplacesAKilledTrainer under load: a
// spare node's trainer took a rank, 0.6 s before a node's own trainer
// joined).
TEST(RendezvousTimerTest, SparesFillTheFirstWorldOnlyAfterTheSpareDelay) {
  RendezvousRules rules = TimerRules();
  rules.spare_delay = absl::Seconds(10);
  RendezvousTimer t(rules);
  const absl::Time t0 = absl::FromUnixSeconds(100);
  // Two candidates, one a spare: the world could form, but only with it.
  EXPECT_EQ(t.Decide(2, 1, true, false, t0, /*first_world=*/true), FormDecision::kWait);
  EXPECT_EQ(*t.deadline(), t0 + absl::Seconds(10));
  EXPECT_EQ(t.Decide(2, 1, true, false, t0 + absl::Seconds(1), true), FormDecision::kWait);
  // The trainers meant for it arrive: the world forms without the spare.
  EXPECT_EQ(t.Decide(3, 2, true, false, t0 + absl::Seconds(3), true), FormDecision::kWait);
  EXPECT_EQ(*t.deadline(), t0 + absl::Seconds(10)) << "a third preferred could still come";
  EXPECT_EQ(t.Decide(5, 4, true, false, t0 + absl::Seconds(4), true), FormDecision::kNow);
  // Nobody else comes: the spare fills the place when the delay ends.
  t.Reset();
  EXPECT_EQ(t.Decide(2, 1, true, false, t0, true), FormDecision::kWait);
  EXPECT_EQ(t.Decide(2, 1, true, false, t0 + absl::Seconds(10), true), FormDecision::kNow);
  // Enough non-spares for every place: last call only.
  t.Reset();
  EXPECT_EQ(t.Decide(3, 2, true, false, t0, true), FormDecision::kWait);
  EXPECT_EQ(t.Decide(2, 2, true, false, t0 + absl::Seconds(1), true), FormDecision::kNow);
  // A later world takes spares after last call; a failure's at once.
  t.Reset();
  EXPECT_EQ(t.Decide(2, 1, true, false, t0, /*first_world=*/false), FormDecision::kWait);
  EXPECT_EQ(t.Decide(2, 1, true, false, t0 + absl::Seconds(1), false), FormDecision::kNow);
  t.Reset();
  EXPECT_EQ(t.Decide(2, 1, true, true, t0, true), FormDecision::kNow);
}

}  // namespace
}  // namespace muster
