// muster::SyncBatchNorm in a real job (threads as ranks, the real
// coordinator and communicators): against LibTorch's BatchNorm2d in one
// process on the concatenated batch, with uneven shares and an empty one.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <iostream>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "muster/muster.h"
#include "muster/sync_batch_norm.h"
#include "tests/integration/coordinator_fixture.h"
#include "tests/integration/quiet_options.h"

namespace muster {
namespace {

constexpr int64_t kChannels = 3;

// The inputs of one step: rank r's rows are the concatenation's rows
// [start(r), start(r) + shares[r]); `weights` weigh the output into the
// loss, a sum (so that the world's loss is the sum of the ranks').
struct Batch {
  torch::Tensor inputs, weights;
  std::vector<int64_t> shares;
  torch::Tensor Rows(const torch::Tensor& t, int rank) const {
    int64_t start = 0;
    for (int r = 0; r < rank; ++r) start += shares[r];
    return t.narrow(0, start, shares[rank]);
  }
};

Batch MakeBatch(std::vector<int64_t> shares) {
  int64_t total = 0;
  for (int64_t n : shares) total += n;
  torch::manual_seed(7);
  Batch b;
  // Not centred, not unit: the statistics matter.
  b.inputs = torch::randn({total, kChannels, 4, 5}) * 3 + 2;
  b.weights = torch::randn({total, kChannels, 4, 5});
  b.shares = std::move(shares);
  return b;
}

// What one rank (or the one process) saw in a training step.
struct Seen {
  torch::Tensor output, input_grad, weight_grad, bias_grad, running_mean, running_var;
  int64_t batches_tracked = 0;
};

void SetAffine(torch::Tensor weight, torch::Tensor bias) {
  torch::NoGradGuard no_grad;
  weight.copy_(torch::tensor({0.5f, 1.5f, -1.0f}));
  bias.copy_(torch::tensor({0.1f, -0.2f, 0.3f}));
}

Seen OneProcess(const Batch& b) {
  torch::nn::BatchNorm2d bn(kChannels);
  SetAffine(bn->weight, bn->bias);
  torch::Tensor x = b.inputs.clone().requires_grad_(true);
  torch::Tensor y = bn(x);
  (y * b.weights).sum().backward();
  return {y.detach(), x.grad(), bn->weight.grad(), bn->bias.grad(), bn->running_mean.clone(),
          bn->running_var.clone(), bn->num_batches_tracked.item<int64_t>()};
}

// One step on each rank of a world of shares.size(); after it, rank 0
// alone evaluates (eval mode: running statistics, no collective).
std::vector<Seen> World(const Batch& b) {
  const int world = static_cast<int>(b.shares.size());
  auto server = InProcessCoordinator::Start(world);
  std::vector<Seen> seen(world);
  std::vector<std::thread> ranks;
  for (int i = 0; i < world; ++i) {
    ranks.emplace_back([&, i] {
      SyncBatchNorm bn(kChannels);
      SetAffine(bn->weight, bn->bias);
      torch::optim::SGD sgd(bn->parameters(), torch::optim::SGDOptions(0.0));
      Options o = QuietOptions(server->port(), absl::StrCat("sbn", ::getpid(), "w", world));
      o.node_id = "n";
      o.local_rank = i;
      o.steps = 1;
      State state;
      state.model = bn.ptr().get();
      state.optimizer = &sgd;
      auto job = Distributed::Start(o, state);
      ASSERT_TRUE(job.ok()) << job.status();
      Distributed& d = **job;
      const int rank = d.rank();
      Seen& mine = seen[rank];
      while (!d.ShouldStop()) {
        torch::Tensor x = b.Rows(b.inputs, rank).clone().requires_grad_(true);
        torch::Tensor y = bn(x);
        sgd.zero_grad();
        d.BeforeBackward();
        (y * b.Rows(b.weights, rank)).sum().backward();
        ASSERT_TRUE(d.AfterBackward().ok());
        mine = {y.detach(), x.grad(), bn->weight.grad().clone(), bn->bias.grad().clone(),
                bn->running_mean.clone(), bn->running_var.clone(),
                bn->num_batches_tracked.item<int64_t>()};
      }
      if (rank == 0) {  // evaluation on one rank: nobody else takes part
        bn->eval();
        torch::NoGradGuard no_grad;
        EXPECT_EQ(bn(b.inputs).size(0), b.inputs.size(0));
      }
      EXPECT_EQ(Distributed::ExitCode(d.Finish()), 0);
    });
  }
  for (std::thread& t : ranks) t.join();
  return seen;
}

double MaxDiff(const torch::Tensor& a, const torch::Tensor& b) {
  return a.numel() == 0 ? 0.0 : (a - b).abs().max().item<double>();
}

// Outputs and input gradients match one process on the concatenated batch
// within 1e-5, each rank on its own rows, the empty share included; the
// running statistics are the one process's on every rank; the parameter
// gradients are the one process's averaged over the world (each rank's
// own, then AfterBackward's average).
TEST(SyncBatchNormTest, UnevenSharesEndAsBatchNormOnTheConcatenatedBatch) {
  const Batch b = MakeBatch({5, 0, 3});
  const Seen one = OneProcess(b);
  const std::vector<Seen> world = World(b);
  const double w = static_cast<double>(world.size());
  double output = 0, input_grad = 0;
  for (int r = 0; r < static_cast<int>(world.size()); ++r) {
    output = std::max(output, MaxDiff(world[r].output, b.Rows(one.output, r)));
    input_grad = std::max(input_grad, MaxDiff(world[r].input_grad, b.Rows(one.input_grad, r)));
  }
  // Of the outputs and the gradients, against the one process's.
  constexpr double kTolerance = 1e-5;
  // One line for docs/benchmarks.md's table (deploy/bench_table.py, syncbn).
  std::cout << "syncbn ranks=" << world.size() << " output_max_diff=" << output
            << " input_grad_max_diff=" << input_grad << " tolerance=" << kTolerance << std::endl;
  for (int r = 0; r < static_cast<int>(world.size()); ++r) {
    const Seen& s = world[r];
    ASSERT_TRUE(s.output.defined()) << "rank " << r << " took no step";
    EXPECT_EQ(s.output.size(0), b.shares[r]);
    EXPECT_LE(MaxDiff(s.output, b.Rows(one.output, r)), kTolerance) << "rank " << r;
    EXPECT_LE(MaxDiff(s.input_grad, b.Rows(one.input_grad, r)), kTolerance) << "rank " << r;
    EXPECT_LE(MaxDiff(s.weight_grad, one.weight_grad / w), kTolerance) << "rank " << r;
    EXPECT_LE(MaxDiff(s.bias_grad, one.bias_grad / w), kTolerance) << "rank " << r;
    EXPECT_LE(MaxDiff(s.running_mean, one.running_mean), 1e-6) << "rank " << r;
    EXPECT_LE(MaxDiff(s.running_var, one.running_var), 1e-6) << "rank " << r;
    EXPECT_EQ(s.batches_tracked, 1);
    EXPECT_TRUE(torch::equal(s.running_mean, world[0].running_mean)) << "rank " << r;
    EXPECT_TRUE(torch::equal(s.running_var, world[0].running_var)) << "rank " << r;
  }
}

// Outside a job it is BatchNorm: the same outputs, gradients and running
// statistics, bit for bit; the same names, so either's state loads into
// the other; one value per channel in training is refused by name.
TEST(SyncBatchNormTest, OutsideAJobItIsBatchNorm) {
  const Batch b = MakeBatch({6});
  const Seen one = OneProcess(b);
  SyncBatchNorm bn(kChannels);
  SetAffine(bn->weight, bn->bias);
  torch::Tensor x = b.inputs.clone().requires_grad_(true);
  torch::Tensor y = bn(x);
  (y * b.weights).sum().backward();
  EXPECT_TRUE(torch::equal(y, one.output));
  EXPECT_TRUE(torch::equal(x.grad(), one.input_grad));
  EXPECT_TRUE(torch::equal(bn->weight.grad(), one.weight_grad));
  EXPECT_TRUE(torch::equal(bn->running_var, one.running_var));
  torch::nn::BatchNorm2d plain(kChannels);
  std::vector<std::string> names, plain_names;
  for (const auto& item : bn->named_parameters()) names.push_back(item.key());
  for (const auto& item : bn->named_buffers()) names.push_back(item.key());
  for (const auto& item : plain->named_parameters()) plain_names.push_back(item.key());
  for (const auto& item : plain->named_buffers()) plain_names.push_back(item.key());
  EXPECT_EQ(names, plain_names);
  try {
    bn(torch::randn({1, kChannels}));
    ADD_FAILURE() << "one value per channel was accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("more than 1 value per channel"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace muster
