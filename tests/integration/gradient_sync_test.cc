// GradientSync and BroadcastTensors over a real communicator (ranks as
// threads, real LibTorch autograd hooks). Every communicator here checks that
// the buffers it is handed lie in the memory it declares (checked.h).
#include "trainer/ddp/gradient_sync.h"

#include <sys/mman.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "tests/integration/comm_world.h"
#include "trainer/comm/forwarding.h"
#include "trainer/comm/single_rank.h"
#include "trainer/ddp/device_comm.h"
#include "trainer/elastic/state_sync.h"

namespace muster {
namespace {

// A pass's backward on rank `rank`: element e of parameter i gets the
// gradient (rank + 1) * (10 * i + e + shift), twice for the last parameter
// (a second backward, after its bucket was launched). Each parameter's
// local gradient of the pass.
std::vector<torch::Tensor> BackwardTwiceIntoTheLast(const std::vector<torch::Tensor>& params,
                                                    int rank, int shift = 0) {
  std::vector<torch::Tensor> local;
  torch::Tensor loss = torch::zeros({});
  for (size_t i = 0; i < params.size(); ++i) {
    local.push_back(torch::arange(params[i].numel())
                        .to(torch::kFloat32)
                        .add(10 * static_cast<int64_t>(i) + shift)
                        .mul(rank + 1));
    loss = loss + (params[i] * local[i]).sum();
  }
  loss.backward();
  (params.back() * local.back()).sum().backward();
  local.back() = local.back() * 2;
  return local;
}

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
    o.clock = RealClock::Get();
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

// A pass with several backward calls (a GAN's real and fake losses, one
// backward per task) averages each rank's whole local sum, even when a later
// backward reaches parameters whose buckets are already launched, and when
// the ranks touch different parameters again (a data-dependent graph): every
// rank reduces again the buckets that any rank flagged, and the same ones.
TEST(GradientSyncTest, SeveralBackwardCallsInOnePassAverageTheWholeLocalSum) {
  constexpr int kParams = 4;
  constexpr int64_t kSize = 300;
  for (const char* backend : {"gloo", "shm"}) {
    ASSERT_TRUE(RunCommWorld(2, backend, [&](int rank, Communicator* comm) {
      std::vector<torch::Tensor> params;
      for (int i = 0; i < kParams; ++i) {
        params.push_back(torch::zeros({kSize}, torch::requires_grad()));
      }
      GradientSyncOptions o;
      o.clock = RealClock::Get();
      o.bucket_bytes = 1;  // one bucket per parameter
      GradientSync sync(params, comm, o);
      for (int step = 0; step < 3; ++step) {
        for (torch::Tensor& p : params) p.mutable_grad() = torch::Tensor();
        std::vector<float> local(kParams, 0);
        sync.Begin(/*sync=*/true);
        // Every parameter once, last to first (buckets 0.. launch at once)...
        torch::Tensor all = torch::zeros({}, torch::kFloat32);
        for (int i = 0; i < kParams; ++i) {
          const float g = static_cast<float>((rank + 1) * (i + 1) + step);
          all = all + (params[i] * g).sum();
          local[i] += g;
        }
        all.backward();
        // ... then one parameter again: the last on rank 0, the first on
        // rank 1 (its bucket is the last, not launched yet).
        const int again = rank == 0 ? kParams - 1 : 0;
        const float g2 = 10.0f * static_cast<float>(rank + 1 + step);
        ((params[again] * g2).sum()).backward();
        local[again] += g2;
        ASSERT_TRUE(sync.Finish(absl::Now() + absl::Seconds(30)).ok());
        EXPECT_EQ(sync.last_stats().refilled_buckets, 1) << "rank " << rank;
        // The average of both ranks' local sums: exchanged by hand.
        torch::Tensor mine = torch::tensor(local);
        torch::Tensor sums = mine.clone();
        ASSERT_TRUE(AllReduceTensor(comm, sums, ReduceOp::kSum,
                                    absl::Now() + absl::Seconds(30)).ok());
        for (int i = 0; i < kParams; ++i) {
          const float want = sums[i].item<float>() / 2;
          EXPECT_TRUE(torch::allclose(params[i].grad(), torch::full({kSize}, want)))
              << backend << " rank " << rank << " step " << step << " parameter " << i
              << ": got " << params[i].grad()[0].item<float>() << ", want " << want;
        }
      }
    }).ok()) << backend;
  }
}

// A parameter no rank has a gradient for (a head no rank's forward used)
// keeps no .grad, as in one process, so that an optimizer skips it rather
// than stepping it with zeros (AdamW's weight decay would move it); one
// that some rank used gets the average, zeros counted for the others. So
// in a world of one, and when a salvage reduces the .grad again.
TEST(GradientSyncTest, AParameterNoRankUsedKeepsNoGradient) {
  constexpr int64_t kSize = 64;
  for (int world : {1, 2}) {
    ASSERT_TRUE(RunCommWorld(world, "gloo", [&](int rank, Communicator* comm) {
      // Registration order: p0, p1, p2; bucket_bytes 1: one bucket each.
      std::vector<torch::Tensor> params;
      for (int i = 0; i < 3; ++i) {
        params.push_back(torch::zeros({kSize}, torch::requires_grad()));
      }
      GradientSyncOptions o;
      o.clock = RealClock::Get();
      o.bucket_bytes = 1;
      GradientSync sync(params, comm, o);
      sync.Begin(/*sync=*/true);
      // p0 on every rank, p1 on rank 0 only, p2 on none.
      torch::Tensor loss = (params[0] * static_cast<float>(rank + 1)).sum();
      if (rank == 0) loss = loss + (params[1] * 4.0f).sum();
      loss.backward();
      ASSERT_TRUE(sync.Finish(absl::Now() + absl::Seconds(30)).ok());
      const float p0 = world == 1 ? 1.0f : 1.5f, p1 = world == 1 ? 4.0f : 2.0f;
      ASSERT_TRUE(params[0].grad().defined());
      EXPECT_TRUE(torch::allclose(params[0].grad(), torch::full({kSize}, p0))) << "rank " << rank;
      ASSERT_TRUE(params[1].grad().defined()) << "world " << world << " rank " << rank;
      EXPECT_TRUE(torch::allclose(params[1].grad(), torch::full({kSize}, p1))) << "rank " << rank;
      EXPECT_FALSE(params[2].grad().defined())
          << "world " << world << " rank " << rank << ": an unused parameter got a .grad of "
          << params[2].grad()[0].item<float>();
      if (world == 1) return;
      // A salvage's reduction from the .grad: the same.
      ASSERT_TRUE(sync.Resync(comm, /*contribute=*/true, /*contributors=*/2, {},
                              absl::Now() + absl::Seconds(30))
                      .ok());
      EXPECT_TRUE(torch::allclose(params[0].grad(), torch::full({kSize}, p0))) << "rank " << rank;
      EXPECT_FALSE(params[2].grad().defined()) << "rank " << rank << " after Resync";
    }).ok()) << "world " << world;
  }
}

// A sync given a plan with scatter segments reduce-scatters: each rank's
// segment of each bucket holds the world's average, the parameters' .grad
// keep the rank's own gradient, and the control words are averaged as in
// any step. Two backward calls in the pass refill a launched bucket, which
// is reduce-scattered again. A salvage's Resync all-reduces and installs
// the averages into every .grad as the default sync does. With a `take`
// (pooled buckets) each bucket's segments are handed over as they come
// back, the refilled bucket's twice, and the salvage goes a bucket at a
// time: the same figures. So they are with buckets of 2 elements (streamed:
// both buckets are larger, and go a pool buffer of 2 at a time).
TEST(GradientSyncTest, AScatterPlanLeavesEachRankTheAverageOfItsSegments) {
  for (const std::string backend : {"gloo", "shm", "hier"}) {
    for (const std::string mode : {"", "pooled", "streamed"}) {
      const bool pooled = !mode.empty();
      const auto body = [&](int rank, Communicator* comm) {
        // Two buckets: p2 (5 elements) alone, then p0 and p1 (3 + 4); the
        // segments cut through the parameters.
        std::vector<torch::Tensor> params = {torch::zeros({3}, torch::requires_grad()),
                                             torch::zeros({4}, torch::requires_grad()),
                                             torch::zeros({5}, torch::requires_grad())};
        std::vector<GradientSync::BucketPlan> plan = {{{2}, {0, 2, 3}}, {{0, 1}, {4, 3, 0}}};
        GradientSyncOptions o;
        o.clock = RealClock::Get();
        if (mode == "streamed") o.bucket_bytes = 2 * sizeof(float);
        std::vector<torch::Tensor> taken = {torch::zeros({5}), torch::zeros({7})};
        std::vector<int> takes(plan.size(), 0);
        if (pooled) {
          o.take = [&](size_t i, int64_t offset, const torch::Tensor& part) {
            taken[i].narrow(0, offset, part.numel()).copy_(part);
            if (offset == 0) ++takes[i];
          };
        }
        GradientSync sync(params, plan, comm, o);
        ASSERT_TRUE(sync.scatters());
        const auto gradients = [&](size_t b) {
          return pooled ? taken[b] : sync.bucket_gradients(b);
        };
        sync.Begin(/*sync=*/true, {static_cast<float>(rank), 0, 0, 0});
        // Element e of parameter i on rank r: (r + 1) * (10 * i + e), twice
        // for p2 (a second backward, after its bucket was launched).
        const std::vector<torch::Tensor> local = BackwardTwiceIntoTheLast(params, rank);
        ASSERT_TRUE(sync.Finish(absl::Now() + absl::Seconds(30)).ok());
        EXPECT_EQ(sync.last_stats().refilled_buckets, 1);
        if (pooled) {
          EXPECT_EQ(takes, (std::vector<int>{2, 1})) << "the refilled bucket is taken again";
        }
        EXPECT_FLOAT_EQ(sync.control()[0], 1.0f) << "the control words are averaged";
        for (int i = 0; i < 3; ++i) {
          EXPECT_TRUE(torch::equal(params[i].grad(), local[i]))
              << backend << " rank " << rank << ": parameter " << i << "'s .grad is not its own";
        }
        // The world's average is (1 + 2 + 3) / 3 = 2 times rank 0's gradient.
        for (size_t b = 0; b < plan.size(); ++b) {
          std::vector<torch::Tensor> parts;
          for (size_t k : plan[b].params) parts.push_back(local[k] / (rank + 1) * 2);
          const torch::Tensor want = torch::cat(parts);
          int64_t at = 0;
          for (int r = 0; r < rank; ++r) at += static_cast<int64_t>(plan[b].scatter[r]);
          const int64_t n = static_cast<int64_t>(plan[b].scatter[rank]);
          EXPECT_TRUE(torch::allclose(gradients(b).narrow(0, at, n), want.narrow(0, at, n)))
              << backend << " " << mode << " rank " << rank << " bucket " << b << ": "
              << gradients(b) << " against " << want;
        }
        ASSERT_TRUE(sync.Resync(comm, /*contribute=*/true, /*contributors=*/3, {},
                                absl::Now() + absl::Seconds(30))
                        .ok());
        for (int i = 0; i < 3; ++i) {
          EXPECT_TRUE(torch::allclose(params[i].grad(), local[i] / (rank + 1) * 2))
              << backend << " " << mode << " rank " << rank << ": parameter " << i
              << " after Resync";
        }
      };
      // hier: two nodes, of two ranks and one.
      EXPECT_TRUE((backend == "hier"
                       ? RunCommWorld({0, 0, 1}, backend, GradientCompression::kNone, body)
                       : RunCommWorld(3, backend, body))
                      .ok())
          << backend << " " << mode;
    }
  }
}

// Eight buckets of one parameter of 1,000 elements each, reduce-scattered
// over two ranks as segments of 400 and 600, pooled: bucket b holds
// parameter 7 - b, and `taken` what the sync handed over of each.
struct PooledWorld {
  static constexpr int kBuckets = 8;
  static constexpr int64_t kSize = 1000;
  std::vector<torch::Tensor> params;
  std::vector<torch::Tensor> taken = std::vector<torch::Tensor>(kBuckets);
  std::unique_ptr<GradientSync> sync;

  explicit PooledWorld(Communicator* comm) {
    std::vector<GradientSync::BucketPlan> plan;
    for (int i = 0; i < kBuckets; ++i) {
      params.push_back(torch::zeros({kSize}, torch::requires_grad()));
      plan.push_back({{static_cast<size_t>(kBuckets - 1 - i)}, {400, 600}});
    }
    GradientSyncOptions o;
    o.clock = RealClock::Get();
    o.take = [this](size_t i, int64_t offset, const torch::Tensor& part) {
      if (!taken[i].defined()) taken[i] = torch::zeros({kSize});
      taken[i].narrow(0, offset, part.numel()).copy_(part);
    };
    sync = std::make_unique<GradientSync>(params, plan, comm, o);
  }
  // Parameter p's gradient on rank r: (r + 1) * (p + 1).
  torch::Tensor Loss(int p, int rank) const { return params[p].sum() * (rank + 1) * (p + 1); }
  // After Finish: rank `rank`'s segment of each bucket is the average of
  // the two ranks' gradients, (1 + 2) / 2 times (p + 1).
  void ExpectTaken(int rank) const {
    const int64_t at = rank == 0 ? 0 : 400, n = rank == 0 ? 400 : 600;
    for (int b = 0; b < kBuckets; ++b) {
      ASSERT_TRUE(taken[b].defined()) << "bucket " << b;
      EXPECT_TRUE(torch::allclose(taken[b].narrow(0, at, n),
                                  torch::full({n}, 1.5f * static_cast<float>(kBuckets - b))))
          << "rank " << rank << " bucket " << b;
    }
  }
};

// Pooled reduce-scatter buckets (GradientSyncOptions::take) hold a pool of
// two buckets' buffers, not one per bucket: after a pass of eight buckets of
// 1,000 elements the sync holds at most 2,000 elements and the words, and
// each rank took its segment of every bucket, the world's average.
TEST(GradientSyncTest, PooledScatterBucketsHoldTwoBuffersNotOnePerBucket) {
  const auto body = [&](int rank, Communicator* comm) {
    PooledWorld w(comm);
    w.sync->Begin(/*sync=*/true);
    torch::Tensor loss = torch::zeros({});
    for (int p = 0; p < PooledWorld::kBuckets; ++p) loss = loss + w.Loss(p, rank);
    loss.backward();
    ASSERT_TRUE(w.sync->Finish(absl::Now() + absl::Seconds(30)).ok());
    int64_t held = 0;
    for (const torch::Tensor& t : w.sync->buffers()) held += t.numel();
    constexpr int kBuckets = PooledWorld::kBuckets;
    EXPECT_LE(held, 2 * PooledWorld::kSize + GradientSync::WordCount(kBuckets, kBuckets))
        << "rank " << rank << " holds " << held << " elements";
    w.ExpectTaken(rank);
  };
  EXPECT_TRUE(RunCommWorld(2, "gloo", body).ok());
}

// A pooled bucket larger than a pool buffer (a parameter of 10,000
// elements; buckets of 1,000) is streamed: read from its .grad a pool
// buffer at a time, each part the next 500 elements of both ranks'
// segments, reduce-scattered and taken in turn, so that
// the sync never holds more than its two pool buffers and the words, not a
// buffer of the parameter's size. Each rank still takes the world's
// average of its segment (cut inside a part), the .grad keep the rank's
// own sum, and a salvage's Resync streams it too, installing the average.
TEST(GradientSyncTest, ABucketLargerThanAPoolBufferIsStreamedThroughIt) {
  const auto body = [&](int rank, Communicator* comm) {
    constexpr int64_t kBig = 10000, kSmall = 1000;
    std::vector<torch::Tensor> params = {torch::zeros({kBig}, torch::requires_grad()),
                                         torch::zeros({kSmall}, torch::requires_grad())};
    const std::vector<GradientSync::BucketPlan> plan = {{{0}, {3500, 6500}}, {{1}, {400, 600}}};
    std::vector<torch::Tensor> taken = {torch::zeros({kBig}), torch::zeros({kSmall})};
    std::vector<int> parts(2, 0);
    int64_t held = 0;
    std::unique_ptr<GradientSync> sync;
    GradientSyncOptions o;
    o.clock = RealClock::Get();
    o.bucket_bytes = kSmall * sizeof(float);
    o.take = [&](size_t i, int64_t offset, const torch::Tensor& part) {
      taken[i].narrow(0, offset, part.numel()).copy_(part);
      ++parts[i];
      int64_t now = 0;
      for (const torch::Tensor& t : sync->buffers()) now += t.numel();
      held = std::max(held, now);
    };
    sync = std::make_unique<GradientSync>(params, plan, comm, o);
    sync->Begin(/*sync=*/true);
    // Element e of parameter i on rank r: (r + 1) * (e + i).
    std::vector<torch::Tensor> local;
    torch::Tensor loss = torch::zeros({});
    for (int i = 0; i < 2; ++i) {
      local.push_back(torch::arange(params[i].numel()).to(torch::kFloat32).add(i).mul(rank + 1));
      loss = loss + (params[i] * local[i]).sum();
    }
    loss.backward();
    ASSERT_TRUE(sync->Finish(absl::Now() + absl::Seconds(30)).ok());
    // Bucket 0 in parts of 500 elements of each segment: 7 of the first,
    // 13 of the second.
    EXPECT_EQ(parts, (std::vector<int>{20, 2})) << "rank " << rank;
    EXPECT_LE(held, 2 * kSmall + GradientSync::WordCount(2, 2))
        << "rank " << rank << " held a buffer of the big parameter's size";
    for (int i = 0; i < 2; ++i) {
      EXPECT_TRUE(torch::equal(params[i].grad(), local[i])) << "parameter " << i;
      // The average over the ranks is (1 + 2) / 2 times rank 0's gradient.
      const torch::Tensor want = local[i] / (rank + 1) * 1.5;
      const int64_t at = rank == 0 ? 0 : static_cast<int64_t>(plan[i].scatter[0]);
      const auto n = static_cast<int64_t>(plan[i].scatter[rank]);
      EXPECT_TRUE(torch::allclose(taken[i].narrow(0, at, n), want.narrow(0, at, n)))
          << "rank " << rank << " parameter " << i;
    }
    ASSERT_TRUE(
        sync->Resync(comm, /*contribute=*/true, /*contributors=*/2, {}, absl::Now() + absl::Seconds(30))
            .ok());
    for (int i = 0; i < 2; ++i) {
      EXPECT_TRUE(torch::allclose(params[i].grad(), local[i] / (rank + 1) * 1.5))
          << "rank " << rank << " parameter " << i << " after Resync";
    }
  };
  EXPECT_TRUE(RunCommWorld(2, "gloo", body).ok());
}

// Backward does not wait on a slow peer for a pooled buffer: while rank 1
// sleeps 3 s before its backward, rank 0's first bucket waits for it in
// the reduce-scatter, and rank 0's next buckets, finding no free buffer,
// wait 200 ms at most in the pass (GradientSync::kPoolWait) and then make
// their own; its backward ends long before the peer's (a backward blocked
// on a hung peer would count as this rank's stall). The averages are the
// same.
TEST(GradientSyncTest, PooledBucketsDoNotHoldBackwardOnASlowPeer) {
  const auto body = [&](int rank, Communicator* comm) {
    PooledWorld w(comm);
    w.sync->Begin(/*sync=*/true);
    if (rank == 1) std::this_thread::sleep_for(std::chrono::seconds(3));
    const auto start = std::chrono::steady_clock::now();
    // One backward a parameter, bucket 0's first: it launches at once.
    for (int p = PooledWorld::kBuckets - 1; p >= 0; --p) w.Loss(p, rank).backward();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (rank == 0) {
      EXPECT_LT(seconds, 1.5) << "rank 0's backward waited for its slow peer";
    }
    ASSERT_TRUE(w.sync->Finish(absl::Now() + absl::Seconds(30)).ok());
    w.ExpectTaken(rank);
  };
  EXPECT_TRUE(RunCommWorld(2, "gloo", body).ok());
}

// A plan whose buckets are given (views of one vector, as sharded
// optimizer state's gradient vector: the last bucket's words in front of
// its gradients) leaves each .grad a view of its slot in that vector,
// holding the world's average, so that the gradients take no memory of
// their own. A second backward into a launched bucket is refilled from the
// .grad; a pass that begins with the .grad still views of the buckets
// (nobody cleared them) adds to them without writing into a bucket on its
// way; a salvage's Resync installs the same views.
TEST(GradientSyncTest, GivenBucketsBecomeTheGradients) {
  for (const std::string backend : {"gloo", "shm", "hier"}) {
    const auto body = [&](int rank, Communicator* comm) {
      std::vector<torch::Tensor> params = {torch::zeros({3}, torch::requires_grad()),
                                           torch::zeros({4}, torch::requires_grad()),
                                           torch::zeros({5}, torch::requires_grad())};
      // Two buckets: p2 alone, then p0 and p1, the words in front of them.
      const int64_t words = GradientSync::WordCount(2, 3);
      const torch::Tensor vector = torch::zeros({words + 12});
      std::vector<GradientSync::BucketPlan> plan = {{{2}, {}, false, vector.narrow(0, words + 7, 5)},
                                                    {{0, 1}, {}, false, vector.narrow(0, 0, words + 7)}};
      GradientSyncOptions o;
      o.clock = RealClock::Get();
      GradientSync sync(params, plan, comm, o);
      ASSERT_TRUE(sync.views());
      const std::vector<int64_t> at = {words, words + 3, words + 7};
      std::vector<torch::Tensor> want(3);
      for (int pass = 0; pass < 2; ++pass) {
        sync.Begin(/*sync=*/true, {static_cast<float>(rank), 0, 0, 0});
        // Element e of parameter i on rank r: (r + 1) * (10 * i + e + pass),
        // twice for p2 (a second backward, after its bucket was launched).
        const std::vector<torch::Tensor> local = BackwardTwiceIntoTheLast(params, rank, pass);
        ASSERT_TRUE(sync.Finish(absl::Now() + absl::Seconds(30)).ok());
        EXPECT_EQ(sync.last_stats().refilled_buckets, 1);
        EXPECT_FLOAT_EQ(sync.control()[0], 1.0f) << "the control words are averaged";
        for (int i = 0; i < 3; ++i) {
          // The world's average is (1 + 2 + 3) / 3 = 2 times rank 0's
          // gradient, added to what the .grad held before the pass.
          const torch::Tensor added = local[i] / (rank + 1) * 2;
          want[i] = pass == 0 ? added : want[i] + added;
          EXPECT_TRUE(torch::allclose(params[i].grad(), want[i]))
              << backend << " rank " << rank << " pass " << pass << ": parameter " << i << ": "
              << params[i].grad() << " against " << want[i];
          EXPECT_EQ(params[i].grad().data_ptr<float>(), vector.data_ptr<float>() + at[i])
              << backend << " rank " << rank << ": parameter " << i
              << "'s .grad is not a view of its slot";
        }
      }
      ASSERT_TRUE(sync.Resync(comm, /*contribute=*/true, /*contributors=*/3, {},
                              absl::Now() + absl::Seconds(30))
                      .ok());
      for (int i = 0; i < 3; ++i) {
        EXPECT_TRUE(torch::allclose(params[i].grad(), want[i]))
            << backend << " rank " << rank << ": parameter " << i << " after Resync";
        EXPECT_EQ(params[i].grad().data_ptr<float>(), vector.data_ptr<float>() + at[i]);
      }
      // An optimizer's zero_grad detaches each .grad in place, which an
      // autograd view of the bucket would refuse.
      torch::optim::SGD sgd(params, torch::optim::SGDOptions(0.1));
      EXPECT_NO_THROW(sgd.zero_grad());
    };
    EXPECT_TRUE((backend == "hier"
                     ? RunCommWorld({0, 0, 1}, backend, GradientCompression::kNone, body)
                     : RunCommWorld(3, backend, body))
                    .ok())
        << backend;
  }
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

// Rounds smaller than a tensor, and cutting through tensors and their
// padding, still move every byte; a tensor a rank holds equal already is
// not written (its version stays), and a non-contiguous one takes its bytes.
TEST(BroadcastTensorsTest, InRoundsSmallerThanATensorEveryByteArrives) {
  const torch::Tensor big = torch::arange(37, torch::kFloat32) * 1.5f;
  const torch::Tensor same = torch::arange(5, torch::kInt64);
  const torch::Tensor odd = torch::arange(3, torch::kInt16) - 7;
  const torch::Tensor grid = torch::arange(12, torch::kFloat64).reshape({3, 4});
  ASSERT_TRUE(RunCommWorld(3, "shm", [&](int rank, Communicator* comm) {
    const bool root = rank == 2;
    std::vector<torch::Tensor> mine = {root ? big.clone() : torch::zeros_like(big), same.clone(),
                                       root ? odd.clone() : torch::zeros_like(odd),
                                       (root ? grid.clone() : torch::zeros({4, 3}, torch::kFloat64))};
    if (!root) mine[3] = mine[3].t();  // the same shape, not contiguous
    const int64_t version = mine[1]._version();
    ASSERT_TRUE(BroadcastTensors(mine, comm, /*root=*/2, absl::Now() + absl::Seconds(30),
                                 /*keep_equal=*/true, /*chunk=*/24)
                    .ok());
    EXPECT_TRUE(torch::equal(mine[0], big)) << "rank " << rank;
    EXPECT_TRUE(torch::equal(mine[1], same)) << "rank " << rank;
    EXPECT_EQ(mine[1]._version(), version) << "rank " << rank << ": an equal tensor was written";
    EXPECT_TRUE(torch::equal(mine[2], odd)) << "rank " << rank;
    EXPECT_TRUE(torch::equal(mine[3], grid)) << "rank " << rank;
  }).ok());
}

// A world of one broadcasts nothing: its tensors already hold the root's
// bytes, so the communicator is not called (on the GPU a call made the host
// wait for the step's kernels before every optimizer step). A root that is
// not a rank is still refused by the communicator.
TEST(BroadcastTensorsTest, AWorldOfOneCallsNoCollective) {
  class Counting : public ForwardingCommunicator {
   public:
    using ForwardingCommunicator::ForwardingCommunicator;
    absl::Status Broadcast(void* data, size_t count, DataType type, int root,
                           absl::Time deadline) override {
      ++broadcasts;
      return ForwardingCommunicator::Broadcast(data, count, type, root, deadline);
    }
    int broadcasts = 0;
  };
  Counting comm(NewSingleRankCommunicator(MemorySpace::Host()));
  std::vector<torch::Tensor> tensors = {torch::arange(5, torch::kFloat32),
                                        torch::full({3}, 7, torch::kInt64)};
  const std::vector<torch::Tensor> before = {tensors[0].clone(), tensors[1].clone()};
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  ASSERT_TRUE(BroadcastTensors(tensors, &comm, /*root=*/0, deadline).ok());
  EXPECT_EQ(comm.broadcasts, 0);
  EXPECT_TRUE(torch::equal(tensors[0], before[0]));
  EXPECT_TRUE(torch::equal(tensors[1], before[1]));
  EXPECT_TRUE(absl::IsInvalidArgument(BroadcastTensors(tensors, &comm, /*root=*/1, deadline)));
}

// When the ranks' state differs after a transfer, the error names the
// registered entries that differ, not only that something does.
TEST(StateDigestTest, ADifferenceNamesTheEntriesThatDiffer) {
  ASSERT_TRUE(RunCommWorld(2, "shm", [&](int rank, Communicator* comm) {
    torch::nn::Linear model(3, 2);
    {
      torch::NoGradGuard no_grad;
      for (torch::Tensor& p : model->parameters()) p.fill_(0.5);
    }
    const std::string bytes = rank == 0 ? "seven" : "eight";  // a blob that differs
    TrainingState ts = TrainingState::Of(model.ptr().get(), nullptr);
    ts.blobs = {{"counter", [&] { return bytes; },
                 [](const std::string&) { return absl::OkStatus(); }}};
    const absl::Status s = CheckSameState(ts, {4, 5}, comm, absl::Now() + absl::Seconds(30));
    EXPECT_TRUE(absl::IsDataLoss(s)) << s;
    EXPECT_NE(s.message().find("blob counter"), std::string::npos) << s;
    EXPECT_EQ(s.message().find("model"), std::string::npos) << "the model is equal: " << s;
  }).ok());
}

// The contract check itself: a buffer outside the communicator's memory (a
// page this process cannot read, as a GPU's memory is under unified
// addressing) is refused with a message naming it, before any peer is
// involved, and the communicator keeps working.
TEST(MemoryCheckTest, RefusesABufferOutsideTheCommunicatorsMemory) {
  void* unreadable = ::mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(unreadable, MAP_FAILED);
  ASSERT_TRUE(RunCommWorld(2, "shm", [&](int rank, Communicator* comm) {
    EXPECT_TRUE(comm->memory().is_host());
    absl::Status s = comm->AllReduce(unreadable, 16, DataType::kFloat32, ReduceOp::kSum,
                                     absl::Now() + absl::Seconds(30));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("not in host memory"), absl::string_view::npos) << s;
    std::vector<float> ok(16, static_cast<float>(rank + 1));
    ASSERT_TRUE(comm->AllReduce(ok.data(), ok.size(), DataType::kFloat32, ReduceOp::kSum,
                                absl::Now() + absl::Seconds(30))
                    .ok());
    EXPECT_EQ(ok[0], 3.0f);
  }).ok());
  ::munmap(unreadable, 4096);
}

// Tensors reach a communicator in its memory: a host communicator
// all-reduces a CPU float64 tensor in place, and a dtype no collective
// reduces is refused by name.
TEST(DeviceCommTest, AllReduceTensorReducesInPlaceInTheCommunicatorsMemory) {
  ASSERT_TRUE(RunCommWorld(2, "gloo", [&](int rank, Communicator* comm) {
    EXPECT_EQ(CommDevice(*comm), torch::Device(torch::kCPU));
    torch::Tensor t = torch::full({5}, rank + 1.0, torch::kFloat64);
    ASSERT_TRUE(AllReduceTensor(comm, t, ReduceOp::kAverage, absl::Now() + absl::Seconds(30)).ok());
    EXPECT_TRUE(torch::equal(t, torch::full({5}, 1.5, torch::kFloat64)));
    torch::Tensor b = torch::ones({3}, torch::kBool);
    EXPECT_EQ(AllReduceTensor(comm, b, ReduceOp::kSum, absl::Now() + absl::Seconds(30)).code(),
              absl::StatusCode::kInvalidArgument);
  }).ok());
}

}  // namespace
}  // namespace muster
