#include "coordinator/types.h"

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

void World::Index() {
  rank_of_.clear();
  rank_of_.reserve(members.size());
  for (size_t i = 0; i < members.size(); ++i) {
    rank_of_[members[i].member.id] = static_cast<uint32_t>(i);
  }
}

}  // namespace muster
