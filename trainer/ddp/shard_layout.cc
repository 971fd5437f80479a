#include "trainer/ddp/shard_layout.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"

namespace muster {

absl::StatusOr<ShardLayout> ShardLayout::Make(std::vector<int64_t> group_elements,
                                              std::vector<int> node_of_rank, int copies) {
  if (node_of_rank.empty()) {
    return absl::InvalidArgumentError("a shard layout needs a world of at least one rank");
  }
  if (copies != 1 && copies != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer state copies must be 1 or 2, not ", copies));
  }
  for (size_t g = 0; g < group_elements.size(); ++g) {
    if (group_elements[g] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter group ", g, " has ", group_elements[g], " elements"));
    }
  }
  for (size_t r = 0; r < node_of_rank.size(); ++r) {
    if (node_of_rank[r] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", r, " is on node ", node_of_rank[r], ", not a node index"));
    }
  }
  return ShardLayout(std::move(group_elements), std::move(node_of_rank), copies);
}

ShardLayout::ShardLayout(std::vector<int64_t> group_elements, std::vector<int> node_of_rank,
                         int copies)
    : group_elements_(std::move(group_elements)),
      node_of_rank_(std::move(node_of_rank)),
      copies_(std::min(copies, static_cast<int>(node_of_rank_.size()))),
      order_(node_of_rank_.size()),
      position_(node_of_rank_.size()) {
  std::iota(order_.begin(), order_.end(), 0);
  std::stable_sort(order_.begin(), order_.end(),
                   [this](int a, int b) { return node_of_rank_[a] < node_of_rank_[b]; });
  for (size_t p = 0; p < order_.size(); ++p) position_[order_[p]] = static_cast<int>(p);
}

ElementRange ShardLayout::Range(int group, int shard) const {
  const int64_t n = group_elements_[group];
  const int64_t w = world();
  const int64_t base = n / w;
  const int64_t extra = n % w;
  const int64_t begin = shard * base + std::min<int64_t>(shard, extra);
  return ElementRange{begin, begin + base + (shard < extra ? 1 : 0)};
}

std::vector<int> ShardLayout::Holders(int shard) const {
  if (copies_ == 1) return {shard};
  const int w = world();
  return {shard, order_[(position_[shard] + w / 2) % w]};
}

std::vector<int> ShardLayout::KeptBy(int rank) const {
  if (copies_ == 1) return {rank};
  const int w = world();
  return {rank, order_[(position_[rank] - w / 2 + w) % w]};
}

namespace {

// The new rank that sends `shard`'s elements of the old layout to new rank
// `to`: `to` itself if it held them, else the first holder that survived;
// ReshardPiece::kLost if none did.
int SourceOf(const ShardLayout& before, int shard, int to,
             const std::vector<int>& new_rank_of_old) {
  const std::vector<int> holders = before.Holders(shard);
  for (int old : holders) {
    if (new_rank_of_old[old] == to) return to;
  }
  for (int old : holders) {
    if (new_rank_of_old[old] >= 0) return new_rank_of_old[old];
  }
  return ReshardPiece::kLost;
}

absl::Status CheckFit(const ShardLayout& before, const ShardLayout& after,
                      const std::vector<int>& new_rank_of_old) {
  if (before.groups() != after.groups()) {
    return absl::InvalidArgumentError(absl::StrCat("the layouts have ", before.groups(), " and ",
                                                   after.groups(), " parameter groups"));
  }
  for (int g = 0; g < before.groups(); ++g) {
    if (before.group_elements(g) != after.group_elements(g)) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter group ", g, " has ", before.group_elements(g),
                       " elements before and ", after.group_elements(g), " after"));
    }
  }
  if (static_cast<int>(new_rank_of_old.size()) != before.world()) {
    return absl::InvalidArgumentError(absl::StrCat("the mapping names ", new_rank_of_old.size(),
                                                   " old ranks; the old world has ",
                                                   before.world()));
  }
  std::vector<char> taken(after.world(), 0);
  for (size_t r = 0; r < new_rank_of_old.size(); ++r) {
    const int t = new_rank_of_old[r];
    if (t < -1 || t >= after.world() || (t >= 0 && taken[t])) {
      return absl::InvalidArgumentError(
          absl::StrCat("old rank ", r, " maps to new rank ", t, " in a world of ", after.world(),
                       t >= 0 && t < after.world() ? ", which another old rank maps to" : ""));
    }
    if (t >= 0) taken[t] = 1;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<ReshardPiece>> PlanReshard(const ShardLayout& before,
                                                      const ShardLayout& after,
                                                      const std::vector<int>& new_rank_of_old) {
  if (absl::Status s = CheckFit(before, after, new_rank_of_old); !s.ok()) return s;
  std::vector<ReshardPiece> pieces;
  for (int to = 0; to < after.world(); ++to) {
    for (int kept : after.KeptBy(to)) {
      for (int g = 0; g < after.groups(); ++g) {
        const ElementRange want = after.Range(g, kept);
        // Old shards are contiguous and in order: walk those that overlap.
        for (int old = 0; old < before.world(); ++old) {
          const ElementRange had = before.Range(g, old);
          const ElementRange part = want.Overlap(had);
          if (part.size() <= 0) continue;
          pieces.push_back(ReshardPiece{to, SourceOf(before, old, to, new_rank_of_old), g, part});
        }
      }
    }
  }
  return pieces;
}

absl::Status CheckNothingLost(const std::vector<ReshardPiece>& plan) {
  for (const ReshardPiece& p : plan) {
    if (p.from != ReshardPiece::kLost) continue;
    return absl::NotFoundError(
        absl::StrCat("no surviving rank holds elements [", p.range.begin, ", ", p.range.end,
                     ") of parameter group ", p.group, ", which new rank ", p.to,
                     " keeps: that optimizer state must come from a checkpoint"));
  }
  return absl::OkStatus();
}

std::vector<ShardedBucket> PlanBuckets(const ShardLayout& layout,
                                       const std::vector<std::vector<int64_t>>& param_elements,
                                       int64_t first_cap, int64_t cap) {
  std::vector<ShardedBucket> buckets;
  for (int g = layout.groups() - 1; g >= 0; --g) {
    const std::vector<int64_t>& sizes = param_elements[static_cast<size_t>(g)];
    size_t last = sizes.size();
    int64_t end = layout.group_elements(g);
    while (last > 0) {
      const int64_t limit = buckets.empty() ? first_cap : cap;
      size_t first = last - 1;
      int64_t begin = end - sizes[first];
      while (first > 0 && (sizes[first - 1] == 0 || end - begin + sizes[first - 1] <= limit)) {
        begin -= sizes[--first];
      }
      // Empty parameters before it alone would make a bucket of nothing.
      if (std::all_of(sizes.begin(), sizes.begin() + static_cast<ptrdiff_t>(first),
                      [](int64_t n) { return n == 0; })) {
        first = 0;
      }
      ShardedBucket b;
      b.group = g;
      b.first = first;
      b.last = last;
      b.range = ElementRange{begin, end};
      for (int r = 0; r < layout.world(); ++r) {
        const int64_t n = b.range.Overlap(layout.Range(g, r)).size();
        b.counts.push_back(static_cast<size_t>(std::max<int64_t>(n, 0)));
      }
      buckets.push_back(std::move(b));
      last = first;
      end = begin;
    }
  }
  return buckets;
}

std::vector<size_t> GatherRound::counts() const {
  std::vector<size_t> n;
  for (const ElementRange& piece : pieces) {
    n.push_back(static_cast<size_t>(std::max<int64_t>(piece.size(), 0)));
  }
  return n;
}

std::vector<GatherRound> PlanGatherRounds(const ShardLayout& layout, int64_t cap) {
  const int64_t per = std::max<int64_t>(cap / layout.world(), 1);
  std::vector<GatherRound> rounds;
  for (int g = 0; g < layout.groups(); ++g) {
    int64_t largest = 0;
    for (int r = 0; r < layout.world(); ++r) {
      largest = std::max(largest, layout.Range(g, r).size());
    }
    for (int64_t at = 0; at < largest; at += per) {
      GatherRound round;
      round.group = g;
      for (int r = 0; r < layout.world(); ++r) {
        const ElementRange shard = layout.Range(g, r);
        const int64_t begin = std::min(shard.end, shard.begin + at);
        round.pieces.push_back(ElementRange{begin, std::min(shard.end, begin + per)});
      }
      rounds.push_back(std::move(round));
    }
  }
  return rounds;
}

std::vector<std::vector<int>> PlanNodeGather(const ShardLayout& layout, int node_size) {
  const int world = layout.world();
  if (node_size <= 0 || world % node_size != 0 || node_size == world) return {};
  std::vector<std::vector<int>> plan(world / node_size, std::vector<int>(world, -1));
  for (int s = 0; s < world; ++s) {
    for (int holder : layout.Holders(s)) {
      int& provider = plan[holder / node_size][s];
      if (provider < 0) provider = holder % node_size;  // the owner comes first
    }
  }
  for (const std::vector<int>& node : plan) {
    if (std::find(node.begin(), node.end(), -1) != node.end()) return {};
  }
  return plan;
}

bool KeptInColumns(const ShardLayout& layout, int node_size) {
  const int world = layout.world();
  if (node_size <= 0 || world % node_size != 0 || node_size == world) return false;
  for (int r = 0; r < world; ++r) {
    for (int s : layout.KeptBy(r)) {
      if (s % node_size != r % node_size) return false;
    }
  }
  return true;
}

}  // namespace muster
