// Waits measured on the monotonic clock (common/monotonic_wait.h, and
// common/mutex.h's CondVar): they end
// on their condition at once, and on their timeout by the clock they are
// given, not by the wall clock absl's timed waits follow.
#include "common/monotonic_wait.h"

#include <gtest/gtest.h>

#include <thread>

#include "common/fake_clock.h"
#include "common/mutex.h"

namespace muster {
namespace {

TEST(MonotonicWaitTest, SleepUnlessNotifiedEndsEarlyOnlyWhenNotified) {
  absl::Notification stop;
  const absl::Time start = RealClock::Get()->Now();
  EXPECT_FALSE(SleepUnlessNotified(stop, absl::Milliseconds(50)));
  EXPECT_GE(RealClock::Get()->Now() - start, absl::Milliseconds(50));
  std::thread notifier([&] {
    absl::SleepFor(absl::Milliseconds(20));
    stop.Notify();
  });
  const absl::Time again = RealClock::Get()->Now();
  EXPECT_TRUE(SleepUnlessNotified(stop, absl::Seconds(30)));
  EXPECT_LT(RealClock::Get()->Now() - again, absl::Seconds(5));
  notifier.join();
}

TEST(MonotonicWaitTest, AwaitForReturnsWhenTheConditionHolds) {
  absl::Mutex mu;
  bool ready = false;
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(20));
    absl::MutexLock lock(&mu);
    ready = true;
  });
  FakeClock clock;  // never advances: only the condition can end the wait
  {
    absl::MutexLock lock(&mu);
    EXPECT_TRUE(AwaitFor(&mu, absl::Condition(&ready), absl::Seconds(1), &clock));
    EXPECT_TRUE(ready);
  }
  setter.join();
}

// The timeout is the given clock's: a fake one that moves past it ends the
// wait, though little real time passed and the wall reading stepped back.
TEST(MonotonicWaitTest, AwaitForTimesOutOnItsClock) {
  absl::Mutex mu;
  bool never = false;
  FakeClock clock;
  std::thread mover([&] {
    absl::SleepFor(absl::Milliseconds(30));
    clock.StepWall(-absl::Minutes(1));
    clock.Advance(absl::Seconds(61));
  });
  const absl::Time start = RealClock::Get()->Now();
  {
    absl::MutexLock lock(&mu);
    EXPECT_FALSE(AwaitFor(&mu, absl::Condition(&never), absl::Minutes(1), &clock));
  }
  EXPECT_LT(RealClock::Get()->Now() - start, absl::Seconds(10));
  mover.join();
}

// A poker makes an untimed Await notice a deadline of its condition.
TEST(MonotonicWaitTest, AMutexPokerWakesAnUntimedAwaitAtItsDeadline) {
  absl::Mutex mu;
  FakeClock clock;
  const absl::Time deadline = clock.Now() + absl::Seconds(5);
  std::thread mover([&] {
    absl::SleepFor(absl::Milliseconds(30));
    clock.Advance(absl::Seconds(5));
  });
  {
    MutexPoker poker(&mu, absl::Milliseconds(5));
    absl::MutexLock lock(&mu);
    auto due = [&] { return clock.Now() >= deadline; };
    mu.Await(absl::Condition(&due));
  }
  EXPECT_GE(clock.Now(), deadline);
  mover.join();
}

// CondVar::WaitFor says whether it was woken or timed out, and a timeout
// lasts at least its duration on the monotonic clock.
TEST(CondVarTest, WaitForTimesOutAfterItsDuration) {
  Mutex mu;
  CondVar cv;
  const absl::Time start = RealClock::Get()->Now();
  bool woken;
  {
    MutexLock lock(&mu);
    woken = cv.WaitFor(&mu, absl::Milliseconds(50));
  }
  EXPECT_GE(RealClock::Get()->Now() - start, absl::Milliseconds(50));
  // A spurious wake-up would be true too; with nobody notifying, it is rare
  // enough that false is what a timeout shows.
  EXPECT_FALSE(woken);
}

TEST(CondVarTest, ANotifyEndsWaitsWithTheMutexHeldAgain) {
  Mutex mu;
  CondVar cv;
  bool ready = false;  // guarded by mu
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(20));
    MutexLock lock(&mu);
    ready = true;
    cv.NotifyAll();
  });
  const absl::Time start = RealClock::Get()->Now();
  {
    MutexLock lock(&mu);
    // An infinite duration is an untimed wait, not an overflowed deadline.
    while (!ready) cv.WaitFor(&mu, absl::InfiniteDuration());
    EXPECT_TRUE(ready);
    // Held again: Unlock and Lock within the scope keep the lock balanced.
    lock.Unlock();
    lock.Lock();
  }
  EXPECT_LT(RealClock::Get()->Now() - start, absl::Seconds(10));
  setter.join();
  // Released by the scope: another thread can take it.
  std::thread taker([&] { MutexLock lock(&mu); });
  taker.join();
}

}  // namespace
}  // namespace muster
