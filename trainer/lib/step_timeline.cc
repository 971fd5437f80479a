#include "trainer/lib/step_timeline.h"

#include <algorithm>
#include <vector>

namespace muster {

void StepClock::Enter(Call) {
  const absl::Time now = clock_->Now();
  if (in_step_ && program_ != kFieldCount) Charge(program_, now - left_);
  entered_ = now;
}

void StepClock::Leave(Call call, bool step_begins) {
  const absl::Time now = clock_->Now();
  if (in_step_) {
    switch (call) {
      case Call::kShouldStop: Charge(kBoundary, now - entered_); break;
      case Call::kBeforeBackward: Charge(kBeforeBackward, now - entered_); break;
      case Call::kAfterBackward: Charge(kAfterBackward, now - entered_); break;
    }
  }
  left_ = now;
  switch (call) {
    case Call::kBeforeBackward: program_ = kBackward; return;
    case Call::kAfterBackward: program_ = kOptimizer; return;
    case Call::kShouldStop: break;
  }
  if (in_step_) {
    double step = 0;
    for (int f = kForward; f <= kBoundary; ++f) step += current_[f];
    current_[kStep] = step;
    // The process's first step builds buffers and enters a world.
    if (steps_begun_ > 1) {
      done_.push_back(current_);
      if (done_.size() > kKept) done_.pop_front();
    }
  }
  current_ = {};
  in_step_ = step_begins;
  if (step_begins) ++steps_begun_;
  program_ = step_begins ? kForward : kFieldCount;
}

void StepClock::Add(Part part, absl::Duration d) {
  if (in_step_) Charge(part == Part::kReduce ? kReduceField : kGatherField, d);
}

StepTimeline StepClock::Medians() const {
  std::array<double, kFieldCount> median{};
  std::vector<double> values(done_.size());
  for (int f = 0; f < kFieldCount; ++f) {
    for (size_t i = 0; i < done_.size(); ++i) values[i] = done_[i][f];
    if (values.empty()) break;
    auto middle = values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2);
    std::nth_element(values.begin(), middle, values.end());
    median[f] = *middle;
  }
  StepTimeline t;
  t.steps = static_cast<int64_t>(done_.size());
  t.step_ms = median[kStep];
  t.forward_ms = median[kForward];
  t.before_backward_ms = median[kBeforeBackward];
  t.backward_ms = median[kBackward];
  t.after_backward_ms = median[kAfterBackward];
  t.optimizer_ms = median[kOptimizer];
  t.boundary_ms = median[kBoundary];
  t.reduce_ms = median[kReduceField];
  t.gather_ms = median[kGatherField];
  return t;
}

}  // namespace muster
