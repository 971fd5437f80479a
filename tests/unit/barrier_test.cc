#include "coordinator/barrier.h"

#include <gtest/gtest.h>

namespace muster {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1000);

TEST(BarriersTest, ReleasesWhenAllArriveAndStaysReleased) {
  Barriers b;
  std::vector<absl::Status> done;
  auto record = [&](absl::Status s) { done.push_back(s); };
  {
    Actions a;
    b.Arrive("init", "m0", 3, kT0 + absl::Seconds(5), record, &a);
    b.Arrive("init", "m1", 3, kT0 + absl::Seconds(5), record, &a);
    b.Arrive("init", "m1", 3, kT0 + absl::Seconds(5), record, &a);  // retry counts once
  }
  EXPECT_TRUE(done.empty());
  {
    Actions a;
    b.Arrive("init", "m2", 3, kT0 + absl::Seconds(5), record, &a);
  }
  ASSERT_EQ(done.size(), 4u);
  for (const auto& s : done) EXPECT_TRUE(s.ok());
  {
    Actions a;
    b.Arrive("init", "m0", 3, kT0, record, &a);
  }
  EXPECT_EQ(done.size(), 5u);
  EXPECT_EQ(b.waiter_count(), 0u);
}

TEST(BarriersTest, TimeoutAndReset) {
  Barriers b;
  std::vector<absl::Status> done;
  auto record = [&](absl::Status s) { done.push_back(s); };
  {
    Actions a;
    b.Arrive("x", "m0", 2, kT0 + absl::Seconds(1), record, &a);
    b.Arrive("y", "m0", 2, kT0 + absl::Seconds(9), record, &a);
    b.Expire(kT0 + absl::Seconds(1), &a);
  }
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].code(), absl::StatusCode::kDeadlineExceeded);
  {
    Actions a;
    b.Reset("regroup", &a);
  }
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[1].code(), absl::StatusCode::kAborted);
}

}  // namespace
}  // namespace muster
