#include "trainer/client/training_progress.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "common/clock.h"
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

// Working reads the marked thread's CPU time: a thread that computes
// between muster's calls (an evaluation) is working, one that blocks (a
// deadlock, a frozen thread) is not. The thread here is real; its CPU
// time is what the heartbeat reads.
TEST(TrainingProgressTest, AThreadThatComputesIsWorkingAndOneThatBlocksIsNot) {
  RealClock clock;
  TrainingProgress p(&clock);
  EXPECT_FALSE(p.Working()) << "working before the first mark";
  std::atomic<int> phase{0};  // 0: compute, 1: block, 2: end
  std::atomic<bool> marked{false};
  std::thread training([&] {
    p.Mark();
    marked = true;
    volatile double x = 0;
    while (phase.load() == 0) x = x + 1;
    while (phase.load() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  });
  while (!marked.load()) std::this_thread::yield();
  EXPECT_FALSE(p.Working()) << "the first call has nothing to compare with";
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_TRUE(p.Working()) << "a thread that computes is not working";
  phase = 1;
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  p.Working();  // from here on it only blocks
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(p.Working()) << "a thread that sleeps is working";
  phase = 2;
  training.join();
}

}  // namespace
}  // namespace muster
