// StepClock: where a trainer's steps spend their time, phase by phase, for
// Distributed::step_timeline() (include/muster/muster.h, StepTimeline).
//
// The engine calls Enter and Leave around each of its three calls
// (ShouldStop, BeforeBackward, AfterBackward). The time between two calls
// is the program's, named by the call that ended before it:
//
//   ShouldStop ─forward─> BeforeBackward ─backward─> AfterBackward ─optimizer─> ...
//
// and the time inside a call is the call's own (boundary, before_backward,
// after_backward). A step of several passes adds its passes' segments up.
// The communication thread's reduction time and the sharded all-gather are
// added with Add (they overlap or sit inside the segments above). A step
// runs from one ShouldStop that returns false to the next; the first step
// of the process is left out (it builds buffers and takes a world).
// Medians are over at most the last kKept steps.
//
// Not thread-safe: the training thread's.
#ifndef MUSTER_TRAINER_LIB_STEP_TIMELINE_H_
#define MUSTER_TRAINER_LIB_STEP_TIMELINE_H_

#include <array>
#include <cstdint>
#include <deque>

#include "absl/time/time.h"
#include "common/clock.h"
#include "muster/step_timeline.h"

namespace muster {

class StepClock {
 public:
  enum class Call { kShouldStop, kBeforeBackward, kAfterBackward };
  // Parts measured by others: added to the step in flight.
  enum class Part { kReduce, kGather };
  static constexpr size_t kKept = 4096;

  // `clock`: not owned.
  explicit StepClock(Clock* clock) : clock_(clock) {}

  void Enter(Call call);
  // `step_begins`: a ShouldStop that returned false (a step follows).
  void Leave(Call call, bool step_begins = false);
  void Add(Part part, absl::Duration d);

  StepTimeline Medians() const;

  // Enter on construction, Leave on destruction: a call with several
  // returns. ShouldStop says StepBegins() where it returns false.
  class Scope {
   public:
    Scope(StepClock* clock, Call call) : clock_(clock), call_(call) { clock_->Enter(call_); }
    ~Scope() { clock_->Leave(call_, step_begins_); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    void StepBegins() { step_begins_ = true; }

   private:
    StepClock* const clock_;
    const Call call_;
    bool step_begins_ = false;
  };

 private:
  // The fields of StepTimeline in this order, step_ms first.
  enum Field {
    kStep, kForward, kBeforeBackward, kBackward, kAfterBackward, kOptimizer, kBoundary,
    kReduceField, kGatherField, kFieldCount
  };
  using Times = std::array<double, kFieldCount>;  // milliseconds

  void Charge(Field f, absl::Duration d) { current_[f] += absl::ToDoubleMilliseconds(d); }

  Clock* const clock_;
  absl::Time entered_ = absl::InfinitePast();  // the call in progress began
  absl::Time left_ = absl::InfinitePast();     // the last call returned
  Field program_ = kFieldCount;  // what the program does since left_ (none before a step)
  bool in_step_ = false;
  int64_t steps_begun_ = 0;
  Times current_{};
  std::deque<Times> done_;
};

}  // namespace muster

#endif  // MUSTER_TRAINER_LIB_STEP_TIMELINE_H_
