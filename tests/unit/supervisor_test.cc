#include "agent/supervisor.h"

#include <signal.h>

#include <gtest/gtest.h>

namespace muster {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1000);
const ProcessEnd kKilled{true, SIGKILL};

Supervisor Make(int slots, int max_restarts) {
  SupervisorOptions o;
  o.slots = slots;
  o.max_restarts = max_restarts;
  o.backoff_initial = absl::Seconds(1);
  o.backoff_max = absl::Seconds(3);
  Supervisor s(o);
  for (int i = 0; i < slots; ++i) s.Started(i, kT0);
  return s;
}

TEST(SupervisorTest, RestartsACrashWithExponentialBackoffThenGivesUp) {
  Supervisor s = Make(2, 3);
  ASSERT_TRUE(s.Ended(0, kKilled, kT0));
  EXPECT_EQ(s.RestartAt(0), kT0 + absl::Seconds(1));
  EXPECT_EQ(s.NextRestart(), kT0 + absl::Seconds(1));
  s.Started(0, kT0);
  ASSERT_TRUE(s.Ended(0, {false, 1}, kT0));
  EXPECT_EQ(s.RestartAt(0), kT0 + absl::Seconds(2));
  s.Started(0, kT0);
  ASSERT_TRUE(s.Ended(0, kKilled, kT0));
  EXPECT_EQ(s.RestartAt(0), kT0 + absl::Seconds(3));  // capped
  s.Started(0, kT0);
  EXPECT_FALSE(s.Ended(0, kKilled, kT0));
  EXPECT_EQ(s.state(0), Supervisor::State::kGaveUp);
  // The other trainer still runs; the agent is active and will exit 1.
  EXPECT_TRUE(s.Active());
  EXPECT_FALSE(s.Ended(1, {false, 0}, kT0));
  EXPECT_FALSE(s.Active());
  EXPECT_EQ(s.ExitCode(), 1);
  EXPECT_NE(s.Summary().find("trainer 0: gave up after 3 restarts"), std::string::npos)
      << s.Summary();
}

TEST(SupervisorTest, FinishedStoppedAndBadFlagsAreNotRestarted) {
  Supervisor s = Make(3, 5);
  EXPECT_FALSE(s.Ended(0, {false, 0}, kT0));
  EXPECT_FALSE(s.Ended(1, {false, kExitStoppedBySignal}, kT0));
  EXPECT_EQ(s.state(1), Supervisor::State::kDone);
  EXPECT_FALSE(s.Ended(2, {false, kExitBadFlags}, kT0));
  EXPECT_EQ(s.state(2), Supervisor::State::kGaveUp);
  EXPECT_EQ(s.ExitCode(), 1);
}

TEST(SupervisorTest, StoppedAfterACheckpointExits75) {
  Supervisor s = Make(2, 1);
  s.Ended(0, {false, kExitStoppedBySignal}, kT0);
  s.Ended(1, {false, 0}, kT0);
  EXPECT_EQ(s.ExitCode(), kExitStoppedBySignal);
}

// A trainer whose options are wrong (the library's INVALID_ARGUMENT, exit
// 78) fails the same way every time: the slot gives up at once.
TEST(SupervisorTest, AConfigurationErrorIsNotRestarted) {
  Supervisor s = Make(2, 3);
  EXPECT_FALSE(s.Ended(0, {false, kExitConfig}, kT0));
  EXPECT_EQ(s.state(0), Supervisor::State::kGaveUp);
  EXPECT_EQ(s.restarts(0), 0);
  EXPECT_TRUE(s.Ended(1, {false, 1}, kT0));  // another error is restarted
}

// A trainer that stopped without a committed checkpoint is done, and the
// agent says steps were lost (74), even when another stopped after one.
TEST(SupervisorTest, StoppedWithoutACheckpointIsDoneAndExits74) {
  Supervisor s = Make(2, 3);
  EXPECT_FALSE(s.Ended(0, {false, kExitStoppedWithoutCheckpoint}, kT0));
  EXPECT_EQ(s.state(0), Supervisor::State::kDone);
  EXPECT_FALSE(s.Ended(1, {false, kExitStoppedBySignal}, kT0));
  EXPECT_EQ(s.ExitCode(), kExitStoppedWithoutCheckpoint);
}

TEST(SupervisorTest, NothingRestartsOnceStopping) {
  Supervisor s = Make(2, 3);
  ASSERT_TRUE(s.Ended(0, kKilled, kT0));
  s.Stop();
  EXPECT_EQ(s.state(0), Supervisor::State::kDone);  // the pending restart is cancelled
  // Killed by the forwarded SIGTERM while starting up: not an error.
  EXPECT_FALSE(s.Ended(1, {true, SIGTERM}, kT0));
  EXPECT_FALSE(s.Active());
  EXPECT_EQ(s.ExitCode(), 128 + SIGKILL);  // slot 0's crash still counts
  Supervisor t = Make(1, 3);
  t.Stop();
  t.Ended(0, {true, SIGTERM}, kT0);
  EXPECT_EQ(t.ExitCode(), 0);
}

}  // namespace
}  // namespace muster
