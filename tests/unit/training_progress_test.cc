#include "trainer/client/training_progress.h"

#include <gtest/gtest.h>

#include "common/fake_clock.h"

namespace muster {
namespace {

// A heartbeat says 0 before training starts and while muster's own work
// blocks the thread; otherwise how long since the thread last made progress.
TEST(TrainingProgressTest, StallsGrowBetweenMarksAndNotWhileBusy) {
  FakeClock clock;
  TrainingProgress p(&clock);
  clock.Advance(absl::Seconds(3));
  EXPECT_EQ(p.stalled_ms(), 0u) << "stalled before the first mark";

  p.Mark();
  clock.Advance(absl::Milliseconds(1500));
  EXPECT_EQ(p.stalled_ms(), 1500u);
  {
    TrainingProgress::Busy busy(&p);
    clock.Advance(absl::Seconds(30));
    EXPECT_EQ(p.stalled_ms(), 0u) << "a blocking call counted as a stall";
    {
      TrainingProgress::Busy nested(&p);
    }
    EXPECT_EQ(p.stalled_ms(), 0u) << "the inner scope ended the outer one";
    clock.Advance(absl::Seconds(5));
  }
  // Leaving the scope is progress.
  EXPECT_EQ(p.stalled_ms(), 0u);
  clock.Advance(absl::Milliseconds(250));
  EXPECT_EQ(p.stalled_ms(), 250u);
  p.Mark();
  EXPECT_EQ(p.stalled_ms(), 0u);
}

// A stall is monotonic time: a wall clock step is neither a stall nor
// progress.
TEST(TrainingProgressTest, AWallClockStepDoesNotMoveTheStall) {
  FakeClock clock;
  TrainingProgress p(&clock);
  p.Mark();
  clock.Advance(absl::Milliseconds(400));
  clock.StepWall(absl::Hours(1));
  EXPECT_EQ(p.stalled_ms(), 400u);
  clock.StepWall(-absl::Hours(2));
  EXPECT_EQ(p.stalled_ms(), 400u);
}

}  // namespace
}  // namespace muster
