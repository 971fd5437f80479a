// CollectiveDeadline: a fixed timeout, the cold one until steps are timed,
// then a multiple of the slowest recent step with a floor.
#include "trainer/elastic/collective_deadline.h"

#include <gtest/gtest.h>

namespace muster {
namespace {

TEST(CollectiveDeadlineTest, AFixedTimeoutIsUsedAsItIs) {
  CollectiveDeadline d({/*fixed=*/absl::Seconds(2)});
  EXPECT_EQ(d.Current(), absl::Seconds(2));
  d.StepTook(absl::Seconds(30));
  EXPECT_EQ(d.Current(), absl::Seconds(2));
  EXPECT_EQ(d.Long(), absl::Seconds(120));  // builds and state transfers
  CollectiveDeadline slow({/*fixed=*/absl::Seconds(600)});
  EXPECT_EQ(slow.Long(), absl::Seconds(600));
}

TEST(CollectiveDeadlineTest, FollowsTheSlowestRecentStepWithAFloor) {
  CollectiveDeadline d(CollectiveDeadlineOptions{});
  // The first step has no boundary before it; then steps are timed.
  EXPECT_FALSE(d.TakeTiming());
  EXPECT_TRUE(d.TakeTiming());
  EXPECT_EQ(d.Current(), absl::Seconds(120));  // cold: nothing timed yet
  d.StepTook(absl::Milliseconds(100));
  d.StepTook(absl::Milliseconds(300));
  EXPECT_EQ(d.Current(), absl::Seconds(120));  // still warming up
  d.StepTook(absl::Milliseconds(200));
  EXPECT_EQ(d.Current(), absl::Seconds(10));  // 10 x 0.3 s is below the floor
  d.StepTook(absl::Seconds(2));
  EXPECT_EQ(d.Current(), absl::Seconds(20));
  EXPECT_EQ(d.Long(), absl::Seconds(120));
  for (int i = 0; i < 20; ++i) d.StepTook(absl::Milliseconds(100));
  EXPECT_EQ(d.Current(), absl::Seconds(10));  // the slow step left the window
}

TEST(CollectiveDeadlineTest, AStepAfterARegroupIsNotTimed) {
  CollectiveDeadline d(CollectiveDeadlineOptions{});
  d.TakeTiming();
  EXPECT_TRUE(d.TakeTiming());
  d.Forget();
  EXPECT_FALSE(d.TakeTiming());
  EXPECT_TRUE(d.TakeTiming());
}

}  // namespace
}  // namespace muster
