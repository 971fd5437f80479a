#include "coordinator/partition_holds.h"

#include <algorithm>
#include <tuple>
#include <utility>

namespace muster {

std::vector<std::string> PartitionHolds::LeaveOut(const World& world, uint32_t reporter,
                                                  const std::vector<uint32_t>& unreachable) {
  if (world.generation != pairs_generation_) {
    pairs_.clear();
    pairs_generation_ = world.generation;
  }
  if (reporter >= world.size()) return {};
  const std::string& from = world.members[reporter].node;
  for (uint32_t r : unreachable) {
    if (r >= world.size() || world.members[r].node == from) continue;
    std::pair<std::string, std::string> p = std::minmax(from, world.members[r].node);
    if (std::find(pairs_.begin(), pairs_.end(), p) == pairs_.end()) pairs_.push_back(std::move(p));
  }
  if (pairs_.empty()) return {};
  // Members and first rank of each node named in a pair.
  struct NodeFacts {
    uint32_t members = 0;
    uint32_t first_rank = 0;
  };
  absl::flat_hash_map<std::string, NodeFacts> facts;
  for (const auto& [a, b] : pairs_) {
    facts[a];
    facts[b];
  }
  for (const Assignment& m : world.members) {
    auto it = facts.find(m.node);
    if (it == facts.end()) continue;
    if (it->second.members++ == 0) it->second.first_rank = m.rank;
  }
  std::vector<std::pair<std::string, std::string>> left = pairs_;
  std::vector<std::string> out;
  while (!left.empty()) {
    absl::flat_hash_map<std::string, int> degree;
    for (const auto& [a, b] : left) {
      ++degree[a];
      ++degree[b];
    }
    // Most pairs first, then fewer members, then the highest first rank.
    auto key = [&](const std::string& n) {
      const NodeFacts& f = facts[n];
      return std::make_tuple(degree[n], -static_cast<int64_t>(f.members), f.first_rank);
    };
    std::string worst;
    for (const auto& [n, d] : degree) {
      if (worst.empty() || key(n) > key(worst)) worst = n;
    }
    out.push_back(worst);
    left.erase(std::remove_if(left.begin(), left.end(),
                              [&](const auto& p) { return p.first == worst || p.second == worst; }),
               left.end());
  }
  return out;
}

absl::Duration PartitionHolds::Hold(const std::string& node, absl::Time now) {
  Strikes& s = strikes_[node];
  if (s.count > 0 && now - s.last > options_.forget_after) s.count = 0;
  absl::Duration hold = options_.first_hold;
  for (int i = 0; i < s.count && hold < options_.max_hold; ++i) hold *= 2;
  hold = std::min(hold, options_.max_hold);
  ++s.count;
  s.last = now;
  held_until_[node] = now + hold;
  return hold;
}

bool PartitionHolds::Held(const std::string& node, absl::Time now) const {
  auto it = held_until_.find(node);
  return it != held_until_.end() && now < it->second;
}

std::optional<absl::Time> PartitionHolds::NextEnd() const {
  std::optional<absl::Time> next;
  for (const auto& [node, until] : held_until_) {
    if (!next.has_value() || until < *next) next = until;
  }
  return next;
}

std::vector<std::string> PartitionHolds::Ended(absl::Time now) {
  std::vector<std::string> out;
  for (auto it = held_until_.begin(); it != held_until_.end();) {
    if (now >= it->second) {
      out.push_back(it->first);
      held_until_.erase(it++);
    } else {
      ++it;
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace muster
