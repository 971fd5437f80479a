#include "trainer/elastic/build_watchdog.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>

#include "absl/time/clock.h"

namespace muster {
namespace {

// A watchdog destroyed before its deadline has watched (it asked whether a
// newer world exists) and then ends nothing, even once the deadline passes.
TEST(BuildWatchdogDeathTest, ABuildThatEndsInTimeChangesNothing) {
  EXPECT_EXIT(
      {
        std::atomic<int> asked{0};
        {
          BuildWatchdog w(absl::Now() + absl::Seconds(1), [&] {
            ++asked;
            return false;
          });
          absl::SleepFor(absl::Milliseconds(500));
        }
        absl::SleepFor(absl::Milliseconds(1500));  // past the deadline
        std::exit(asked > 0 ? 0 : 3);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(BuildWatchdogDeathTest, ExitsPastTheDeadline) {
  EXPECT_EXIT(
      {
        BuildWatchdog w(absl::Now() + absl::Milliseconds(200), [] { return false; });
        absl::SleepFor(absl::Seconds(10));
      },
      ::testing::ExitedWithCode(BuildWatchdog::kExitCode), "past its deadline");
}

TEST(BuildWatchdogDeathTest, ExitsSoonAfterANewerWorldIsKnown) {
  EXPECT_EXIT(
      {
        BuildWatchdog w(absl::Now() + absl::Seconds(60), [] { return true; },
                        absl::Milliseconds(300));
        absl::SleepFor(absl::Seconds(10));
      },
      ::testing::ExitedWithCode(BuildWatchdog::kExitCode), "a newer world exists");
}

}  // namespace
}  // namespace muster
