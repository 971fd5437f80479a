// Membership: the table of every trainer process the coordinator knows, its
// identity (member id + incarnation), node, local rank, state, last reported
// step and last sign of life.
//
// Not thread-safe: owned by Coordinator and used under its mutex.
#ifndef MUSTER_COORDINATOR_MEMBERSHIP_H_
#define MUSTER_COORDINATOR_MEMBERSHIP_H_

#include <cstdint>
#include <list>
#include <map>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "coordinator/limits.h"
#include "coordinator/types.h"

namespace muster {

// A member's memory account, in bytes (Heartbeat.memory): what holds it.
struct MemberMemory {
  uint64_t parameters = 0, gradients = 0, optimizer_state = 0, communication = 0, staging = 0,
           transfer = 0;
  uint64_t total() const {
    return parameters + gradients + optimizer_state + communication + staging + transfer;
  }
};

struct MemberInfo {
  MemberKey key;
  std::string node;
  uint32_t local_rank = 0;
  std::string state_address;
  bool spare = false;     // started as a hot spare: taken after the others
  MemberState state = MemberState::kWaiting;
  int64_t step = 0;
  int64_t samples = 0;    // Heartbeat.samples: its world's samples so far
  MemberMemory memory;    // Heartbeat.memory, the last reported
  // Since when its training thread has made no progress
  // (Heartbeat.stalled_ms), as its trainer said at `progress_at`;
  // InfiniteFuture when it said 0.
  absl::Time stalled_since = absl::InfiniteFuture();
  absl::Time progress_at = absl::InfinitePast();
  // Heartbeat.working, as of `progress_at`: a stall during which the
  // thread ran (the program's own work), not a stuck thread.
  bool working = false;
  absl::Time joined;
  absl::Time last_seen;   // join, hello or heartbeat (Membership::Seen)
  uint64_t session = 0;   // id of the open session, 0 if none
  // Its rank in the world that last seated it (Coordinator::TakeSeats): a
  // hint, valid only where that rank of the current world holds its id.
  uint32_t seat = 0;
  std::string reason;     // why it failed or left
  bool stopped = false;   // left with the job's stop (LeaveReason::kStopped)
  // When its last Rendezvous wait ran out unanswered (a spare renews its
  // wait at once): Coordinator::Candidates counts it as waiting for a
  // moment after (kRenewGrace). Not stored.
  absl::Time wait_ended = absl::InfinitePast();
  // Membership's own: its place in the order of last signs of life.
  bool listed = false;
  std::list<MemberInfo*>::iterator seen_at;
};

struct JoinSpec {
  MemberKey key;
  std::string node;
  uint32_t local_rank = 0;
  std::string state_address;
  int64_t step = 0;
  bool spare = false;
};

enum class JoinOutcome {
  kNew,        // first time this member id is seen (or it had ended)
  kReattached, // same id and incarnation as a known member
  kReplaced,   // same id, new incarnation: the old one is fenced
};

class Membership {
 public:
  explicit Membership(const Limits& limits) : limits_(limits) {}
  // by_seen_ points into members_.
  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

  // Registers `spec`. Errors: INVALID_ARGUMENT (empty or oversized fields,
  // incarnation 0), RESOURCE_EXHAUSTED (more than limits.max_members tracked),
  // ABORTED (this exact incarnation was declared failed: start a new one).
  // On kReplaced, `*fenced` receives the old incarnation's record.
  absl::StatusOr<JoinOutcome> Join(const JoinSpec& spec, absl::Time now,
                                   MemberInfo* fenced);

  // The member with this id, or nullptr.
  MemberInfo* Find(const std::string& id);
  const MemberInfo* Find(const std::string& id) const;

  // The member named by `key` if it is that exact incarnation and still
  // alive. Errors: INVALID_ARGUMENT (bad key), NOT_FOUND (unknown id: join
  // first), ABORTED (another incarnation, or this one failed or left).
  absl::StatusOr<MemberInfo*> Live(const MemberKey& key);

  // A sign of life of `info` (a member of this table) at `now`, which is
  // never before the last one given.
  void Seen(MemberInfo* info, absl::Time now);

  // The newest sign of life of any member in the order (InfinitePast when
  // none). O(1).
  absl::Time LastSeen() const {
    return by_seen_.empty() ? absl::InfinitePast() : by_seen_.back()->last_seen;
  }
  // Whether members that are alive sit on two nodes or more. Stops at the
  // second node it finds.
  bool AliveOnTwoNodes() const;

  // Members whose last sign of life is older than `timeout` and whose state
  // is waiting, active or draining. Does not change them. O(members it
  // passes): it walks the order of last signs of life from the oldest,
  // dropping from that order the ended members it passes.
  std::vector<std::string> Expired(absl::Time now, absl::Duration timeout);

  // Drops ended (failed, left, finished) members beyond `keep` of them, the
  // oldest first, so that churn cannot grow the table without bound.
  void PruneEnded(size_t keep);

  const std::map<std::string, MemberInfo>& members() const { return members_; }
  // Calls fn(MemberInfo&) for every member, in id order. `fn` may change a
  // member's state and step; not its key, node or last sign of life.
  template <typename Fn>
  void ForEach(Fn fn) {
    for (auto& entry : members_) fn(entry.second);
  }
  size_t size() const { return members_.size(); }

 private:
  // Removes `it` from the table and from by_seen_.
  void Erase(std::map<std::string, MemberInfo>::iterator it);

  Limits limits_;
  std::map<std::string, MemberInfo> members_;
  // members_ by id, hashed (its keys are members_' own, which do not move):
  // Find at 100,000 members without a string comparison per tree level.
  absl::flat_hash_map<absl::string_view, MemberInfo*> index_;
  // Members by last sign of life, oldest first (map nodes do not move).
  std::list<MemberInfo*> by_seen_;
};

bool IsAlive(MemberState state);

}  // namespace muster

#endif  // MUSTER_COORDINATOR_MEMBERSHIP_H_
