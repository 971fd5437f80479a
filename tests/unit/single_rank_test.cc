// The communicator of one rank (trainer/comm/single_rank.h).
#include "trainer/comm/single_rank.h"

#include <gtest/gtest.h>

#include <vector>

#include "common/clock.h"

namespace muster {
namespace {

TEST(SingleRankTest, EveryCollectiveLeavesTheBufferAsItIs) {
  auto c = NewSingleRankCommunicator(MemorySpace::Cuda(3));
  EXPECT_EQ(c->size(), 1);
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->name(), "self");
  EXPECT_EQ(c->memory().ToString(), "cuda:3");
  std::vector<float> v = {1.5f, -2.0f, 3.25f};
  const std::vector<float> before = v;
  const absl::Time deadline = RealClock::Get()->Now() + absl::Seconds(1);
  EXPECT_TRUE(c->AllReduce(v.data(), v.size(), DataType::kFloat32, ReduceOp::kAverage, deadline)
                  .ok());
  EXPECT_TRUE(c->ReduceScatter(v.data(), {3}, DataType::kFloat32, ReduceOp::kSum, deadline).ok());
  EXPECT_TRUE(c->AllGather(v.data(), {3}, DataType::kFloat32, deadline).ok());
  EXPECT_TRUE(c->Broadcast(v.data(), v.size(), DataType::kFloat32, 0, deadline).ok());
  EXPECT_TRUE(c->Barrier(deadline).ok());
  EXPECT_EQ(v, before);
}

TEST(SingleRankTest, CountsForOtherRanksAndAnotherRootAreRefused) {
  auto c = NewSingleRankCommunicator(MemorySpace::Host());
  float x = 1;
  const absl::Time deadline = RealClock::Get()->Now() + absl::Seconds(1);
  EXPECT_TRUE(absl::IsInvalidArgument(
      c->ReduceScatter(&x, {1, 0}, DataType::kFloat32, ReduceOp::kSum, deadline)));
  EXPECT_TRUE(absl::IsInvalidArgument(c->Broadcast(&x, 1, DataType::kFloat32, 1, deadline)));
}

TEST(SingleRankTest, AfterAbortEveryCallIsAborted) {
  auto c = NewSingleRankCommunicator(MemorySpace::Host());
  c->Abort(absl::AbortedError("a peer elsewhere failed"));
  float x = 1;
  EXPECT_TRUE(absl::IsAborted(c->AllReduce(&x, 1, DataType::kFloat32, ReduceOp::kSum,
                                           RealClock::Get()->Now() + absl::Seconds(1))));
  EXPECT_TRUE(absl::IsAborted(c->Barrier(RealClock::Get()->Now() + absl::Seconds(1))));
}

}  // namespace
}  // namespace muster
