// CollectiveDeadline: how long this trainer's collectives may wait for their
// peers before the world counts as broken (a peer hung in compute, a link
// that went silent) and is reported to the coordinator.
//
// A fixed timeout (Options::collective_timeout_s > 0) is used as it is.
// Otherwise the deadline follows the job: `multiple` times the slowest of
// the last `window` steps, never below `floor`. Until `warm_steps` steps
// have been timed (the first steps of a process: allocator warm-up, lazy
// initialisation, a first checkpoint) it is `cold`, as it is for the
// long waits of a regroup (building a communicator, the state transfer).
// Steps that included a regroup are not timed (Forget).
//
// Pure: no clock (the caller times the steps), no I/O. Not thread-safe:
// the training thread owns it.
#ifndef MUSTER_TRAINER_ELASTIC_COLLECTIVE_DEADLINE_H_
#define MUSTER_TRAINER_ELASTIC_COLLECTIVE_DEADLINE_H_

#include <deque>

#include "absl/time/time.h"

namespace muster {

struct CollectiveDeadlineOptions {
  absl::Duration fixed = absl::ZeroDuration();  // > 0: always this
  absl::Duration cold = absl::Seconds(120);
  absl::Duration floor = absl::Seconds(10);
  double multiple = 10;
  int window = 20;
  int warm_steps = 3;
};

class CollectiveDeadline {
 public:
  explicit CollectiveDeadline(CollectiveDeadlineOptions options) : options_(options) {}

  // A step committed `took` after the previous one (boundary to boundary).
  void StepTook(absl::Duration took);
  // The next step's time is not a step's alone (a regroup came between):
  // it is not timed. The steps timed so far are kept.
  void Forget() { skip_next_ = true; }
  // Whether StepTook should be called for the step that just committed;
  // clears the mark Forget set.
  bool TakeTiming();

  // The deadline of a step's collectives.
  absl::Duration Current() const;
  // The deadline of a regroup's long waits: at least `cold`.
  absl::Duration Long() const;
  // How many steps were timed (at most `window` are kept).
  int timed() const { return timed_; }

 private:
  const CollectiveDeadlineOptions options_;
  std::deque<absl::Duration> recent_;
  int timed_ = 0;
  bool skip_next_ = true;  // the first step has no previous boundary
};

}  // namespace muster

#endif  // MUSTER_TRAINER_ELASTIC_COLLECTIVE_DEADLINE_H_
