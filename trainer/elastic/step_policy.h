// StepPolicy: what every rank does at a step boundary, decided from the
// control words that rode the step's gradient all-reduce. Every rank sees
// the same sums, so every rank takes the same decision after the same step,
// with no extra round trip.
//
//   words in:  stop    (this rank got SIGUSR1, or stop_after_step was reached)
//              finish  (the program asked this rank to end the job as finished)
//              leave   (this rank got SIGTERM, or the coordinator drains it)
//              newer   (this rank heard of a newer generation: a join or leave)
//              checkpoint  (this rank's clock says a checkpoint by time is due)
//
//   kFinish    some rank is asked to finish (early stopping): the job ends
//              as if its steps were done, even where a stop or leave is asked
//   kStop      some rank is told to stop, or every rank is leaving at once
//              (a whole job preempted): checkpoint, then end with kStopped
//   kLeave     this rank leaves; the others regroup without it
//   kRegroup   someone leaves or a newer world exists: all enter it
//   kContinue  nothing to do
//
// Pure: no state, no I/O; thread-safe.
#ifndef MUSTER_TRAINER_ELASTIC_STEP_POLICY_H_
#define MUSTER_TRAINER_ELASTIC_STEP_POLICY_H_

#include <array>

namespace muster {

enum class StepDecision { kContinue, kFinish, kStop, kLeave, kRegroup };

inline constexpr int kControlWordCount = 5;
using ControlArray = std::array<float, kControlWordCount>;

// This rank's words, as GradientSync carries them (0 or 1 each).
struct ControlWords {
  bool stop = false;
  bool leave = false;
  bool newer_world = false;
  bool checkpoint_due = false;
  bool finish = false;
  ControlArray ToArray() const;
};

// `averages`: GradientSync::control() after a successful step; `world`: its
// size; `mine`: what this rank sent; `drained`: the coordinator told this
// rank to leave (not a signal).
StepDecision DecideAfterStep(const ControlArray& averages, int world, const ControlWords& mine,
                             bool drained);
// Whether any rank's clock said a checkpoint by time was due when the step
// began: every rank then checkpoints after this same step (each rank's own
// clock alone would part them, one in the checkpoint's collectives and
// another in the next step's).
bool CheckpointDueOnAnyRank(const ControlArray& averages);
// How many of the `world` ranks asked to leave after the step.
int RanksLeaving(const ControlArray& averages, int world);

}  // namespace muster

#endif  // MUSTER_TRAINER_ELASTIC_STEP_POLICY_H_
