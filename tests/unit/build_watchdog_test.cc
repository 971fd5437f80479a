#include "trainer/train/build_watchdog.h"

#include <gtest/gtest.h>

#include "absl/time/clock.h"

namespace muster {
namespace {

TEST(BuildWatchdogTest, ABuildThatEndsInTimeChangesNothing) {
  {
    BuildWatchdog w(absl::Now() + absl::Seconds(5), [] { return false; });
    absl::SleepFor(absl::Milliseconds(250));
  }
  SUCCEED();
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
