// StepClock: the engine's three calls, and the program's time between
// them, charged to the phases step_timeline.h names.
#include "trainer/lib/step_timeline.h"

#include <gtest/gtest.h>

#include "common/fake_clock.h"

namespace muster {
namespace {

using Call = StepClock::Call;
using Part = StepClock::Part;
absl::Duration Ms(int ms) { return absl::Milliseconds(ms); }

// One step as the engine sees it: `boundary` ms in the ShouldStop that
// ends the step before it, then forward, BeforeBackward, backward,
// AfterBackward, optimizer (ms each).
void OneStep(FakeClock& clock, StepClock& steps, int boundary, int forward, int before,
             int backward, int after, int optimizer) {
  steps.Enter(Call::kShouldStop);
  clock.Advance(Ms(boundary));
  steps.Leave(Call::kShouldStop, /*step_begins=*/true);
  clock.Advance(Ms(forward));
  steps.Enter(Call::kBeforeBackward);
  clock.Advance(Ms(before));
  steps.Leave(Call::kBeforeBackward);
  clock.Advance(Ms(backward));
  steps.Enter(Call::kAfterBackward);
  clock.Advance(Ms(after));
  steps.Leave(Call::kAfterBackward);
  clock.Advance(Ms(optimizer));
}

TEST(StepClockTest, EachPhaseGetsItsOwnTimeAndTheFirstStepIsLeftOut) {
  FakeClock clock;
  StepClock steps(&clock);
  OneStep(clock, steps, 0, 500, 500, 500, 500, 500);  // the first: left out
  OneStep(clock, steps, 7, 10, 1, 20, 3, 5);          // its boundary: 7 ms
  OneStep(clock, steps, 7, 10, 1, 20, 3, 5);
  steps.Enter(Call::kShouldStop);
  clock.Advance(Ms(7));
  steps.Leave(Call::kShouldStop);  // the end: closes the last step
  const StepTimeline t = steps.Medians();
  EXPECT_EQ(t.steps, 2);
  EXPECT_DOUBLE_EQ(t.forward_ms, 10);
  EXPECT_DOUBLE_EQ(t.before_backward_ms, 1);
  EXPECT_DOUBLE_EQ(t.backward_ms, 20);
  EXPECT_DOUBLE_EQ(t.after_backward_ms, 3);
  EXPECT_DOUBLE_EQ(t.optimizer_ms, 5);
  EXPECT_DOUBLE_EQ(t.boundary_ms, 7);
  EXPECT_DOUBLE_EQ(t.step_ms, 46);
}

TEST(StepClockTest, PassesOfOneStepAddUpAndPartsAreCountedInTheirStep) {
  FakeClock clock;
  StepClock steps(&clock);
  OneStep(clock, steps, 0, 1, 1, 1, 1, 1);
  for (int step = 0; step < 3; ++step) {
    OneStep(clock, steps, 4, 10, 1, 20, 3, 5);
    steps.Add(Part::kReduce, Ms(15));
    // A second pass of the same step (a GAN's generator).
    steps.Enter(Call::kBeforeBackward);
    clock.Advance(Ms(2));
    steps.Leave(Call::kBeforeBackward);
    clock.Advance(Ms(30));
    steps.Enter(Call::kAfterBackward);
    clock.Advance(Ms(1));
    steps.Leave(Call::kAfterBackward);
    steps.Add(Part::kReduce, Ms(25));
    clock.Advance(Ms(6));
    steps.Add(Part::kGather, Ms(step == 1 ? 100 : 2));  // one slow gather
  }
  steps.Enter(Call::kShouldStop);
  clock.Advance(Ms(4));
  steps.Leave(Call::kShouldStop);
  const StepTimeline t = steps.Medians();
  EXPECT_EQ(t.steps, 3);
  EXPECT_DOUBLE_EQ(t.forward_ms, 10);
  EXPECT_DOUBLE_EQ(t.before_backward_ms, 3);
  EXPECT_DOUBLE_EQ(t.backward_ms, 50);
  EXPECT_DOUBLE_EQ(t.after_backward_ms, 4);
  EXPECT_DOUBLE_EQ(t.optimizer_ms, 11);  // the first pass's, the second's
  EXPECT_DOUBLE_EQ(t.reduce_ms, 40);
  EXPECT_DOUBLE_EQ(t.gather_ms, 2);  // the median, not the slow one
  EXPECT_DOUBLE_EQ(t.step_ms, 10 + 3 + 50 + 4 + 11 + 4);
}

TEST(StepClockTest, NothingIsMeasuredOutsideSteps) {
  FakeClock clock;
  StepClock steps(&clock);
  EXPECT_EQ(steps.Medians().steps, 0);
  // Calls before the first step (a ShouldStop that ends at once) and parts
  // reported outside a step count nowhere.
  steps.Add(Part::kReduce, Ms(5));
  steps.Enter(Call::kShouldStop);
  clock.Advance(Ms(9));
  steps.Leave(Call::kShouldStop);
  const StepTimeline t = steps.Medians();
  EXPECT_EQ(t.steps, 0);
  EXPECT_DOUBLE_EQ(t.step_ms, 0);
}

}  // namespace
}  // namespace muster
