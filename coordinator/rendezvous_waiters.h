// RendezvousWaiters: the Rendezvous calls that wait for a world. A member
// that calls Rendezvous(after_generation) waits here until the first world
// of a later generation that holds it (same incarnation) completes, its
// deadline passes, it is fenced, fails or leaves, or the job ends. This
// class keeps the calls in the order they came and hands them out; the
// coordinator decides when, and answers each call it takes (every call
// taken from here is answered exactly once, by whoever took it).
//
// Time is passed in (the coordinator's monotonic clock_->Now()); nothing
// here reads a clock.
//
// Thread-safety: not thread-safe. Owned by Coordinator and used under its
// mutex; the callbacks are run by the coordinator after it releases the
// mutex, never by this class.
#ifndef MUSTER_COORDINATOR_RENDEZVOUS_WAITERS_H_
#define MUSTER_COORDINATOR_RENDEZVOUS_WAITERS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "coordinator/types.h"
#include "coordinator/world_delta.h"

namespace muster {

// A completed Rendezvous: the world and the caller's rank in it.
struct RendezvousResult {
  // Shared by every member's result (a world can hold thousands).
  std::shared_ptr<const World> world;
  uint32_t rank = 0;
  // Set when the caller was a member of the delta's base world: the answer
  // is the delta (the same for all of them), not the caller's assignment.
  std::shared_ptr<const WorldDelta> delta;
};

// One Rendezvous call waiting for a world.
struct RendezvousWaiter {
  using Callback = std::function<void(absl::StatusOr<RendezvousResult>)>;

  // Who called (a world answers only the incarnation it holds).
  MemberKey member;
  // The call waits for a world of a later generation than this.
  uint64_t after_generation = 0;
  // The member's step at the call: its step when it arrives in a world.
  int64_t step = 0;
  // When the call is answered DEADLINE_EXCEEDED (TakeExpired).
  absl::Time deadline;
  // Answers the call; moved out with the waiter when it is taken.
  Callback done;
  // The call takes a delta for an answer (RendezvousRequest.takes_delta).
  bool takes_delta = false;
  // The member's rank in the world that answers it: set by TakeAnsweredBy.
  // Before that, a caller that knows the member's rank in the forming world
  // may set it to spare the lookup by id (a rank whose member has another
  // id is looked up as if unset).
  int rank = -1;
};

class RendezvousWaiters {
 public:
  // No waiters; earliest_deadline() is InfiniteFuture.
  RendezvousWaiters() = default;
  RendezvousWaiters(const RendezvousWaiters&) = delete;
  RendezvousWaiters& operator=(const RendezvousWaiters&) = delete;

  // Adds `waiter` after every waiter already here (a member may wait more
  // than once: each call is its own waiter) and lowers earliest_deadline()
  // to its deadline when that is earlier. Never fails.
  void Add(RendezvousWaiter waiter);

  // Whether `world` answers `waiter`: the waiter's member is in `world` with
  // the same incarnation, and `world` is of a generation after the
  // waiter's after_generation.
  static bool Answers(const World& world, const RendezvousWaiter& waiter);

  // The waiters that `world` answers (Answers()), newest first, each with
  // its member's rank in `world`, left in place: the members that already
  // wait arrive in a world just formed, each with the step of its latest
  // call. The pointers are valid until the next call that adds or takes
  // waiters.
  std::vector<std::pair<const RendezvousWaiter*, uint32_t>> AnsweredBy(const World& world) const;

  // Removes and returns the waiters that `world` answers (Answers()),
  // oldest first, each with its rank in `world`: `world` just completed.
  // The others stay, in their order.
  std::vector<RendezvousWaiter> TakeAnsweredBy(const World& world);

  // Removes and returns every waiter whose deadline is at or before `now`,
  // oldest first, and recomputes earliest_deadline() from the ones left.
  // Returns nothing, without a scan, while `now` is before
  // earliest_deadline() (cheap enough to call on every Tick with 100,000
  // waiters).
  std::vector<RendezvousWaiter> TakeExpired(absl::Time now);

  // Removes and returns every waiter of member `id` (any incarnation),
  // oldest first: the member was fenced, failed, left or was drained.
  std::vector<RendezvousWaiter> TakeMember(const std::string& id);

  // Removes and returns every waiter, oldest first (the job finished, or
  // the coordinator stops); earliest_deadline() is InfiniteFuture again.
  std::vector<RendezvousWaiter> TakeAll();

  // The ids of the members that have at least one waiter, valid until the
  // waiters change.
  absl::flat_hash_set<absl::string_view> MemberIds() const;

  // How many waiters there are (a member waiting twice counts twice).
  size_t size() const { return waiters_.size(); }

  // No waiter's deadline is earlier than this; InfiniteFuture when there
  // never was one or after TakeAll(). Waiters taken by TakeAnsweredBy or
  // TakeMember may leave it too early (TakeExpired then scans and finds
  // nothing, and corrects it), never too late.
  absl::Time earliest_deadline() const { return earliest_deadline_; }

 private:
  // In the order they were added.
  std::list<RendezvousWaiter> waiters_;
  absl::Time earliest_deadline_ = absl::InfiniteFuture();
};

}  // namespace muster

#endif  // MUSTER_COORDINATOR_RENDEZVOUS_WAITERS_H_
