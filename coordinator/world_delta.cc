#include "coordinator/world_delta.h"

#include <algorithm>

namespace muster {
namespace {

// Whether next's ranks below `end` are numbered inside their nodes as a
// member derives it: local ranks counted afresh along each node's
// (contiguous) ranks, and the node's count as its local world size.
bool LocalRanksCounted(const World& next, uint32_t end) {
  uint32_t start = 0;
  while (start < end) {
    uint32_t stop = start + 1;
    while (stop < end && next.members[stop].node == next.members[start].node) ++stop;
    for (uint32_t r = start; r < stop; ++r) {
      const Assignment& a = next.members[r];
      if (a.local_rank != r - start || a.local_world_size != stop - start) return false;
    }
    start = stop;
  }
  return true;
}

}  // namespace

std::optional<WorldDelta> MakeWorldDelta(const World& base, const World& next) {
  if (base.generation == 0 || base.members.empty() || next.generation <= base.generation) {
    return std::nullopt;
  }
  WorldDelta d;
  d.base_generation = base.generation;
  d.base_digest = base.digest();
  std::vector<bool> node_kept(base.node_count, false);
  uint32_t j = 0;
  for (uint32_t i = 0; i < base.size(); ++i) {
    const Assignment& b = base.members[i];
    if (b.node_rank >= base.node_count) return std::nullopt;
    if (j < next.size() && next.members[j].member == b.member) {
      const Assignment& n = next.members[j];
      if (n.node != b.node || n.state_address != b.state_address) return std::nullopt;
      node_kept[b.node_rank] = true;
      ++j;
    } else {
      d.removed_ranks.push_back(i);
    }
  }
  d.first_appended = j;
  for (uint32_t n = 0; n < base.node_count; ++n) {
    if (!node_kept[n]) d.removed_nodes.push_back(n);
  }
  // The remaining members' node ranks: the base's, less the removed nodes
  // below (the same walk as above, now that those are known).
  size_t removed = 0;
  for (uint32_t i = 0, r = 0; i < base.size(); ++i) {
    if (removed < d.removed_ranks.size() && d.removed_ranks[removed] == i) {
      ++removed;
      continue;
    }
    const uint32_t old_node = base.members[i].node_rank;
    const auto below = static_cast<uint32_t>(
        std::lower_bound(d.removed_nodes.begin(), d.removed_nodes.end(), old_node) -
        d.removed_nodes.begin());
    if (next.members[r++].node_rank != old_node - below) return std::nullopt;
  }
  if (!LocalRanksCounted(next, d.first_appended)) return std::nullopt;
  // Appended members: new to the base, on nodes of their own.
  for (uint32_t r = d.first_appended; r < next.size(); ++r) {
    const Assignment& a = next.members[r];
    if (base.RankOf(a.member.id) >= 0) return std::nullopt;
    if (d.first_appended > 0 && a.node == next.members[d.first_appended - 1].node) {
      return std::nullopt;
    }
  }
  return d;
}

std::optional<uint32_t> BaseRank(const WorldDelta& delta, uint32_t rank) {
  if (rank >= delta.first_appended) return std::nullopt;
  // With k removed ranks below it, base rank b = rank + k. Removed rank
  // x_i lies below b exactly when x_i - i <= rank, and x_i - i never falls
  // as i grows: k is where that stops holding.
  const std::vector<uint32_t>& x = delta.removed_ranks;
  size_t lo = 0, hi = x.size();
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (x[mid] - mid <= rank) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return rank + static_cast<uint32_t>(lo);
}

}  // namespace muster
