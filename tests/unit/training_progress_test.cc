#include "trainer/client/training_progress.h"

#include <gtest/gtest.h>

#include "absl/time/clock.h"

namespace muster {
namespace {

// A heartbeat says 0 before training starts and while muster's own work
// blocks the thread; otherwise how long since the thread last made progress.
TEST(TrainingProgressTest, StallsGrowBetweenMarksAndNotWhileBusy) {
  TrainingProgress p;
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(p.stalled_ms(), 0u) << "stalled before the first mark";

  p.Mark();
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_GE(p.stalled_ms(), 50u);

  absl::Time left;
  {
    TrainingProgress::Busy busy(&p);
    absl::SleepFor(absl::Milliseconds(50));
    EXPECT_EQ(p.stalled_ms(), 0u) << "a blocking call counted as a stall";
    {
      TrainingProgress::Busy nested(&p);
    }
    EXPECT_EQ(p.stalled_ms(), 0u) << "the inner scope ended the outer one";
    left = absl::Now();
  }
  // Leaving the scope is progress.
  EXPECT_LE(p.stalled_ms(), absl::ToInt64Milliseconds(absl::Now() - left) + 1);
}

}  // namespace
}  // namespace muster
