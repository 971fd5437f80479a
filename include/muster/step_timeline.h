// muster::StepTimeline: where this rank's training steps spend their time
// (Distributed::step_timeline()).
#ifndef MUSTER_STEP_TIMELINE_H_
#define MUSTER_STEP_TIMELINE_H_

#include <cstdint>

namespace muster {

// Medians over the steps this rank trained (the last 4,096, the process's
// first step left out), in milliseconds. Each field is the median of its
// own phase, so the phases need not add up to the median step. A step runs
// from ShouldStop() returning false to the next ShouldStop() returning; in
// a step of several passes each field adds the step's passes up.
//
// Your program's time, between muster's calls:
//   forward_ms     ShouldStop() to BeforeBackward(): the batch, the forward
//   backward_ms    BeforeBackward() to AfterBackward(): the backward, which
//                  the gradients' reductions overlap
//   optimizer_ms   AfterBackward() to the next call: optimizer.step()
//                  (and, in a step of several passes, the next forward)
// muster's time, inside its calls:
//   before_backward_ms  BeforeBackward(): sharded state made or gathered
//   after_backward_ms   AfterBackward(): the wait for the reductions that
//                       backward did not hide, the averages installed
//   boundary_ms         ShouldStop(): the step boundary (buffers, state
//                       checks, the sharded parameters' all-gather,
//                       checkpoints, world changes)
// and two parts of those:
//   reduce_ms      the communication thread's time reducing gradients
//                  (overlaps backward_ms; the rest is in after_backward_ms)
//   gather_ms      the sharded parameters' all-gather (Options::
//                  shard_optimizer_state; inside boundary_ms)
struct StepTimeline {
  int64_t steps = 0;  // the steps measured; 0: the fields are 0
  double step_ms = 0;
  double forward_ms = 0;
  double before_backward_ms = 0;
  double backward_ms = 0;
  double after_backward_ms = 0;
  double optimizer_ms = 0;
  double boundary_ms = 0;
  double reduce_ms = 0;
  double gather_ms = 0;
};

}  // namespace muster

#endif  // MUSTER_STEP_TIMELINE_H_
