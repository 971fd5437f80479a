// A regroup told as a delta: what each member derives from the world it
// holds (trainer/client/world_delta.h) is what the coordinator would have
// answered it in full (coordinator/proto_convert.h), for members removed
// below, above and around it, whole nodes gone, joiners appended on nodes
// of their own, and the same world again; and the changes that are not a
// delta are answered in full.
#include "trainer/client/world_delta.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/proto_convert.h"
#include "coordinator/rendezvous.h"
#include "tests/unit/world_of_members.h"
#include "coordinator/world_delta.h"

namespace muster {
namespace {

using Spec = MemberSpec;

// MakeWorld, every member with a state address of its own and at step 7.
World WorldOf(uint64_t generation, std::vector<Spec> specs) {
  for (Spec& s : specs) {
    s.state_address = absl::StrCat(s.id, ":9000");
    s.step = 7;
  }
  return MakeWorld(generation, specs);
}

// Nodes a (3), b (2), c (4), d (1): ranks 0-2, 3-4, 5-8, 9.
std::vector<Spec> Base() {
  std::vector<Spec> s;
  const std::vector<std::pair<std::string, int>> nodes = {{"a", 3}, {"b", 2}, {"c", 4}, {"d", 1}};
  for (const auto& [node, n] : nodes) {
    for (int l = 0; l < n; ++l) s.push_back({absl::StrCat(node, l), node, uint32_t(l)});
  }
  return s;
}

std::vector<Spec> Without(std::vector<Spec> s, const std::set<std::string>& gone) {
  s.erase(std::remove_if(s.begin(), s.end(), [&](const Spec& x) { return gone.count(x.id); }),
          s.end());
  return s;
}

WorldInfo FullAnswer(const World& world, const std::string& id) {
  v1::RendezvousResponse resp;
  ToProto(world, static_cast<uint32_t>(world.RankOf(id)), &resp);
  return FromProto(resp);
}

v1::RendezvousResponse DeltaAnswer(const World& next, const WorldDelta& d) {
  RendezvousResult r{std::make_shared<const World>(next), 0,
                     std::make_shared<const WorldDelta>(d)};
  v1::RendezvousResponse resp;
  ToProto(r, &resp);
  return resp;
}

void ExpectSameView(const WorldInfo& got, const WorldInfo& want, const std::string& who) {
  SCOPED_TRACE(who);
  EXPECT_EQ(got.generation, want.generation);
  EXPECT_EQ(got.rank, want.rank);
  EXPECT_EQ(got.world_size, want.world_size);
  EXPECT_EQ(got.node_count, want.node_count);
  EXPECT_EQ(got.state_source_rank, want.state_source_rank);
  EXPECT_EQ(got.state_step, want.state_step);
  EXPECT_EQ(got.state_source.member_id, want.state_source.member_id);
  EXPECT_EQ(got.node_sizes, want.node_sizes);
  EXPECT_EQ(got.digest, want.digest);
  const auto same_peer = [](const PeerInfo& a, const PeerInfo& b) {
    return a.member_id == b.member_id && a.incarnation == b.incarnation && a.node == b.node &&
           a.state_address == b.state_address && a.rank == b.rank &&
           a.node_rank == b.node_rank && a.local_rank == b.local_rank &&
           a.local_world_size == b.local_world_size;
  };
  EXPECT_TRUE(same_peer(got.self, want.self)) << got.self.rank << " vs " << want.self.rank;
  EXPECT_EQ(got.self.step, want.self.step);
  ASSERT_EQ(got.node_peers.size(), want.node_peers.size());
  for (size_t i = 0; i < got.node_peers.size(); ++i) {
    EXPECT_TRUE(same_peer(got.node_peers[i], want.node_peers[i])) << "node peer " << i;
  }
}

// Every member of `next` that was in `base` derives from the delta the
// view the full answer gives it.
void ExpectEveryMemberDerivesItsPlace(const World& base, const World& next) {
  std::optional<WorldDelta> d = MakeWorldDelta(base, next);
  ASSERT_TRUE(d.has_value());
  const v1::RendezvousResponse resp = DeltaAnswer(next, *d);
  ASSERT_TRUE(resp.has_delta());
  EXPECT_EQ(resp.node_members_size(), 0);  // the same answer for every member
  for (const Assignment& a : next.members) {
    if (base.RankOf(a.member.id) < 0) continue;
    const WorldInfo held = FullAnswer(base, a.member.id);
    absl::StatusOr<WorldInfo> got = ApplyWorldDelta(held, resp.world(), resp.delta(), a.step);
    ASSERT_TRUE(got.ok()) << a.member.id << ": " << got.status();
    ExpectSameView(*got, FullAnswer(next, a.member.id), a.member.id);
  }
}

TEST(WorldDeltaTest, RemovedMembersBelowAboveAndAroundAMember) {
  const World base = WorldOf(1, Base());
  for (const std::set<std::string>& gone : std::vector<std::set<std::string>>{
           {"a0"},              // the first rank
           {"d0"},              // the last rank, and its whole node
           {"c1"},              // inside a node: c2, c3 move down in it
           {"a1", "c3"},        // around b's members
           {"b0", "b1"},        // a whole node in the middle
           {"a0", "b1", "c0", "c3"},
           {"a0", "a1", "a2", "b0", "b1", "c0", "c1", "c2", "c3"},  // all but one
       }) {
    SCOPED_TRACE(absl::StrCat("removed ", gone.size(), " starting ", *gone.begin()));
    const World next = WorldOf(2, Without(Base(), gone));
    ExpectEveryMemberDerivesItsPlace(base, next);
    std::optional<WorldDelta> d = MakeWorldDelta(base, next);
    ASSERT_TRUE(d.has_value());
    EXPECT_EQ(d->removed_ranks.size(), gone.size());
    EXPECT_EQ(d->first_appended, next.size());
  }
}

TEST(WorldDeltaTest, WholeNodesGoneShiftTheNodeRanksAfterThem) {
  const World base = WorldOf(1, Base());
  const World next = WorldOf(2, Without(Base(), {"a0", "a1", "a2", "c0", "c1", "c2", "c3"}));
  std::optional<WorldDelta> d = MakeWorldDelta(base, next);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->removed_nodes, (std::vector<uint32_t>{0, 2}));
  ExpectEveryMemberDerivesItsPlace(base, next);
  EXPECT_EQ(FullAnswer(next, "d0").self.node_rank, 1);
}

TEST(WorldDeltaTest, TheSameWorldAgainIsAnEmptyDelta) {
  const World base = WorldOf(1, Base());
  const World next = WorldOf(2, Base());
  std::optional<WorldDelta> d = MakeWorldDelta(base, next);
  ASSERT_TRUE(d.has_value());
  EXPECT_TRUE(d->removed_ranks.empty());
  EXPECT_TRUE(d->removed_nodes.empty());
  ExpectEveryMemberDerivesItsPlace(base, next);
}

TEST(WorldDeltaTest, JoinersOnNodesOfTheirOwnAreAppended) {
  const World base = WorldOf(1, Base());
  std::vector<Spec> specs = Without(Base(), {"b1"});
  specs.push_back({"e0", "e", 0});  // a spare's node, after every other
  specs.push_back({"e1", "e", 1});
  const World next = WorldOf(2, specs);
  std::optional<WorldDelta> d = MakeWorldDelta(base, next);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->first_appended, next.size() - 2);
  ExpectEveryMemberDerivesItsPlace(base, next);
  const v1::RendezvousResponse resp = DeltaAnswer(next, *d);
  EXPECT_EQ(resp.delta().appended_count(), 2u);
  EXPECT_EQ(resp.world().world_size(), next.size());
}

TEST(WorldDeltaTest, ChangesThatAreNotADeltaAreAnsweredInFull) {
  const World base = WorldOf(1, Base());
  // A spare (or restart) placed on a node that keeps members: it takes a
  // place among them, not after everyone.
  std::vector<Spec> on_b = Without(Base(), {"b1"});
  on_b.push_back({"b9", "b", 9});
  EXPECT_FALSE(MakeWorldDelta(base, WorldOf(2, on_b)).has_value());
  // A node whose name sorts between others: inserted, not appended.
  std::vector<Spec> between = Base();
  between.push_back({"bb0", "bb", 0});
  EXPECT_FALSE(MakeWorldDelta(base, WorldOf(2, between)).has_value());
  // A restarted member (a new incarnation of the same id) is not the one
  // its peers held.
  std::vector<Spec> restarted = Base();
  restarted[4].incarnation = 2;
  EXPECT_FALSE(MakeWorldDelta(base, WorldOf(2, restarted)).has_value());
  // No base: the first world.
  EXPECT_FALSE(MakeWorldDelta(World{}, base).has_value());
  // Not a later generation.
  EXPECT_FALSE(MakeWorldDelta(base, WorldOf(1, Base())).has_value());
}

TEST(WorldDeltaTest, AMemberThatDoesNotHoldTheBaseIsRefused) {
  const World g1 = WorldOf(1, Base());
  const World g2 = WorldOf(2, Without(Base(), {"a0"}));
  const World g3 = WorldOf(3, Without(Base(), {"a0", "c0"}));
  std::optional<WorldDelta> d = MakeWorldDelta(g2, g3);
  ASSERT_TRUE(d.has_value());
  const v1::RendezvousResponse resp = DeltaAnswer(g3, *d);
  // Missed generation 2: holds 1.
  absl::StatusOr<WorldInfo> missed =
      ApplyWorldDelta(FullAnswer(g1, "b0"), resp.world(), resp.delta(), 7);
  EXPECT_TRUE(absl::IsFailedPrecondition(missed.status())) << missed.status();
  // Holds generation 2 by number but another world (digest).
  WorldInfo forged = FullAnswer(g2, "b0");
  forged.digest ^= 1;
  EXPECT_TRUE(absl::IsFailedPrecondition(
      ApplyWorldDelta(forged, resp.world(), resp.delta(), 7).status()));
  // Removed by the delta itself.
  EXPECT_TRUE(absl::IsFailedPrecondition(
      ApplyWorldDelta(FullAnswer(g2, "c0"), resp.world(), resp.delta(), 7).status()));
  // A delta that does not hold together.
  v1::WorldDelta bad = resp.delta();
  bad.add_removed_ranks(0);  // not ascending
  EXPECT_TRUE(absl::IsInvalidArgument(
      ApplyWorldDelta(FullAnswer(g2, "b0"), resp.world(), bad, 7).status()));
}

TEST(WorldDeltaTest, TheWholeWorldGivesEveryMemberItsFullAnswer) {
  const World world = WorldOf(4, Without(Base(), {"c2"}));
  std::vector<v1::Assignment> members(world.size());
  for (uint32_t r = 0; r < world.size(); ++r) ToProto(world.members[r], &members[r]);
  v1::World summary;
  ToProto(world, &summary);
  for (const Assignment& a : world.members) {
    absl::StatusOr<WorldInfo> got =
        WorldFromMembers(summary, members, a.member.id, a.member.incarnation);
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectSameView(*got, FullAnswer(world, a.member.id), a.member.id);
  }
  EXPECT_TRUE(absl::IsNotFound(WorldFromMembers(summary, members, "c2", 1).status()));
  EXPECT_TRUE(absl::IsNotFound(WorldFromMembers(summary, members, "c1", 2).status()));
}

// Random worlds and random removals, with and without appended nodes.
TEST(WorldDeltaTest, RandomRegroupsDeriveTheFullAnswers) {
  std::mt19937 rng(20261126);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<Spec> specs;
    const int nodes = 1 + static_cast<int>(rng() % 6);
    for (int n = 0; n < nodes; ++n) {
      const int k = 1 + static_cast<int>(rng() % 5);
      for (int l = 0; l < k; ++l) {
        specs.push_back({absl::StrCat("n", n, "m", l), absl::StrCat("n", n), uint32_t(l)});
      }
    }
    std::set<std::string> gone;
    for (const Spec& s : specs) {
      if (rng() % 4 == 0) gone.insert(s.id);
    }
    if (gone.size() == specs.size()) gone.erase(gone.begin());
    std::vector<Spec> next_specs = Without(specs, gone);
    if (rng() % 2 == 0) next_specs.push_back({"z0", "z", 0});  // "z" sorts last
    SCOPED_TRACE(absl::StrCat("trial ", trial));
    ExpectEveryMemberDerivesItsPlace(WorldOf(1, specs), WorldOf(2, next_specs));
  }
}

TEST(WorldDeltaTest, BaseRankInvertsTheRenumberingForRandomRemovedSets) {
  std::mt19937 rng(2611);
  for (int trial = 0; trial < 300; ++trial) {
    const uint32_t base_size = 1 + rng() % 60;
    WorldDelta d;
    std::vector<uint32_t> kept;
    for (uint32_t b = 0; b < base_size; ++b) {
      if (rng() % 3 == 0) {
        d.removed_ranks.push_back(b);
      } else {
        kept.push_back(b);
      }
    }
    d.first_appended = static_cast<uint32_t>(kept.size());
    SCOPED_TRACE(absl::StrCat("trial ", trial, ": ", base_size, " ranks, ",
                              d.removed_ranks.size(), " removed"));
    for (uint32_t r = 0; r < kept.size(); ++r) EXPECT_EQ(BaseRank(d, r), kept[r]) << r;
    EXPECT_EQ(BaseRank(d, d.first_appended), std::nullopt);  // appended
  }
}

}  // namespace
}  // namespace muster
