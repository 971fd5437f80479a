#include "coordinator/membership.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace muster {

bool IsAlive(MemberState state) {
  return state == MemberState::kWaiting || state == MemberState::kActive ||
         state == MemberState::kDraining;
}

absl::StatusOr<JoinOutcome> Membership::Join(const JoinSpec& spec, absl::Time now,
                                             MemberInfo* fenced) {
  MUSTER_RETURN_IF_ERROR(CheckName("member_id", spec.key.id, limits_.max_id_bytes));
  MUSTER_RETURN_IF_ERROR(CheckName("node", spec.node, limits_.max_id_bytes));
  MUSTER_RETURN_IF_ERROR(
      CheckOptional("state_address", spec.state_address, limits_.max_address_bytes));
  if (spec.key.incarnation == 0) {
    return absl::InvalidArgumentError("incarnation is 0; it must be non-zero");
  }
  if (spec.step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("step is negative (", spec.step, ")"));
  }

  auto it = members_.find(spec.key.id);
  JoinOutcome outcome = JoinOutcome::kNew;
  if (it != members_.end()) {
    MemberInfo& old = it->second;
    if (old.key.incarnation == spec.key.incarnation) {
      if (!IsAlive(old.state)) {
        return absl::AbortedError(absl::StrCat(
            "member ", spec.key.id, " incarnation ", spec.key.incarnation, " is ",
            MemberStateName(old.state),
            old.reason.empty() ? "" : absl::StrCat(" (", old.reason, ")"),
            "; a restarted process must join with a new incarnation"));
      }
      old.node = spec.node;
      old.local_rank = spec.local_rank;
      old.state_address = spec.state_address;
      old.spare = spec.spare;
      old.step = std::max(old.step, spec.step);
      Seen(&old, now);
      return JoinOutcome::kReattached;
    }
    if (IsAlive(old.state)) {
      outcome = JoinOutcome::kReplaced;
      if (fenced != nullptr) {
        *fenced = old;
        fenced->listed = false;  // a copy: not in by_seen_
      }
    }
    Erase(it);
  } else if (members_.size() >= limits_.max_members) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the coordinator tracks ", members_.size(), " members; the limit is ",
        limits_.max_members));
  }

  MemberInfo info;
  info.key = spec.key;
  info.node = spec.node;
  info.local_rank = spec.local_rank;
  info.state_address = spec.state_address;
  info.spare = spec.spare;
  info.step = spec.step;
  info.joined = now;
  auto added = members_.emplace(spec.key.id, std::move(info)).first;
  index_[added->first] = &added->second;
  Seen(&added->second, now);
  return outcome;
}

void Membership::Seen(MemberInfo* info, absl::Time now) {
  info->last_seen = now;
  if (info->listed) {
    by_seen_.splice(by_seen_.end(), by_seen_, info->seen_at);
  } else {
    info->seen_at = by_seen_.insert(by_seen_.end(), info);
    info->listed = true;
  }
}

void Membership::Erase(std::map<std::string, MemberInfo>::iterator it) {
  if (it->second.listed) by_seen_.erase(it->second.seen_at);
  index_.erase(it->first);
  members_.erase(it);
}

MemberInfo* Membership::Find(const std::string& id) {
  auto it = index_.find(id);
  return it == index_.end() ? nullptr : it->second;
}

const MemberInfo* Membership::Find(const std::string& id) const {
  auto it = index_.find(id);
  return it == index_.end() ? nullptr : it->second;
}

absl::StatusOr<MemberInfo*> Membership::Live(const MemberKey& key) {
  MUSTER_RETURN_IF_ERROR(CheckName("member_id", key.id, limits_.max_id_bytes));
  MemberInfo* info = Find(key.id);
  if (info == nullptr) {
    return absl::NotFoundError(absl::StrCat("unknown member ", key.id, "; join first"));
  }
  if (info->key.incarnation != key.incarnation) {
    return absl::AbortedError(absl::StrCat(
        "member ", key.id, " incarnation ", key.incarnation,
        " was replaced by incarnation ", info->key.incarnation));
  }
  if (!IsAlive(info->state)) {
    return absl::AbortedError(absl::StrCat(
        "member ", key.id, " incarnation ", key.incarnation, " is ",
        MemberStateName(info->state),
        info->reason.empty() ? "" : absl::StrCat(" (", info->reason, ")")));
  }
  return info;
}

bool Membership::AliveOnTwoNodes() const {
  const std::string* first = nullptr;
  for (const auto& [id, info] : members_) {
    if (!IsAlive(info.state)) continue;
    if (first == nullptr) {
      first = &info.node;
    } else if (info.node != *first) {
      return true;
    }
  }
  return false;
}

std::vector<std::string> Membership::Expired(absl::Time now, absl::Duration timeout) {
  std::vector<std::string> out;
  for (auto it = by_seen_.begin(); it != by_seen_.end();) {
    MemberInfo* info = *it;
    if (now - info->last_seen <= timeout) break;  // every later one is newer
    if (!IsAlive(info->state)) {
      info->listed = false;
      it = by_seen_.erase(it);
      continue;
    }
    out.push_back(info->key.id);
    ++it;
  }
  return out;
}

void Membership::PruneEnded(size_t keep) {
  std::vector<std::pair<absl::Time, std::string>> ended;
  for (const auto& [id, info] : members_) {
    if (!IsAlive(info.state)) ended.emplace_back(info.last_seen, id);
  }
  if (ended.size() <= keep) return;
  std::sort(ended.begin(), ended.end());
  for (size_t i = 0; i + keep < ended.size(); ++i) Erase(members_.find(ended[i].second));
}

}  // namespace muster
