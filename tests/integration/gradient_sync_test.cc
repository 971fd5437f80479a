// GradientSync and BroadcastTensors over a real communicator (ranks as
// threads, real LibTorch autograd hooks).
#include "trainer/ddp/gradient_sync.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "absl/time/clock.h"
#include "tests/integration/comm_world.h"

namespace muster {
namespace {

// Ranks whose backward fills the buckets in different orders still reduce
// bucket i against bucket i: buckets are launched in index order, as DDP's
// reducer does. Rank 0 runs backward over p0 and then p1, rank 1 over p1 and
// then p0; every parameter is a bucket of its own and all are the same size,
// so a bucket reduced against the wrong one would give wrong averages, not
// an error.
TEST(GradientSyncTest, RanksThatFillBucketsInDifferentOrdersReduceMatchingBuckets) {
  constexpr int kParams = 4;
  constexpr int64_t kSize = 256;
  ASSERT_TRUE(RunCommWorld(2, "gloo", [&](int rank, Communicator* comm) {
    std::vector<torch::Tensor> params;
    for (int i = 0; i < kParams; ++i) params.push_back(torch::zeros({kSize}, torch::requires_grad()));
    GradientSyncOptions o;
    o.bucket_bytes = 1;  // one bucket per parameter
    GradientSync sync(params, comm, o);
    for (int step = 0; step < 3; ++step) {
      for (torch::Tensor& p : params) p.mutable_grad() = torch::Tensor();
      sync.Begin(/*sync=*/true);
      // Gradient of parameter i on rank r: (r + 1) * (i + 1) * (step + 1).
      for (int k = 0; k < kParams; ++k) {
        const int i = rank == 0 ? k : kParams - 1 - k;
        ((params[i] * static_cast<float>((rank + 1) * (i + 1) * (step + 1))).sum()).backward();
      }
      ASSERT_TRUE(sync.Finish(absl::Now() + absl::Seconds(30)).ok());
      for (int i = 0; i < kParams; ++i) {
        const float want = 1.5f * static_cast<float>((i + 1) * (step + 1));
        EXPECT_TRUE(torch::allclose(params[i].grad(), torch::full({kSize}, want)))
            << "rank " << rank << " step " << step << " parameter " << i << ": got "
            << params[i].grad()[0].item<float>() << ", want " << want;
      }
    }
  }).ok());
}

// Every dtype a state may hold travels bit for bit from the root, including
// sizes that are not a multiple of 8 bytes.
TEST(BroadcastTensorsTest, EveryDtypeArrivesBitForBit) {
  const std::vector<torch::ScalarType> dtypes = {
      torch::kFloat32, torch::kFloat64, torch::kFloat16, torch::kBFloat16, torch::kBool,
      torch::kInt8,    torch::kUInt8,   torch::kInt16,   torch::kInt32,    torch::kInt64};
  // The root's tensors: values that differ from the others' zeros, odd sizes.
  std::vector<torch::Tensor> want;
  for (size_t i = 0; i < dtypes.size(); ++i) {
    const torch::Tensor x = torch::arange(3 + static_cast<int64_t>(i), torch::kFloat64);
    want.push_back(dtypes[i] == torch::kBool ? x.remainder(2).eq(1)
                                             : (x * 37.25 - 50.5).to(dtypes[i]));
  }
  ASSERT_TRUE(RunCommWorld(3, "shm", [&](int rank, Communicator* comm) {
    std::vector<torch::Tensor> mine;
    for (const torch::Tensor& t : want) mine.push_back(rank == 1 ? t.clone() : torch::zeros_like(t));
    ASSERT_TRUE(BroadcastTensors(mine, comm, /*root=*/1, absl::Now() + absl::Seconds(30)).ok());
    for (size_t i = 0; i < dtypes.size(); ++i) {
      EXPECT_EQ(mine[i].scalar_type(), dtypes[i]);
      EXPECT_TRUE(torch::equal(mine[i], want[i])) << "rank " << rank << " dtype " << dtypes[i];
    }
  }).ok());
}

}  // namespace
}  // namespace muster
