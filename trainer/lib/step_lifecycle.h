// StepLifecycle: where a trainer's engine stands in its step, and the only
// place that moves it (STYLE.md 16; the coordinator's GenerationState is
// its counterpart). The engine (engine.cc) asks it for each move; a
// move the diagram does not have is refused with FAILED_PRECONDITION naming
// the move and the state, and changes nothing.
//
//   kStarting ──Ready──> kReady ──Prepare──> kPrepared ──Backward──> kInBackward ◄─┐
//                          ▲  ▲                                        │  │ Backward │
//                          │  │ Dropped                         Reduced│  └──────────┘
//                          │  └──────────────── kFailed ◄──Fail───────┤
//                   Settle │                       │ Salvaged          ▼
//                          │                       └──────────> kBoundaryDue
//                     kAtBoundary ◄──────────Settle?──────────────────┘ (BeginBoundary)
//                          │ StepTaken (a regroup at the boundary took a salvaged step)
//                          └──────────────────────────> kBoundaryDue
//
//   NextPass: kBoundaryDue ──> kInBackward, another synchronised pass of the
//   same step (a step of several passes: State::modules).
//   StepTaken also from kStarting, kReady and kBoundaryDue (a joiner enters a
//   world that salvaged a step: its boundary is due). Prepare also from
//   kPrepared (a step the program skipped is prepared anew). From every state but kBroken:
//   End(outcome) ──> kEnded (finished, stopped, left; kEnded again replaces
//   the outcome), Break(error) ──> kBroken (the error is status() at once).
//
// Not thread-safe: the training thread's.
#ifndef MUSTER_TRAINER_LIB_STEP_LIFECYCLE_H_
#define MUSTER_TRAINER_LIB_STEP_LIFECYCLE_H_

#include <string>

#include "absl/status/status.h"

namespace muster {

enum class StepState {
  kStarting,      // Start: joining, entering the first world
  kReady,         // between steps, nothing due: ShouldStop prepares the next
  kPrepared,      // ShouldStop prepared a step (its batch and rates)
  kInBackward,    // BeforeBackward: the step's gradients reduce
  kFailed,        // the step's collective failed: regrouping, the step kept for salvage
  kBoundaryDue,   // a step was taken (reduced, salvaged, caught up); its boundary is due
  kAtBoundary,    // ShouldStop acts at the boundary (checkpoint, stop, regroup, ...)
  kEnded,         // finished, stopped or left: the outcome says which
  kBroken,        // an error ended the run: status()
};

const char* StepStateName(StepState s);

// What ended the run, in kEnded (Distributed::Outcome's values).
enum class StepOutcome { kFinished, kStopped, kLeft, kStoppedWithoutCheckpoint };

class StepLifecycle {
 public:
  StepState state() const { return state_; }
  absl::Status status() const { return status_; }
  // In kEnded.
  StepOutcome outcome() const { return outcome_; }
  bool ended() const { return state_ == StepState::kEnded; }
  bool over() const { return state_ == StepState::kEnded || state_ == StepState::kBroken; }

  absl::Status Ready();          // kStarting -> kReady
  absl::Status Prepare();        // kReady, kPrepared -> kPrepared
  absl::Status Backward();       // kPrepared, kInBackward -> kInBackward
  absl::Status NextPass();       // kBoundaryDue -> kInBackward
  absl::Status Reduced();        // kInBackward -> kBoundaryDue
  absl::Status Fail();           // kInBackward -> kFailed
  absl::Status Salvaged();       // kFailed -> kBoundaryDue
  absl::Status Dropped();        // kFailed -> kReady
  absl::Status StepTaken();      // kStarting, kReady, kAtBoundary, kBoundaryDue -> kBoundaryDue
  absl::Status BeginBoundary();  // kBoundaryDue -> kAtBoundary
  absl::Status Settle();         // kAtBoundary -> kReady
  absl::Status End(StepOutcome outcome);  // any but kBroken -> kEnded
  void Break(absl::Status error);         // any -> kBroken; an OK error is refused (no change)

  // A step taken by some ranks only: at its boundary the others take the
  // state from `rank` (-1: none due). Taken once.
  void CatchUpFrom(int rank) { catch_up_from_ = rank; }
  int TakeCatchUp() {
    const int r = catch_up_from_;
    catch_up_from_ = -1;
    return r;
  }

 private:
  absl::Status Move(const char* move, std::initializer_list<StepState> from, StepState to);

  StepState state_ = StepState::kStarting;
  StepOutcome outcome_ = StepOutcome::kFinished;
  absl::Status status_;
  int catch_up_from_ = -1;
};

}  // namespace muster

#endif  // MUSTER_TRAINER_LIB_STEP_LIFECYCLE_H_
