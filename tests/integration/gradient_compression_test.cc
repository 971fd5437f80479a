// GradientSync with gradient compression, over two nodes of two ranks
// (shared memory inside each node, Gloo between them; ranks as threads, real
// autograd hooks).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <array>
#include <cmath>
#include <mutex>
#include <vector>

#include "absl/time/clock.h"
#include "tests/integration/comm_world.h"
#include "trainer/ddp/device_comm.h"
#include "trainer/ddp/gradient_sync.h"

namespace muster {
namespace {

const std::vector<int> kTwoNodesOfTwo = {0, 0, 1, 1};
const std::vector<std::vector<int64_t>> kShapes = {{3000}, {33, 17}, {5}};

// Rank `rank`'s gradient of parameter `k`: floats that are not bfloat16
// values, of magnitude up to 3.
torch::Tensor Gradient(size_t k, int rank) {
  const std::vector<int64_t>& shape = kShapes[k];
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  const torch::Tensor x = torch::arange(n, torch::kFloat32) * (0.37f + 0.11f * rank + 0.05f * k);
  return (torch::sin(x) * 3.0f + 0.001f).reshape(shape);
}

std::vector<torch::Tensor> Parameters() {
  std::vector<torch::Tensor> params;
  for (const auto& shape : kShapes) params.push_back(torch::zeros(shape, torch::requires_grad()));
  return params;
}

GradientSyncOptions SmallBuckets() {
  GradientSyncOptions o;
  o.clock = RealClock::Get();
  o.bucket_bytes = 4096;  // several buckets; the control words ride in the last
  return o;
}

// One synchronised step whose loss gives every parameter Gradient(k, rank).
void Step(GradientSync& sync, std::vector<torch::Tensor>& params, int rank,
          const std::array<float, GradientSync::kControlWords>& control) {
  sync.Begin(/*sync=*/true, control);
  torch::Tensor loss = torch::zeros({});
  for (size_t k = 0; k < params.size(); ++k) loss = loss + (params[k] * Gradient(k, rank)).sum();
  loss.backward();
  ASSERT_TRUE(sync.Finish(absl::Now() + absl::Seconds(60)).ok());
}

// What a step reduced before compression existed: a float32 all-reduce
// (average) of each tensor.
torch::Tensor Float32Average(Communicator* comm, const torch::Tensor& t) {
  torch::Tensor copy = t.detach().clone();
  EXPECT_TRUE(AllReduceTensor(comm, copy, ReduceOp::kAverage, absl::Now() + absl::Seconds(60)).ok());
  return copy;
}

std::array<float, GradientSync::kControlWords> ControlOf(int rank) {
  // The second word is not a bfloat16 value: compressed, it would change.
  return {rank == 0 ? 1.0f : 0.0f, 0.1f * rank + 0.001f, 0.0f};
}

// Compression "none" (the default) changes nothing: every parameter's
// averaged gradient is, bit for bit, the float32 all-reduce every step did
// before; so are the control words. With bf16 on the same world the
// gradients differ from it (the test sees compression) within bfloat16's
// rounding, while the control words stay exact.
TEST(GradientSyncCompressionTest, NoneIsBitForBitTheFloat32AllReduce) {
  for (GradientCompression c : {GradientCompression::kNone, GradientCompression::kBf16}) {
    ASSERT_TRUE(RunCommWorld(kTwoNodesOfTwo, "hier", c, [&](int rank, Communicator* comm) {
      EXPECT_EQ(comm->gradient_wire(),
                c == GradientCompression::kNone ? DataType::kFloat32 : DataType::kBFloat16);
      std::vector<torch::Tensor> params = Parameters();
      GradientSync sync(params, comm, SmallBuckets());
      ASSERT_GE(sync.bucket_count(), 2u);
      Step(sync, params, rank, ControlOf(rank));
      for (size_t k = 0; k < params.size(); ++k) {
        const torch::Tensor want = Float32Average(comm, Gradient(k, rank));
        const torch::Tensor& got = params[k].grad();
        if (c == GradientCompression::kNone) {
          EXPECT_TRUE(torch::equal(got, want)) << "parameter " << k << " rank " << rank;
        } else {
          // Two roundings to bfloat16 (2^-8 each) of sums of four values up to 3.
          EXPECT_TRUE(torch::allclose(got, want, /*rtol=*/0, /*atol=*/std::ldexp(3.0, -7) * 1.01))
              << "parameter " << k;
          if (k == 0) {
            EXPECT_FALSE(torch::equal(got, want)) << "bf16 changed nothing";
          }
        }
      }
      const auto control = ControlOf(rank);
      const torch::Tensor words = Float32Average(
          comm, torch::tensor(std::vector<float>(control.begin(), control.end())));
      for (int j = 0; j < GradientSync::kControlWords; ++j) {
        EXPECT_EQ(sync.control()[j], words[j].item<float>()) << "control word " << j;
      }
    }).ok());
  }
}

// A sync given a scatter plan (sharded state, reduce_scatter_gradients)
// compresses what crosses nodes as the all-reducing sync does: on two nodes
// of two ranks each rank's segment of each bucket is, bit for bit, those
// elements of the all-reducing sync's averaged .grad, with bf16 as without
// it (and with bf16 they differ from the float32 average).
TEST(GradientSyncCompressionTest, AScatterPlanCompressesAsTheAllReduce) {
  // Two buckets: parameter 2 alone, then 0 and 1; segments of every size,
  // one empty.
  const std::vector<GradientSync::BucketPlan> plan = {{{2}, {1, 0, 3, 1}},
                                                      {{0, 1}, {1000, 1200, 1, 1360}}};
  for (GradientCompression c : {GradientCompression::kNone, GradientCompression::kBf16}) {
    ASSERT_TRUE(RunCommWorld(kTwoNodesOfTwo, "hier", c, [&](int rank, Communicator* comm) {
      std::vector<torch::Tensor> reduced = Parameters(), scattered = Parameters();
      GradientSync all(reduced, comm, SmallBuckets());
      GradientSync scatter(scattered, plan, comm, SmallBuckets());
      ASSERT_TRUE(scatter.scatters());
      Step(all, reduced, rank, ControlOf(rank));
      Step(scatter, scattered, rank, ControlOf(rank));
      for (size_t b = 0; b < plan.size(); ++b) {
        std::vector<torch::Tensor> averages, float32;
        for (size_t k : plan[b].params) {
          averages.push_back(reduced[k].grad().flatten());
          float32.push_back(Float32Average(comm, Gradient(k, rank)).flatten());
        }
        const auto at = static_cast<int64_t>(SegmentOffset(plan[b].scatter, rank));
        const int64_t n = static_cast<int64_t>(plan[b].scatter[rank]);
        const torch::Tensor got = scatter.bucket_gradients(b).narrow(0, at, n);
        EXPECT_TRUE(torch::equal(got, torch::cat(averages).narrow(0, at, n)))
            << "bucket " << b << " rank " << rank;
        if (c == GradientCompression::kBf16 && b == 1 && n > 100) {
          EXPECT_FALSE(torch::equal(got, torch::cat(float32).narrow(0, at, n)))
              << "rank " << rank << ": bf16 changed nothing";
        }
      }
    }).ok());
  }
}

// Step salvage with compression: the survivors re-reduce the float32
// gradients they hold, a rank without any contributes zeros, and the
// average over the three contributors lies within bfloat16's rounding on
// every rank, the same bits everywhere; the control words stay exact.
TEST(GradientSyncCompressionTest, SalvageReducesTheHeldFloat32GradientsCompressed) {
  std::mutex mu;
  std::vector<std::vector<torch::Tensor>> installed(kTwoNodesOfTwo.size());
  ASSERT_TRUE(RunCommWorld(kTwoNodesOfTwo, "hier", GradientCompression::kBf16,
                           [&](int rank, Communicator* comm) {
    std::vector<torch::Tensor> params = Parameters();
    GradientSync sync(params, comm, SmallBuckets());
    for (size_t k = 0; k < params.size(); ++k) params[k].mutable_grad() = Gradient(k, rank);
    const bool contributes = rank != 3;
    ASSERT_TRUE(sync.Resync(comm, contributes, /*contributors=*/3, ControlOf(rank),
                            absl::Now() + absl::Seconds(60)).ok());
    for (size_t k = 0; k < params.size(); ++k) {
      torch::Tensor sum = torch::zeros(kShapes[k]), magnitude = torch::zeros(kShapes[k]);
      for (int r = 0; r < 3; ++r) {
        sum += Gradient(k, r);
        magnitude += Gradient(k, r).abs();
      }
      const torch::Tensor error = (params[k].grad() - sum / 3).abs();
      EXPECT_TRUE((error <= magnitude * (std::ldexp(1.0, -7) * 1.01) / 3 + 1e-6).all().item<bool>())
          << "parameter " << k << ": error up to " << error.max().item<float>();
    }
    float control_sum = 0;
    for (int r = 0; r < 4; ++r) control_sum += ControlOf(r)[1];
    EXPECT_FLOAT_EQ(sync.control()[1], control_sum / 4);
    std::lock_guard<std::mutex> lock(mu);
    for (const torch::Tensor& p : params) installed[rank].push_back(p.grad().clone());
  }).ok());
  for (size_t r = 1; r < installed.size(); ++r) {
    for (size_t k = 0; k < kShapes.size(); ++k) {
      EXPECT_TRUE(torch::equal(installed[r][k], installed[0][k])) << "rank " << r << " param " << k;
    }
  }
}

}  // namespace
}  // namespace muster
