// GenerationState: the lifecycle of the job's current generation, as one
// named state machine. It owns the generation counter, the current world,
// which of the world's members have arrived at Rendezvous, and the deadline
// of a restarted coordinator's recovery; every change to them is one of the
// named transitions below. What a generation carries besides (its KV
// namespace and barriers, catalog entries, member states, sessions, events,
// the state file) stays with Coordinator, which acts on what a transition
// reports.
//
// Thread-safety: not thread-safe. Owned by Coordinator and used under its
// mutex.
//
// Phases, and the transition (method: event) that leads from one to another:
//
//                Adopted(g): a member reports a generation beyond the counter
//                Loaded(w): no stored world, only the counter, or a paused one
//                  +-----+
//                  |     v
//             +-------------+  Formed(w): enough members   +-------------+  Formed(w)
//   start --> |  kNoWorld   | ---------------------------> |  kForming   | <--+ Arrived(id):
//             +-------------+ <--------------------------- +-------------+ ---+ not the last
//                   ^          Paused(): below min_members     |     ^
//                   |                                          |     |
//                   |                   Arrived(id): the last  |     | Formed(w):
//                   |                   member is in           v     | a regroup
//                   |       Paused(): below min_members    +-------------+
//                   +------------------------------------- |  kRunning   |
//                                                          +-------------+
//                                                                 ^
//                               Recovered(): all stored members   |
//                               back, some replaced, or the       |
//                               reattach grace is over            |
//   start --Loaded(w): a stored world-->  +-------------+         |
//                                         | kRecovering | --------+
//                                         +-------------+
//
//   kForming, kRunning, kRecovering --Finished(): the world's last live
//       member finished--> kFinished (again in kFinished: a member outside
//       the world finished after the job did)
//   kForming, kRunning, kRecovering --Stopped(): every member of the world
//       stopped with the job--> kNoWorld, the world forgotten
//   every phase --ShuttingDown(): Coordinator::Shutdown--> kShuttingDown
//       (final)
//
// "start" is a new GenerationState: kNoWorld at generation 0. A transition
// from a phase not drawn above is refused with FAILED_PRECONDITION
// (ShuttingDown: false), one with a bad argument with the error its comment
// names; a refused transition changes nothing. The coordinator's own checks
// make a refusal a bug, which it logs.
//
// The world members train in (world_live()) is the current world in kForming,
// kRunning, kRecovering and kFinished; in kShuttingDown it is whatever it was
// before. In kNoWorld, world() is the last world (the paused one), or empty
// before the first and after a stop.
#ifndef MUSTER_COORDINATOR_GENERATION_STATE_H_
#define MUSTER_COORDINATOR_GENERATION_STATE_H_

#include <cstdint>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/types.h"

namespace muster {

enum class GenerationPhase {
  kNoWorld,       // no world members train in: before the first, or paused
  kForming,       // a world was formed; its members are arriving at Rendezvous
  kRunning,       // every member of the world arrived; training
  kRecovering,    // restarted: the stored world waits for its members
  kFinished,      // every member of the world finished; the job is over
  kShuttingDown,  // the coordinator stops; final
};
const char* GenerationPhaseName(GenerationPhase phase);

// The job's state as GetStatus, the metrics and `muster status` show it:
// kWaiting is kNoWorld, kRunning is kForming or kRunning, the others are
// their phase of the same name.
enum class JobState { kWaiting, kRunning, kRecovering, kFinished, kShuttingDown };
// "waiting", "running", "recovering", "finished", "shutting_down".
const char* JobStateName(JobState state);

class GenerationState {
 public:
  // The largest generation Adopted() takes, so that the next world's number
  // (the counter + 1) cannot wrap around to 0.
  static constexpr uint64_t kMaxAdoptedGeneration = uint64_t{1} << 62;

  // kNoWorld at generation 0, with no world.
  GenerationState() = default;
  GenerationState(const GenerationState&) = delete;
  GenerationState& operator=(const GenerationState&) = delete;

  // ---- transitions

  // The state file was read at start. A world with members (and a
  // generation > 0) becomes the current one: kRecovering until
  // `recover_deadline` or Recovered(). A paused world (World::paused) is
  // kept as the paused one, kNoWorld: nobody trained in it, so there is
  // nobody to wait for. Otherwise (no world, or a finished, stopped or
  // adopted job's counter) only its generation is kept: kNoWorld. Errors:
  // FAILED_PRECONDITION once a generation exists (Loaded comes first).
  absl::Status Loaded(World stored, absl::Time recover_deadline);

  // A member reports generation `generation` (its after_generation) beyond
  // the counter: the coordinator lost its state, and takes the number so
  // that generations never go backwards. Stays kNoWorld. Errors:
  // INVALID_ARGUMENT when `generation` is not beyond the counter, when a
  // world is live ("... is newer than the current generation"), or beyond
  // kMaxAdoptedGeneration; FAILED_PRECONDITION in kFinished, kShuttingDown.
  absl::Status Adopted(uint64_t generation);

  // `next` is the new current world (a regroup, or the first world):
  // kNoWorld, kForming or kRunning -> kForming, with no member arrived.
  // Errors: INVALID_ARGUMENT unless `next` has members and generation
  // generation() + 1; FAILED_PRECONDITION in kRecovering, kFinished,
  // kShuttingDown.
  absl::Status Formed(World next);

  // Member `id` of the forming world called Rendezvous with `step`; a
  // second call replaces its step. Returns true when it was the last to
  // arrive: each member's step is then its arrival's, the state source is
  // chosen, and the phase is kRunning. Errors: FAILED_PRECONDITION outside
  // kForming, NOT_FOUND when `id` is not in the world.
  absl::StatusOr<bool> Arrived(const std::string& id, int64_t step);
  // The same for the member at `rank` of the forming world, for a caller
  // that already found it (no lookup by id). Errors: FAILED_PRECONDITION
  // outside kForming, OUT_OF_RANGE when the world has no such rank.
  absl::StatusOr<bool> ArrivedAt(uint32_t rank, int64_t step);

  // Fewer than min_members remain: kForming or kRunning -> kNoWorld. The
  // world stays readable as world() (its members are told); arrivals are
  // forgotten. The coordinator stores it marked paused (World::paused).
  // Errors: FAILED_PRECONDITION in any other phase.
  absl::Status Paused();

  // Every member of the world stopped with the job (a checkpoint to stop,
  // a requeue): kForming, kRunning or kRecovering -> kNoWorld, and the
  // world is forgotten (world() is empty, at the same generation), so the
  // next world forms as a job's first does. Errors: FAILED_PRECONDITION in
  // any other phase.
  absl::Status Stopped();

  // The stored world's members are back, some were replaced, or the
  // reattach grace ended: kRecovering -> kRunning (the stored world was
  // complete). Errors: FAILED_PRECONDITION in any other phase.
  absl::Status Recovered();

  // Every member of the world finished: kForming, kRunning, kRecovering or
  // kFinished -> kFinished. Errors: FAILED_PRECONDITION in kNoWorld and
  // kShuttingDown.
  absl::Status Finished();

  // The coordinator shuts down: any phase -> kShuttingDown. Returns false
  // (and changes nothing) when it already was.
  bool ShuttingDown();

  // ---- queries

  GenerationPhase phase() const { return phase_; }
  JobState job_state() const;
  // The newest generation formed, loaded or adopted; 0 before any.
  uint64_t generation() const { return generation_; }
  // The newest world formed or loaded (see the top of this file).
  const World& world() const { return *world_; }
  // Whether world() is the world members train in (top of this file).
  bool world_live() const;
  // Every member of the live world arrived: kRunning or kRecovering.
  bool complete() const;
  // Whether `id` arrived in the forming world.
  bool has_arrived(const std::string& id) const;
  // Whether the member at `rank` arrived in the forming world.
  bool has_arrived_at(uint32_t rank) const {
    return rank < arrived_.size() && arrived_[rank].has_value();
  }
  // kRecovering and `now` is at or past the recovery deadline.
  bool RecoveryExpired(absl::Time now) const;

  // Whether calls of generation `generation` (KV, barriers, checkpoints)
  // are current: OK for the live world's generation; ABORTED for an older
  // one, or the current one while paused (redo the rendezvous);
  // FAILED_PRECONDITION for a generation that does not exist yet.
  absl::Status CheckGeneration(uint64_t generation) const;

  // world() shared, to be read after the lock is released: the world itself
  // until it changes again (a change then copies it first).
  std::shared_ptr<const World> Published() const { return world_; }

 private:
  World* MutableWorld();
  void ClearArrivals();

  GenerationPhase phase_ = GenerationPhase::kNoWorld;
  // The phase ShuttingDown() ended (meaningful in kShuttingDown).
  GenerationPhase before_shutdown_ = GenerationPhase::kNoWorld;
  uint64_t generation_ = 0;
  // Never null. Shared by Published(): changed in place only while no one
  // else holds it (MutableWorld).
  std::shared_ptr<World> world_ = std::make_shared<World>();
  // The forming world's members that called Rendezvous, by rank, with
  // their step; arrivals_ counts them (empty in every other phase).
  std::vector<std::optional<int64_t>> arrived_;
  uint32_t arrivals_ = 0;
  absl::Time recover_deadline_;
};

}  // namespace muster

#endif  // MUSTER_COORDINATOR_GENERATION_STATE_H_
