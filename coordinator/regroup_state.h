// RegroupState: how the coordinator's regroups stand, as one named state
// machine beside GenerationState. GenerationState owns the generation
// counter, the current world and who of it arrived; RegroupState owns what
// forming and completing a world needs besides: the last-call window before
// a world forms (RendezvousTimer), the Rendezvous calls that wait for a
// world (RendezvousWaiters), when the forming world formed and, after a
// broken-world report, by when its members must arrive (ArrivalDeadline),
// when the job paused, and the last completed world with the delta it is
// told as (world_delta.h). It decides; the coordinator acts on what a
// transition returns (state-file writes, events, pushes, answers).
//
// Time is passed in (the coordinator's monotonic clock_->Now()); nothing
// here reads a clock.
//
// Thread-safety: not thread-safe. Owned by Coordinator and used under its
// mutex; the waiters' callbacks are run by the coordinator after it releases
// the mutex, never by this class.
//
// Stages, and the transition (method: event) that leads from one to another:
//
//           +---------+  Formed(now): a world    +-----------+
// start --> |  kIdle  | -----------------------> | kForming  | ------------------+
//           +---------+  formed (the first,      +-----------+                   |
//                        or a regroup)             |       ^                     |
//   ArriveWithin(w): it formed after a broken-     |       | ArrivalMissed():    | Completed(world,
//   world report; its members must arrive by       |       | the deadline passed | now): its last
//   formed_at + w                                  v       |                     | member arrived
//                                        +--------------------+                  v
//                                        | kFormingByDeadline | --------> +-------------+
//                                        +--------------------+           | kCompleted  |
//                                             Completed(world, now)       +-------------+
//
//   every stage --Formed(now)--> kForming (again in kForming: it formed
//       again; a running arrival deadline and last call are dropped)
//   kFormingByDeadline --ArrivalExtended(now): the late members are
//       waited for--> kFormingByDeadline (by now + the same window)
//   every stage --Paused(now): below min_members--> kPaused
//
// "start" is a new RegroupState: kIdle, no waiters, no completed world. A
// coordinator that recovers a stored world after a restart runs it in kIdle
// until its first regroup or pause. A transition from a stage not drawn
// above is refused with FAILED_PRECONDITION and changes nothing; the
// coordinator's own checks make a refusal a bug, which it logs.
//
// The stage follows the regroups only: the job's phase is GenerationState's,
// which the coordinator consults first (a world that finishes, or a
// coordinator that shuts down, while a world forms leaves it kForming here).
// The completed world and its delta are kept until the next Completed():
// through a pause too, so the world that forms after it is still told as the
// change from the one its members hold.
#ifndef MUSTER_COORDINATOR_REGROUP_STATE_H_
#define MUSTER_COORDINATOR_REGROUP_STATE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/arrival_deadline.h"
#include "coordinator/rendezvous.h"
#include "coordinator/rendezvous_waiters.h"
#include "coordinator/types.h"
#include "coordinator/world_delta.h"

namespace muster {

enum class RegroupStage {
  kIdle,                // no world formed and no pause since this coordinator started
  kForming,             // a world formed at formed_at(); its members are arriving
  kFormingByDeadline,   // as kForming, and its members must arrive by arrival_deadline()
  kCompleted,           // the last world formed completed: it is completed()
  kPaused,              // the job paused below min_members at paused_since()
};
const char* RegroupStageName(RegroupStage stage);

// Rendezvous calls with their answers, to be run after the lock.
using RendezvousAnswers = std::vector<std::pair<RendezvousWaiter::Callback, RendezvousResult>>;

// What Completed() decided.
struct RegroupCompletion {
  // From Formed() to Completed(): how long the regroup took.
  absl::Duration took;
  // The calls the completed world answers (RendezvousWaiters::
  // TakeAnsweredBy), oldest first, each with its answer (ResultFor).
  RendezvousAnswers answers;
};

class RegroupState {
 public:
  // kIdle; the last-call window follows `rules`.
  explicit RegroupState(const RendezvousRules& rules) : timer_(rules) {}
  RegroupState(const RegroupState&) = delete;
  RegroupState& operator=(const RegroupState&) = delete;

  // ---- transitions

  // A world formed at `now` (GenerationState::Formed took it): any stage ->
  // kForming. Forgets the last-call window, any arrival deadline and the
  // pause. Never fails.
  void Formed(absl::Time now);

  // The world just formed came from a broken-world report: its members must
  // arrive by formed_at() + `window` (ArrivalDue). kForming ->
  // kFormingByDeadline. Errors: FAILED_PRECONDITION in any other stage (a
  // second deadline for one world included).
  absl::Status ArriveWithin(absl::Duration window);

  // The arrival deadline passed (ArrivalDue); the coordinator fences the
  // members that have not arrived. kFormingByDeadline -> kForming; returns
  // the window the members had. Errors: FAILED_PRECONDITION in any other
  // stage.
  absl::StatusOr<absl::Duration> ArrivalMissed();

  // The arrival deadline passed (ArrivalDue), and the members that have
  // not arrived are waited for: they must arrive by `now` + the same
  // window. kFormingByDeadline -> kFormingByDeadline. Errors:
  // FAILED_PRECONDITION in any other stage.
  absl::Status ArrivalExtended(absl::Time now);

  // The last member of `world`, the forming world, arrived at `now`:
  // kForming or kFormingByDeadline -> kCompleted. `world` becomes
  // completed(); the one completed before becomes delta_base(), and delta()
  // is `world` as the change from it (null when there was none, or `world`
  // is not such a change: MakeWorldDelta). Takes the waiters that `world`
  // answers and returns them with their answers (ResultFor), and how long
  // the regroup took. Errors: FAILED_PRECONDITION in any other stage,
  // INVALID_ARGUMENT when `world` is null; nothing changes then.
  absl::StatusOr<RegroupCompletion> Completed(std::shared_ptr<const World> world,
                                              absl::Time now);

  // Fewer than min_members remain (GenerationState::Paused took it): any
  // stage -> kPaused, since `now`. Drops any arrival deadline; the completed
  // world and its delta stay. Never fails.
  void Paused(absl::Time now);

  // Whether to form a world now (RendezvousTimer::Decide, which opens and
  // ends the last-call window; Formed() forgets it).
  FormDecision Decide(uint32_t candidates, uint32_t preferred, bool changed, bool urgent,
                      absl::Time now, bool first_world) {
    return timer_.Decide(candidates, preferred, changed, urgent, now, first_world);
  }

  // ---- queries

  RegroupStage stage() const { return stage_; }
  // When the last world formed; absl::Time() before the first.
  absl::Time formed_at() const { return formed_at_; }
  // When the job paused, in kPaused; InfiniteFuture in every other stage.
  absl::Time paused_since() const { return paused_since_; }
  // In kFormingByDeadline: formed_at() + the window; InfiniteFuture
  // otherwise.
  absl::Time arrival_deadline() const { return arrival_.deadline(); }
  // Whether the forming world's arrival deadline is at or before `now`
  // (never outside kFormingByDeadline).
  bool ArrivalDue(absl::Time now) const { return arrival_.Due(now); }
  // The window of the last arrival deadline (ArriveWithin).
  absl::Duration arrival_window() const { return arrival_.window(); }
  // When the running last-call window ends, if one runs.
  std::optional<absl::Time> last_call_ends() const { return timer_.deadline(); }

  // The last completed world (what its members hold), the one completed
  // before it, and the last as the change from that one; each null until
  // there is one (after a restart, until a world completes here).
  const std::shared_ptr<const World>& completed() const { return completed_; }
  const std::shared_ptr<const World>& delta_base() const { return delta_base_; }
  const std::shared_ptr<const WorldDelta>& delta() const { return delta_; }

  // The answer for `key` at `rank` of `world`: the delta when the call
  // takes one (`takes_delta`), `world` is completed(), and `key` (same
  // incarnation) held the base rank that the delta maps `rank` to in
  // delta_base(); otherwise `world` and `rank` alone.
  RendezvousResult ResultFor(const MemberKey& key, std::shared_ptr<const World> world,
                             uint32_t rank, bool takes_delta) const;

  // The Rendezvous calls waiting for a world (rendezvous_waiters.h): the
  // coordinator adds them and takes those that end otherwise (deadline,
  // fence, leave, shutdown); Completed() takes those a world answers.
  RendezvousWaiters& waiters() { return waiters_; }
  const RendezvousWaiters& waiters() const { return waiters_; }

 private:
  RegroupStage stage_ = RegroupStage::kIdle;
  RendezvousTimer timer_;
  RendezvousWaiters waiters_;
  absl::Time formed_at_;
  absl::Time paused_since_ = absl::InfiniteFuture();
  // Set in kFormingByDeadline only.
  ArrivalDeadline arrival_;
  std::shared_ptr<const World> completed_;
  std::shared_ptr<const World> delta_base_;
  std::shared_ptr<const WorldDelta> delta_;
};

}  // namespace muster

#endif  // MUSTER_COORDINATOR_REGROUP_STATE_H_
