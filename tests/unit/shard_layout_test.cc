// The layout of sharded optimizer state (trainer/ddp/shard_layout.h,
// docs/sharding.md): ranges that split each group evenly, a buddy copy on
// another node, and a reshard plan that takes every range a new rank keeps
// from a survivor that really holds it, or says that none does.
#include "trainer/ddp/shard_layout.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <utility>
#include <vector>

namespace muster {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

ShardLayout Layout(std::vector<int64_t> groups, std::vector<int> nodes, int copies) {
  absl::StatusOr<ShardLayout> layout =
      ShardLayout::Make(std::move(groups), std::move(nodes), copies);
  EXPECT_TRUE(layout.ok()) << layout.status();
  return *std::move(layout);
}

// Ranks on `nodes` nodes of `per_node` ranks each, node-major.
std::vector<int> Nodes(int nodes, int per_node) {
  std::vector<int> out;
  for (int n = 0; n < nodes; ++n) out.insert(out.end(), per_node, n);
  return out;
}

TEST(ShardLayoutTest, ShardsSplitEachGroupInOrderWithinOneElement) {
  for (int w = 1; w <= 7; ++w) {
    for (int64_t n : {0, 1, 5, 6, 7, 100, 1001}) {
      const ShardLayout layout = Layout({n}, std::vector<int>(w, 0), 1);
      int64_t next = 0, smallest = n, largest = 0;
      for (int s = 0; s < w; ++s) {
        const ElementRange r = layout.Range(0, s);
        EXPECT_EQ(r.begin, next) << "w=" << w << " n=" << n << " shard " << s;
        next = r.end;
        smallest = std::min(smallest, r.size());
        largest = std::max(largest, r.size());
      }
      EXPECT_EQ(next, n) << "w=" << w;
      EXPECT_LE(largest - smallest, 1) << "w=" << w << " n=" << n;
    }
  }
}

TEST(ShardLayoutTest, TheBuddyCopyIsOnTheOtherNode) {
  const ShardLayout layout = Layout({100}, Nodes(2, 2), 2);
  ASSERT_EQ(layout.copies(), 2);
  const std::vector<int> node = Nodes(2, 2);
  std::vector<int> kept_count(4, 0);
  for (int s = 0; s < 4; ++s) {
    const std::vector<int> holders = layout.Holders(s);
    ASSERT_EQ(holders.size(), 2u);
    EXPECT_EQ(holders[0], s) << "the owner comes first";
    EXPECT_NE(node[holders[0]], node[holders[1]]) << "shard " << s;
    for (int r : holders) ++kept_count[r];
  }
  EXPECT_THAT(kept_count, ElementsAre(2, 2, 2, 2));
  // KeptBy is Holders seen from the rank.
  for (int r = 0; r < 4; ++r) {
    for (int s : layout.KeptBy(r)) {
      const std::vector<int> holders = layout.Holders(s);
      EXPECT_NE(std::find(holders.begin(), holders.end(), r), holders.end());
    }
    EXPECT_EQ(layout.KeptBy(r)[0], r);
  }
}

TEST(ShardLayoutTest, RanksListedOutOfNodeOrderStillBackUpAcrossNodes) {
  // Ranks 0 and 2 on node 0, 1 and 3 on node 1.
  const ShardLayout layout = Layout({64}, {0, 1, 0, 1}, 2);
  const std::vector<int> node = {0, 1, 0, 1};
  for (int s = 0; s < 4; ++s) {
    const std::vector<int> holders = layout.Holders(s);
    EXPECT_NE(node[holders[0]], node[holders[1]]) << "shard " << s;
  }
}

TEST(ShardLayoutTest, AWorldOfOneKeepsOneCopy) {
  const ShardLayout layout = Layout({10}, {0}, 2);
  EXPECT_EQ(layout.copies(), 1);
  EXPECT_THAT(layout.Holders(0), ElementsAre(0));
  EXPECT_THAT(layout.KeptBy(0), ElementsAre(0));
  EXPECT_EQ(layout.Range(0, 0), (ElementRange{0, 10}));
}

TEST(ShardLayoutTest, BadLayoutsAreRefusedNamingWhatWasWrong) {
  EXPECT_THAT(ShardLayout::Make({10}, {0, 0}, 3).status().message(),
              HasSubstr("copies must be 1 or 2, not 3"));
  EXPECT_THAT(ShardLayout::Make({10}, {}, 1).status().message(), HasSubstr("at least one rank"));
  EXPECT_THAT(ShardLayout::Make({10, -1}, {0}, 1).status().message(),
              HasSubstr("parameter group 1 has -1 elements"));
  EXPECT_THAT(ShardLayout::Make({10}, {0, -2}, 1).status().message(),
              HasSubstr("rank 1 is on node -2"));
}

// Which (group, element) each rank keeps under `layout`.
std::vector<std::set<std::pair<int, int64_t>>> Holdings(const ShardLayout& layout) {
  std::vector<std::set<std::pair<int, int64_t>>> held(layout.world());
  for (int r = 0; r < layout.world(); ++r) {
    for (int s : layout.KeptBy(r)) {
      for (int g = 0; g < layout.groups(); ++g) {
        const ElementRange range = layout.Range(g, s);
        for (int64_t e = range.begin; e < range.end; ++e) held[r].insert({g, e});
      }
    }
  }
  return held;
}

// Checks a plan against the layouts element by element: each new rank gets
// exactly what it keeps, once, each piece from a survivor that held it, or
// marked lost where no survivor did.
void ExpectPlanMovesWhatIsKeptFromWhoHeldIt(const ShardLayout& before, const ShardLayout& after,
                                            const std::vector<int>& new_rank_of_old,
                                            const std::vector<ReshardPiece>& plan) {
  std::vector<int> old_of_new(after.world(), -1);
  for (size_t r = 0; r < new_rank_of_old.size(); ++r) {
    if (new_rank_of_old[r] >= 0) old_of_new[new_rank_of_old[r]] = static_cast<int>(r);
  }
  const auto held_before = Holdings(before);
  const auto keeps_after = Holdings(after);
  std::vector<std::set<std::pair<int, int64_t>>> got(after.world());
  for (const ReshardPiece& p : plan) {
    for (int64_t e = p.range.begin; e < p.range.end; ++e) {
      EXPECT_TRUE(got[p.to].insert({p.group, e}).second)
          << "new rank " << p.to << " gets element " << e << " of group " << p.group << " twice";
      if (p.from == ReshardPiece::kLost) {
        for (size_t r = 0; r < new_rank_of_old.size(); ++r) {
          EXPECT_FALSE(new_rank_of_old[r] >= 0 && held_before[r].count({p.group, e}))
              << "element " << e << " of group " << p.group << " is marked lost, but old rank " << r
              << " survived holding it";
        }
        continue;
      }
      ASSERT_GE(p.from, 0);
      ASSERT_LT(p.from, after.world());
      const int source_old = old_of_new[p.from];
      ASSERT_GE(source_old, 0) << "piece from new rank " << p.from
                               << ", a joiner, who holds nothing";
      EXPECT_TRUE(held_before[source_old].count({p.group, e}))
          << "new rank " << p.from << " did not hold element " << e << " of group " << p.group;
    }
  }
  for (int t = 0; t < after.world(); ++t) EXPECT_EQ(got[t], keeps_after[t]) << "new rank " << t;
}

TEST(ShardLayoutTest, AfterADeathEveryKeptRangeComesFromASurvivorThatHeldIt) {
  // 2 nodes x 2, rank 1 killed: ranks 0, 2, 3 become 0, 1, 2.
  const ShardLayout before = Layout({10, 7}, Nodes(2, 2), 2);
  const ShardLayout after = Layout({10, 7}, {0, 1, 1}, 2);
  const std::vector<int> mapping = {0, -1, 1, 2};
  absl::StatusOr<std::vector<ReshardPiece>> plan = PlanReshard(before, after, mapping);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(CheckNothingLost(*plan).ok()) << CheckNothingLost(*plan);
  ExpectPlanMovesWhatIsKeptFromWhoHeldIt(before, after, mapping, *plan);
}

TEST(ShardLayoutTest, AJoinerGetsWhatItKeepsFromTheRanksThatHoldIt) {
  // Two nodes of one rank; a third rank joins on node 1.
  const ShardLayout before = Layout({10, 7}, {0, 1}, 2);
  const ShardLayout after = Layout({10, 7}, {0, 1, 1}, 2);
  const std::vector<int> mapping = {0, 1};
  absl::StatusOr<std::vector<ReshardPiece>> plan = PlanReshard(before, after, mapping);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(CheckNothingLost(*plan).ok()) << CheckNothingLost(*plan);
  ExpectPlanMovesWhatIsKeptFromWhoHeldIt(before, after, mapping, *plan);
  int to_joiner = 0;
  for (const ReshardPiece& p : *plan) {
    if (p.to != 2) continue;
    ++to_joiner;
    EXPECT_NE(p.from, 2) << "the joiner holds nothing yet";
  }
  EXPECT_GT(to_joiner, 0);
}

TEST(ShardLayoutTest, WhatARankAlreadyHoldsStaysWithIt) {
  const ShardLayout before = Layout({12}, Nodes(2, 2), 2);
  const ShardLayout after = Layout({12}, Nodes(2, 2), 2);
  absl::StatusOr<std::vector<ReshardPiece>> plan = PlanReshard(before, after, {0, 1, 2, 3});
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (const ReshardPiece& p : *plan) EXPECT_EQ(p.from, p.to) << "same world, nothing moves";
}

// Every world up to 6 ranks on one or two nodes, one and two copies, with
// no death, each single death and each pair of deaths: the plan is right,
// and it marks something lost exactly when some element is held by no one.
TEST(ShardLayoutTest, ThePlanIsRightAndLosesSomethingExactlyWhenNoSurvivorHoldsIt) {
  for (int w = 1; w <= 6; ++w) {
    for (int copies : {1, 2}) {
      for (int nodes : {1, 2}) {
        std::vector<int> node(w);
        for (int r = 0; r < w; ++r) node[r] = r * nodes / w;
        const ShardLayout before = Layout({13, 5}, node, copies);
        const auto held = Holdings(before);
        for (int a = -1; a < w; ++a) {
          for (int b = a; b < w; ++b) {
            std::vector<int> mapping(w), new_node;
            int next = 0;
            for (int r = 0; r < w; ++r) {
              const bool dead = r == a || r == b;
              mapping[r] = dead ? -1 : next++;
              if (!dead) new_node.push_back(node[r]);
            }
            if (next == 0) continue;
            const ShardLayout after = Layout({13, 5}, new_node, copies);
            std::set<std::pair<int, int64_t>> alive;
            for (int r = 0; r < w; ++r) {
              if (mapping[r] >= 0) alive.insert(held[r].begin(), held[r].end());
            }
            const bool all_held = alive.size() == 13u + 5u;
            absl::StatusOr<std::vector<ReshardPiece>> plan = PlanReshard(before, after, mapping);
            SCOPED_TRACE(testing::Message() << "w=" << w << " copies=" << copies
                                            << " nodes=" << nodes << " dead=" << a << "," << b);
            ASSERT_TRUE(plan.ok()) << plan.status();
            ExpectPlanMovesWhatIsKeptFromWhoHeldIt(before, after, mapping, *plan);
            const absl::Status nothing_lost = CheckNothingLost(*plan);
            EXPECT_EQ(nothing_lost.ok(), all_held) << nothing_lost;
            if (!nothing_lost.ok()) {
              EXPECT_EQ(nothing_lost.code(), absl::StatusCode::kNotFound);
            }
          }
        }
      }
    }
  }
}

TEST(ShardLayoutTest, WithOneCopyADeadRanksStateIsMarkedLostAndNamed) {
  // Old shards [0,2) [2,4) [4,6) [6,8); rank 1 dies with [2,4). New shards
  // [0,3) [3,6) [6,8): new rank 0 lacks [2,3), new rank 1 lacks [3,4).
  const ShardLayout before = Layout({8}, Nodes(2, 2), 1);
  const ShardLayout after = Layout({8}, {0, 1, 1}, 1);
  const std::vector<int> mapping = {0, -1, 1, 2};
  absl::StatusOr<std::vector<ReshardPiece>> plan = PlanReshard(before, after, mapping);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExpectPlanMovesWhatIsKeptFromWhoHeldIt(before, after, mapping, *plan);
  std::vector<std::pair<int, ElementRange>> lost;
  for (const ReshardPiece& p : *plan) {
    if (p.from == ReshardPiece::kLost) lost.push_back({p.to, p.range});
  }
  ASSERT_EQ(lost.size(), 2u);
  EXPECT_EQ(lost[0].first, 0);
  EXPECT_EQ(lost[0].second, (ElementRange{2, 3}));
  EXPECT_EQ(lost[1].first, 1);
  EXPECT_EQ(lost[1].second, (ElementRange{3, 4}));
  const absl::Status s = CheckNothingLost(*plan);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(),
              HasSubstr("elements [2, 3) of parameter group 0, which new rank 0 keeps"));
  EXPECT_THAT(s.message(), HasSubstr("must come from a checkpoint"));
}

TEST(ShardLayoutTest, LayoutsThatDoNotFitAreRefused) {
  const ShardLayout four = Layout({8}, Nodes(2, 2), 2);
  EXPECT_THAT(PlanReshard(four, Layout({8, 1}, {0, 1}, 2), {0, 1, -1, -1}).status().message(),
              HasSubstr("1 and 2 parameter groups"));
  EXPECT_THAT(PlanReshard(four, Layout({9}, {0, 1}, 2), {0, 1, -1, -1}).status().message(),
              HasSubstr("8 elements before and 9 after"));
  EXPECT_THAT(PlanReshard(four, Layout({8}, {0, 1}, 2), {0, 1}).status().message(),
              HasSubstr("names 2 old ranks; the old world has 4"));
  EXPECT_THAT(PlanReshard(four, Layout({8}, {0, 1}, 2), {0, 0, -1, -1}).status().message(),
              HasSubstr("which another old rank maps to"));
  EXPECT_THAT(PlanReshard(four, Layout({8}, {0, 1}, 2), {0, 5, -1, -1}).status().message(),
              HasSubstr("old rank 1 maps to new rank 5 in a world of 2"));
}

// Buckets of whole parameters cover every parameter of every group once,
// last group first and each from its last parameter, at most `cap`
// elements unless one parameter alone is larger (the first bucket
// `first_cap`), and their counts are the shards' parts of them in rank
// order: what ReduceScatter needs to leave each rank its own.
TEST(ShardLayoutTest, BucketsOfWholeParametersCoverEachGroupBackwardWithTheShardsParts) {
  // Group 1 has no parameters; group 2 has empty ones at both ends.
  const std::vector<std::vector<int64_t>> params = {{4, 6}, {}, {0, 5, 1, 9, 8, 0}};
  for (int w : {1, 2, 3, 4}) {
    for (int64_t cap : {1, 3, 7, 100}) {
      const ShardLayout layout = Layout({10, 0, 23}, std::vector<int>(w, 0), 1);
      const std::vector<ShardedBucket> buckets = PlanBuckets(layout, params, 2, cap);
      std::vector<size_t> next_last = {2, 0, 6};  // each group is walked from its end
      std::vector<int64_t> next_end = {10, 0, 23};
      int last_group = layout.groups();
      for (size_t i = 0; i < buckets.size(); ++i) {
        const ShardedBucket& b = buckets[i];
        SCOPED_TRACE(testing::Message() << "w=" << w << " cap=" << cap << " group " << b.group
                                        << " [" << b.range.begin << ", " << b.range.end << ")");
        EXPECT_LE(b.group, last_group) << "groups go last first";
        last_group = b.group;
        EXPECT_EQ(b.last, next_last[b.group]);
        EXPECT_EQ(b.range.end, next_end[b.group]);
        ASSERT_LT(b.first, b.last);
        int64_t elements = 0;
        for (size_t j = b.first; j < b.last; ++j) elements += params[b.group][j];
        EXPECT_EQ(b.range.size(), elements) << "the bucket is its parameters' elements";
        const int64_t limit = i == 0 ? 2 : cap;
        if (b.range.size() > limit) {
          int64_t nonempty = 0;
          for (size_t j = b.first; j < b.last; ++j) nonempty += params[b.group][j] > 0 ? 1 : 0;
          EXPECT_EQ(nonempty, 1) << "only one parameter alone goes past the cap";
        }
        next_last[b.group] = b.first;
        next_end[b.group] = b.range.begin;
        ASSERT_EQ(static_cast<int>(b.counts.size()), w);
        int64_t at = b.range.begin;
        for (int r = 0; r < w; ++r) {
          // Rank r's segment is [at, at + counts[r]): inside its shard.
          const ElementRange shard = layout.Range(b.group, r);
          if (b.counts[r] > 0) {
            EXPECT_GE(at, shard.begin) << "rank " << r;
            EXPECT_LE(at + static_cast<int64_t>(b.counts[r]), shard.end) << "rank " << r;
          }
          at += static_cast<int64_t>(b.counts[r]);
        }
        EXPECT_EQ(at, b.range.end) << "the counts add up to the bucket";
      }
      EXPECT_THAT(next_last, ElementsAre(0, 0, 0)) << "every parameter in a bucket";
      EXPECT_THAT(next_end, ElementsAre(0, 0, 0));
    }
  }
}

// Each round of the parameters' all-gather takes the next piece of every
// shard: every element once, every piece inside its rank's shard, and the
// ranks' pieces within one element of each other while shards last.
// With two copies on two nodes of equal size, each node keeps every shard
// (its owner on one node, its buddy on the other), so the gather can stay
// inside the nodes: the plan names, for each node and shard, a rank of
// that node that keeps it, the owner where it is there. With one copy,
// a single node, or three nodes, some node lacks a shard (or there is
// nothing to split) and the plan is empty.
TEST(ShardLayoutTest, TheGatherStaysInsideNodesOnlyWhereEachNodeKeepsEveryShard) {
  for (int node_size : {1, 2, 3}) {
    const int w = 2 * node_size;
    std::vector<int> node_of(w);
    for (int r = 0; r < w; ++r) node_of[r] = r / node_size;
    const ShardLayout layout = Layout({10, 23}, node_of, 2);
    const std::vector<std::vector<int>> plan = PlanNodeGather(layout, node_size);
    ASSERT_EQ(plan.size(), 2u) << "node size " << node_size;
    for (int n = 0; n < 2; ++n) {
      ASSERT_EQ(static_cast<int>(plan[n].size()), w);
      for (int s = 0; s < w; ++s) {
        const int rank = n * node_size + plan[n][s];
        const std::vector<int> holders = layout.Holders(s);
        EXPECT_NE(std::find(holders.begin(), holders.end(), rank), holders.end())
            << "node " << n << " shard " << s << ": rank " << rank << " does not keep it";
        if (holders[0] / node_size == n) {
          EXPECT_EQ(rank, holders[0]) << "the owner first";
        }
      }
    }
    EXPECT_TRUE(PlanNodeGather(Layout({10, 23}, node_of, 1), node_size).empty());
    EXPECT_TRUE(PlanNodeGather(layout, w).empty()) << "one node";
  }
  EXPECT_TRUE(PlanNodeGather(Layout({10}, {0, 0, 1, 1, 2, 2}, 2), 2).empty()) << "three nodes";
  EXPECT_TRUE(PlanNodeGather(Layout({10}, {0, 0, 1, 1}, 2), 0).empty());
  EXPECT_TRUE(PlanNodeGather(Layout({10}, {0, 0, 1}, 2), 2).empty()) << "2 does not divide 3";
}

// Two copies on two nodes of equal size: a rank and its buddy are the same
// local rank of the two nodes, so every rank keeps only shards of its
// column, and a reduction that leaves each rank its column's segments gives
// it both parts it steps. One copy keeps only the rank's own shard (in its
// column). Three nodes of two (the buddy three places on, in another
// column), one node, and a size that does not divide the world do not.
TEST(ShardLayoutTest, TwoCopiesOnTwoNodesKeepOnlyTheirColumnsShards) {
  for (int node_size : {1, 2, 3}) {
    std::vector<int> node_of(2 * node_size);
    for (int r = 0; r < 2 * node_size; ++r) node_of[r] = r / node_size;
    EXPECT_TRUE(KeptInColumns(Layout({10, 23}, node_of, 2), node_size)) << node_size;
    EXPECT_TRUE(KeptInColumns(Layout({10, 23}, node_of, 1), node_size)) << node_size;
    EXPECT_FALSE(KeptInColumns(Layout({10, 23}, node_of, 2), 2 * node_size)) << "one node";
  }
  EXPECT_FALSE(KeptInColumns(Layout({10}, {0, 0, 1, 1, 2, 2}, 2), 2)) << "three nodes";
  EXPECT_FALSE(KeptInColumns(Layout({10}, {0, 0, 1, 1}, 2), 0));
  EXPECT_FALSE(KeptInColumns(Layout({10}, {0, 0, 1}, 2), 2)) << "2 does not divide 3";
}

TEST(ShardLayoutTest, GatherRoundsTakeTheNextPieceOfEveryShard) {
  for (int w : {1, 2, 3, 4}) {
    for (int64_t cap : {1, 3, 8, 100}) {
      const ShardLayout layout = Layout({10, 0, 23}, std::vector<int>(w, 0), 1);
      const std::vector<GatherRound> rounds = PlanGatherRounds(layout, cap);
      std::vector<std::vector<int64_t>> next(3, std::vector<int64_t>(w));
      for (int g = 0; g < 3; ++g) {
        for (int r = 0; r < w; ++r) next[g][r] = layout.Range(g, r).begin;
      }
      const int64_t per = std::max<int64_t>(cap / w, 1);
      int last_group = 0;
      for (const GatherRound& round : rounds) {
        SCOPED_TRACE(testing::Message() << "w=" << w << " cap=" << cap << " group "
                                        << round.group);
        EXPECT_GE(round.group, last_group) << "groups in order";
        last_group = round.group;
        ASSERT_EQ(static_cast<int>(round.pieces.size()), w);
        int64_t total = 0;
        for (int r = 0; r < w; ++r) {
          const ElementRange piece = round.pieces[r];
          const ElementRange shard = layout.Range(round.group, r);
          EXPECT_EQ(piece.begin, std::min(next[round.group][r], shard.end)) << "rank " << r;
          EXPECT_LE(piece.end, shard.end) << "rank " << r;
          EXPECT_LE(piece.size(), per) << "rank " << r;
          // A shard not used up gives a whole piece: the ranks send alike.
          if (piece.end < shard.end) {
            EXPECT_EQ(piece.size(), per) << "rank " << r;
          }
          EXPECT_EQ(round.counts()[r], static_cast<size_t>(piece.size()));
          next[round.group][r] = piece.end;
          total += piece.size();
        }
        EXPECT_GT(total, 0) << "no empty round";
      }
      for (int g = 0; g < 3; ++g) {
        for (int r = 0; r < w; ++r) {
          EXPECT_EQ(next[g][r], layout.Range(g, r).end) << "group " << g << " rank " << r;
        }
      }
    }
  }
}

}  // namespace
}  // namespace muster
