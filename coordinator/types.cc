#include "coordinator/types.h"

#include <xxhash.h>

#include <algorithm>
#include <set>

namespace muster {

const char* MemberStateName(MemberState state) {
  switch (state) {
    case MemberState::kWaiting: return "waiting";
    case MemberState::kActive: return "active";
    case MemberState::kDraining: return "draining";
    case MemberState::kFailed: return "failed";
    case MemberState::kLeft: return "left";
    case MemberState::kFinished: return "finished";
  }
  return "unknown";
}

int World::RankOf(const std::string& id) const {
  if (rank_of_.size() == members.size()) {
    const auto it = rank_of_.find(id);
    if (it == rank_of_.end()) return -1;
    if (it->second < members.size() && members[it->second].member.id == id) {
      return static_cast<int>(members[it->second].rank);
    }
  }
  for (const Assignment& a : members) {
    if (a.member.id == id) return static_cast<int>(a.rank);
  }
  return -1;
}

int World::RankOf(const std::string& id, uint32_t hint) const {
  if (hint < members.size() && members[hint].member.id == id) return static_cast<int>(hint);
  return RankOf(id);
}

void World::Index() {
  rank_of_.clear();
  rank_of_.reserve(members.size());
  for (size_t i = 0; i < members.size(); ++i) {
    rank_of_[members[i].member.id] = static_cast<uint32_t>(i);
  }
  XXH3_state_t* h = XXH3_createState();
  XXH3_64bits_reset(h);
  std::set<uint32_t> sizes;
  for (const Assignment& a : members) {
    // Each string with its length, so that no two lists hash the same bytes.
    for (const std::string* s : {&a.member.id, &a.node}) {
      const uint64_t n = s->size();
      XXH3_64bits_update(h, &n, sizeof n);
      XXH3_64bits_update(h, s->data(), s->size());
    }
    const uint64_t numbers[] = {a.member.incarnation, a.rank};
    XXH3_64bits_update(h, numbers, sizeof numbers);
    if (a.local_rank == 0) sizes.insert(a.local_world_size);
  }
  digest_ = XXH3_64bits_digest(h);
  XXH3_freeState(h);
  node_sizes_.assign(sizes.begin(), sizes.end());
}

}  // namespace muster
