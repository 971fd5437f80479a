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
  for (const Assignment& a : members) {
    if (a.member.id == id) return static_cast<int>(a.rank);
  }
  return -1;
}

}  // namespace muster
