// Pipelined staging (trainer/comm/staged.h) over real Gloo (ranks as
// threads against an in-process coordinator, loopback), with host copies:
// cut into chunks, a collective gives what the unpipelined one gives.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/clock.h"
#include "tests/integration/comm_harness.h"
#include "trainer/comm/staged.h"

namespace muster {
namespace {

constexpr size_t kChunkBytes = 4096;  // 1,024 floats: the buffers below make 98 chunks

std::vector<float> RandomFloats(int rank, size_t n) {
  std::mt19937 gen(77 + rank);
  std::normal_distribution<float> value(0.0f, 3.0f);
  std::vector<float> v(n);
  for (float& x : v) x = value(gen);
  return v;
}

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

CommOptions Gloo() {
  CommOptions o;
  o.backend = Backend::kGloo;
  return o;
}

// Two ranks: every chunk's sum is a + b, so the pipelined all-reduce and
// broadcast are bit for bit the whole-buffer ones, on float data of every
// magnitude and a length that is no multiple of the chunk.
TEST(PipelinedStagingTest, TwoRanksGetBitForBitTheUnpipelinedResult) {
  constexpr size_t n = 100'003;
  CommHarness h({0, 0}, "ps2" + std::to_string(::getpid()));
  EXPECT_TRUE(h.Run(Gloo(), [&](RankContext& rc) {
    const int r = rc.world.rank;
    const absl::Time deadline = RealClock::Get()->Now() + absl::Seconds(60);
    std::vector<float> whole_sum = RandomFloats(r, n), whole_avg = whole_sum;
    std::vector<float> whole_bcast = RandomFloats(r + 10, n);
    ASSERT_TRUE(rc.comm->AllReduce(whole_sum.data(), n, DataType::kFloat32, ReduceOp::kSum,
                                   deadline).ok());
    ASSERT_TRUE(rc.comm->AllReduce(whole_avg.data(), n, DataType::kFloat32,
                                   ReduceOp::kAverage, deadline).ok());
    ASSERT_TRUE(rc.comm->Broadcast(whole_bcast.data(), n, DataType::kFloat32, 1, deadline).ok());

    auto piped = NewPipelinedStagedCommunicator(std::move(rc.comm), NewHostStagingCopies(),
                                                MemorySpace::Host(), kChunkBytes);
    std::vector<float> sum = RandomFloats(r, n), avg = sum, bcast = RandomFloats(r + 10, n);
    ASSERT_TRUE(piped->AllReduce(sum.data(), n, DataType::kFloat32, ReduceOp::kSum, deadline)
                    .ok());
    ASSERT_TRUE(piped->AllReduce(avg.data(), n, DataType::kFloat32, ReduceOp::kAverage,
                                 deadline).ok());
    ASSERT_TRUE(piped->Broadcast(bcast.data(), n, DataType::kFloat32, 1, deadline).ok());
    EXPECT_TRUE(BitEqual(sum, whole_sum)) << "rank " << r;
    EXPECT_TRUE(BitEqual(avg, whole_avg)) << "rank " << r;
    EXPECT_TRUE(BitEqual(bcast, whole_bcast)) << "rank " << r;
    EXPECT_TRUE(BitEqual(bcast, RandomFloats(11, n))) << "rank " << r;
  }).ok());
}

// Three ranks, integers held exactly in float32: whatever order the ring
// adds them in, every element is the exact sum; reduce-scatter and
// all-gather travel as one chunk and keep their per-rank counts.
TEST(PipelinedStagingTest, ThreeRanksReduceEveryChunkAndKeepTheCountsOfTheOthers) {
  constexpr size_t n = 10'007;
  CommHarness h({0, 0, 0}, "ps3" + std::to_string(::getpid()));
  EXPECT_TRUE(h.Run(Gloo(), [&](RankContext& rc) {
    const int r = rc.world.rank;
    const absl::Time deadline = RealClock::Get()->Now() + absl::Seconds(60);
    auto piped = NewPipelinedStagedCommunicator(std::move(rc.comm), NewHostStagingCopies(),
                                                MemorySpace::Host(), kChunkBytes);
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i % 1000) * (r + 1);
    ASSERT_TRUE(piped->AllReduce(v.data(), n, DataType::kFloat32, ReduceOp::kSum, deadline)
                    .ok());
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(v[i], static_cast<float>(i % 1000) * 6) << "element " << i << " rank " << r;
    }

    const std::vector<size_t> counts = {3, 4, 5};
    std::vector<float> rs(12, static_cast<float>(r + 1));
    ASSERT_TRUE(piped->ReduceScatter(rs.data(), counts, DataType::kFloat32, ReduceOp::kSum,
                                     deadline).ok());
    const size_t begin = r == 0 ? 0 : r == 1 ? 3 : 7;
    for (size_t i = begin; i < begin + counts[r]; ++i) EXPECT_EQ(rs[i], 6.0f) << "rank " << r;

    std::vector<float> ag(12, -1.0f);
    for (size_t i = begin; i < begin + counts[r]; ++i) ag[i] = static_cast<float>(r);
    ASSERT_TRUE(piped->AllGather(ag.data(), counts, DataType::kFloat32, deadline).ok());
    EXPECT_EQ(ag, (std::vector<float>{0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 2})) << "rank " << r;
  }).ok());
}

}  // namespace
}  // namespace muster
