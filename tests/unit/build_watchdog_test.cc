#include "trainer/elastic/build_watchdog.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>

#include "absl/time/clock.h"
#include "common/fake_clock.h"

namespace muster {
namespace {

// The watchdog's deadlines run on a FakeClock: the tests move time past
// them instead of waiting (the watchdog still looks every 100 ms).

// A watchdog destroyed before its deadline has watched (it asked whether a
// newer world exists) and then ends nothing, even once the deadline passes.
TEST(BuildWatchdogDeathTest, ABuildThatEndsInTimeChangesNothing) {
  EXPECT_EXIT(
      {
        FakeClock clock;
        std::atomic<int> asked{0};
        {
          BuildWatchdog w(
              clock.Now() + absl::Seconds(60),
              [&] {
                ++asked;
                return false;
              },
              absl::Seconds(10), &clock);
          while (asked == 0) absl::SleepFor(absl::Milliseconds(10));
        }
        clock.Advance(absl::Hours(1));  // long past the deadline
        absl::SleepFor(absl::Milliseconds(300));
        std::exit(asked > 0 ? 0 : 3);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(BuildWatchdogDeathTest, ExitsPastTheDeadline) {
  EXPECT_EXIT(
      {
        FakeClock clock;
        BuildWatchdog w(clock.Now() + absl::Seconds(120), [] { return false; },
                        absl::Seconds(10), &clock);
        clock.Advance(absl::Seconds(121));
        absl::SleepFor(absl::Seconds(10));  // it exits within 100 ms
      },
      ::testing::ExitedWithCode(BuildWatchdog::kExitCode), "past its deadline");
}

TEST(BuildWatchdogDeathTest, ExitsAGraceAfterANewerWorldIsKnown) {
  EXPECT_EXIT(
      {
        FakeClock clock;
        std::atomic<int> asked{0};
        BuildWatchdog w(
            clock.Now() + absl::Hours(1),
            [&] {
              ++asked;
              return true;
            },
            absl::Seconds(10), &clock);
        while (asked == 0) absl::SleepFor(absl::Milliseconds(10));
        absl::SleepFor(absl::Milliseconds(300));  // a few more looks: not yet
        clock.Advance(absl::Seconds(11));
        absl::SleepFor(absl::Seconds(10));
      },
      ::testing::ExitedWithCode(BuildWatchdog::kExitCode), "a newer world exists");
}

}  // namespace
}  // namespace muster
