// ArrivalDeadline (coordinator/arrival_deadline.h): set, due, clear; time is
// plain absl::Time values.
#include "coordinator/arrival_deadline.h"

#include <gtest/gtest.h>

#include "absl/time/time.h"

namespace muster {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1'000'000);

TEST(ArrivalDeadlineTest, StartsClear) {
  ArrivalDeadline d;
  EXPECT_FALSE(d.Due(kT0));
  EXPECT_FALSE(d.Due(kT0 + absl::Hours(24 * 365)));
  EXPECT_EQ(d.deadline(), absl::InfiniteFuture());
  EXPECT_EQ(d.window(), absl::ZeroDuration());
}

TEST(ArrivalDeadlineTest, DueFromFormedAtPlusTheWindow) {
  ArrivalDeadline d;
  d.Set(kT0, absl::Seconds(30));
  EXPECT_EQ(d.deadline(), kT0 + absl::Seconds(30));
  EXPECT_EQ(d.window(), absl::Seconds(30));
  EXPECT_FALSE(d.Due(kT0));
  EXPECT_FALSE(d.Due(kT0 + absl::Seconds(30) - absl::Milliseconds(1)));
  EXPECT_TRUE(d.Due(kT0 + absl::Seconds(30)));
  EXPECT_TRUE(d.Due(kT0 + absl::Seconds(31)));
}

TEST(ArrivalDeadlineTest, ClearIsNeverDueAndKeepsTheWindow) {
  ArrivalDeadline d;
  d.Set(kT0, absl::Seconds(30));
  d.Clear();
  EXPECT_FALSE(d.Due(kT0 + absl::Seconds(30)));
  EXPECT_FALSE(d.Due(kT0 + absl::Hours(1)));
  EXPECT_EQ(d.deadline(), absl::InfiniteFuture());
  // What fences the late members clears first, then names the window.
  EXPECT_EQ(d.window(), absl::Seconds(30));
}

TEST(ArrivalDeadlineTest, SetReplacesTheDeadline) {
  ArrivalDeadline d;
  d.Set(kT0, absl::Seconds(30));
  d.Set(kT0 + absl::Seconds(10), absl::Seconds(5));
  EXPECT_FALSE(d.Due(kT0 + absl::Seconds(14)));
  EXPECT_TRUE(d.Due(kT0 + absl::Seconds(15)));
  EXPECT_EQ(d.window(), absl::Seconds(5));
}

}  // namespace
}  // namespace muster
