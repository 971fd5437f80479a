// Training equivalence: W trainers (threads, real coordinator, real
// communicators, real LibTorch) with batch B each end with the same
// parameters as one process with batch W*B, for several bucket sizes.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <mutex>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "muster/muster.h"
#include "tests/integration/coordinator_fixture.h"
#include "tests/integration/quiet_options.h"
#include "tests/integration/subprocess.h"
#include "trainer/checkpoint/safetensors.h"
#include "trainer/data/dataset.h"
#include "trainer/lib/launch_options.h"
#include "trainer/train/trainer.h"

namespace muster {
namespace {

std::vector<TrainResult> Train(int world, int nodes, int batch, size_t bucket_bytes,
                               const std::string& model, Backend backend, bool overlap = true,
                               int compute_ms = 0) {
  auto server = InProcessCoordinator::Start(world);
  std::vector<TrainResult> results(world);
  std::vector<std::thread> threads;
  for (int i = 0; i < world; ++i) {
    threads.emplace_back([&, i] {
      TrainOptions o;
      o.library.coordinator = "127.0.0.1:" + std::to_string(server->port());
      o.library.node_id = "node" + std::to_string(i * nodes / world);
      o.library.local_rank = i;
      o.library.backend = backend;
      o.library.job = "eq" + std::to_string(::getpid());
      o.library.address = "127.0.0.1";
      o.model = model;
      o.library.batch_per_rank = batch;
      o.library.steps = 20;
      o.lr = 0.05;
      o.lr_scaling = "none";
      o.warmup_steps = 0;
      o.library.bucket_mb = static_cast<double>(bucket_bytes) / (1 << 20);
      o.library.overlap = overlap;
      o.compute_ms = compute_ms;
      o.library.intra_op_threads = 1;
      o.library.quiet = true;
      o.library.handle_signals = false;  // ranks are threads
      auto r = RunTraining(o, RealClock::Get());
      ASSERT_TRUE(r.ok()) << r.status();
      results[r->rank] = std::move(*r);
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

double MaxDiff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, (a[i] - b[i]).abs().max().item<double>());
  return m;
}

class EquivalenceTest : public ::testing::TestWithParam<std::tuple<int, int, size_t>> {};

TEST_P(EquivalenceTest, SameParametersAsOneProcessOnTheGlobalBatch) {
  const auto [world, nodes, bucket] = GetParam();
  if (!LoadFashionMnist(kDefaultFashionMnistDir, true).ok()) {
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  }
  const int batch = 16;
  auto reference = Train(1, 1, batch * world, 25u << 20, "mlp", Backend::kShm);
  auto distributed = Train(world, nodes, batch, bucket, "mlp",
                           nodes > 1 ? Backend::kHier : Backend::kShm);
  ASSERT_EQ(reference[0].steps, 20);
  for (const TrainResult& r : distributed) {
    EXPECT_EQ(r.steps, 20);
    EXPECT_LT(MaxDiff(r.parameters, reference[0].parameters), 1e-5) << "rank " << r.rank;
    EXPECT_EQ(MaxDiff(r.parameters, distributed[0].parameters), 0.0) << "ranks differ";
  }
}

INSTANTIATE_TEST_SUITE_P(
    WorldsAndBuckets, EquivalenceTest,
    ::testing::Values(std::make_tuple(2, 1, size_t{25} << 20), std::make_tuple(4, 2, size_t{25} << 20),
                      std::make_tuple(2, 1, size_t{4096}),   // tiny: a bucket per tensor
                      std::make_tuple(2, 2, size_t{1} << 30)  // larger than the model
                      ));

TEST(TrainTest, NoOverlapBaselineGivesTheSameResult) {
  if (!LoadFashionMnist(kDefaultFashionMnistDir, true).ok()) GTEST_SKIP();
  auto a = Train(2, 1, 16, 1u << 20, "cnn", Backend::kShm, /*overlap=*/true);
  auto b = Train(2, 1, 16, 1u << 20, "cnn", Backend::kShm, /*overlap=*/false);
  EXPECT_LT(MaxDiff(a[0].parameters, b[0].parameters), 1e-6);
}

// Distributed::step_timeline: the program's 30 ms between backward and
// AfterBackward show in its backward phase, on every rank, over every step
// but the first; the gradients' reduction is timed, and nothing is gathered
// without sharded optimizer state.
TEST(StepTimelineTest, AStepsPhasesAreTimedWhereTheProgramSpendsThem) {
  if (!LoadFashionMnist(kDefaultFashionMnistDir, true).ok()) GTEST_SKIP();
  const auto results = Train(2, 1, 16, 1u << 20, "mlp", Backend::kShm, /*overlap=*/true,
                             /*compute_ms=*/30);
  for (const TrainResult& r : results) {
    const StepTimeline& t = r.timeline;
    EXPECT_EQ(t.steps, 19) << "rank " << r.rank;
    EXPECT_GE(t.backward_ms, 30) << "rank " << r.rank;
    EXPECT_LT(t.forward_ms, t.backward_ms) << "rank " << r.rank;
    EXPECT_GE(t.step_ms, t.backward_ms) << "rank " << r.rank;
    EXPECT_GT(t.reduce_ms, 0) << "rank " << r.rank;
    EXPECT_EQ(t.gather_ms, 0) << "rank " << r.rank;
  }
}

// Start's contract for a user's program: bad learning-rate options and an
// optimizer muster cannot carry are refused with INVALID_ARGUMENT naming the
// field, before anything connects.
TEST(StartTest, WhatCannotApplyIsRefusedByName) {
  torch::nn::Linear model(4, 2);
  Options o;
  o.coordinator = "127.0.0.1:1";
  o.dataset_size = 64;
  o.batch_per_rank = 8;
  o.handle_signals = false;
  o.quiet = true;
  o.group_lr_schedule = [](const Progress&, size_t) { return 0.1; };
  State no_optimizer;
  no_optimizer.model = model.ptr().get();
  auto started = Distributed::Start(o, no_optimizer);
  ASSERT_TRUE(absl::IsInvalidArgument(started.status())) << started.status();
  EXPECT_NE(started.status().message().find("group_lr_schedule"), std::string::npos);
  EXPECT_EQ(Distributed::ExitCode(started.status()), Distributed::kExitConfig);

  // An optimizer of the program's own, without a codec.
  struct Mine : torch::optim::Optimizer {
    using Optimizer::Optimizer;
    torch::Tensor step(LossClosure) override { return {}; }
  };
  struct MineOptions : torch::optim::OptimizerCloneableOptions<MineOptions> {
    double lr = 0.1;
    double get_lr() const override { return lr; }
    void set_lr(const double v) override { lr = v; }
  };
  Mine mine({torch::optim::OptimizerParamGroup(model->parameters())},
            std::make_unique<MineOptions>());
  State with_mine = no_optimizer;
  with_mine.optimizer = &mine;
  o.group_lr_schedule = nullptr;
  started = Distributed::Start(o, with_mine);
  ASSERT_TRUE(absl::IsInvalidArgument(started.status())) << started.status();
  EXPECT_NE(started.status().message().find("optimizer_codec"), std::string::npos);

  // A clipping norm that is no norm.
  for (double bad : {-1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    o.clip_grad_norm = bad;
    started = Distributed::Start(o, no_optimizer);
    ASSERT_TRUE(absl::IsInvalidArgument(started.status())) << bad;
    EXPECT_NE(started.status().message().find("clip_grad_norm must be 0 (no clipping) or a "
                                              "positive finite norm"),
              std::string::npos)
        << started.status();
  }
}

// Options::intra_op_threads: 0 shares the CPUs among the node's trainers
// (at least one each) unless $OMP_NUM_THREADS speaks, N is N, -1 is never
// touched; below -1 is refused by name.
TEST(IntraOpThreadsTest, SharedAmongTheNodesTrainersUnlessToldOtherwise) {
  EXPECT_EQ(IntraOpThreads(0, 16, 4, false), 4);
  EXPECT_EQ(IntraOpThreads(0, 16, 3, false), 5);
  EXPECT_EQ(IntraOpThreads(0, 2, 4, false), 1);
  EXPECT_EQ(IntraOpThreads(0, 8, 0, false), 8);
  EXPECT_EQ(IntraOpThreads(0, 16, 4, true), -1);
  EXPECT_EQ(IntraOpThreads(3, 16, 4, true), 3);
  EXPECT_EQ(IntraOpThreads(-1, 16, 4, false), -1);
  EXPECT_GE(UsableCpus(), 1);
  Options o;
  o.dataset_size = 64;
  o.batch_per_rank = 8;
  for (int n : {-1, 0, 1, 64}) {
    o.intra_op_threads = n;
    EXPECT_TRUE(o.Validate().ok()) << n;
  }
  o.intra_op_threads = -2;
  const absl::Status invalid = o.Validate();
  EXPECT_TRUE(absl::IsInvalidArgument(invalid));
  EXPECT_NE(invalid.message().find("intra_op_threads"), std::string::npos) << invalid;
}

// The reference BLAS is told from the optimized ones by the resolved path
// of the library that defines sgemm_: Debian's alternatives and Fedora's.
TEST(IsReferenceBlasTest, OnlyANetlibLibblasCounts) {
  EXPECT_TRUE(IsReferenceBlas("/usr/lib/x86_64-linux-gnu/blas/libblas.so.3.11.0"));
  EXPECT_TRUE(IsReferenceBlas("/usr/lib64/libblas.so.3.9.0"));
  EXPECT_FALSE(IsReferenceBlas("/usr/lib/x86_64-linux-gnu/openblas-openmp/libblas.so.3"));
  EXPECT_FALSE(IsReferenceBlas("/usr/lib/x86_64-linux-gnu/blis-pthread/libblas.so.3"));
  EXPECT_FALSE(IsReferenceBlas("/usr/lib/x86_64-linux-gnu/atlas/libblas.so.3.10.3"));
  EXPECT_FALSE(IsReferenceBlas("/usr/lib64/libopenblasp.so.0"));
  EXPECT_FALSE(IsReferenceBlas("/opt/torch/lib/libtorch_cpu.so"));
  EXPECT_FALSE(IsReferenceBlas(""));
}

// Options::gradient_compression is validated once: the three values pass,
// anything else is refused with INVALID_ARGUMENT naming the field, by
// Validate and by Start before anything connects.
TEST(StartTest, AnUnknownGradientCompressionIsRefusedByName) {
  Options o = QuietOptions(/*port=*/1, "refused");  // nothing listens: refused before connecting
  for (GradientCompression c :
       {GradientCompression::kNone, GradientCompression::kBf16, GradientCompression::kFp16}) {
    o.gradient_compression = c;
    EXPECT_TRUE(o.Validate().ok()) << GradientCompressionName(c);
  }
  o.gradient_compression = static_cast<GradientCompression>(3);
  const absl::Status invalid = o.Validate();
  EXPECT_TRUE(absl::IsInvalidArgument(invalid)) << invalid;
  EXPECT_NE(invalid.message().find("gradient_compression"), std::string::npos) << invalid;
  torch::nn::Linear model(4, 2);
  State state;
  state.model = model.ptr().get();
  auto started = Distributed::Start(o, state);
  ASSERT_TRUE(absl::IsInvalidArgument(started.status())) << started.status();
  EXPECT_NE(started.status().message().find("gradient_compression"), std::string::npos);
}

// Sharded optimizer state is refused before anything connects where it
// cannot be: a count of copies other than 1 or 2 (Validate), reduce-scatter
// without sharded state, and an optimizer whose step is not per element
// (LBFGS), named.
TEST(StartTest, ShardingIsRefusedByNameWhereItCannotBe) {
  Options o = QuietOptions(/*port=*/1, "refused");  // nothing listens: refused before connecting
  o.shard_optimizer_state = true;
  o.optimizer_state_copies = 3;
  const absl::Status copies = o.Validate();
  EXPECT_TRUE(absl::IsInvalidArgument(copies)) << copies;
  EXPECT_NE(copies.message().find("optimizer_state_copies"), std::string::npos) << copies;
  o.optimizer_state_copies = 2;
  // Reduce-scatter gives each rank the average of the parts it steps:
  // unsharded it steps them all.
  o.reduce_scatter_gradients = true;
  o.shard_optimizer_state = false;
  const absl::Status scatter = o.Validate();
  EXPECT_TRUE(absl::IsInvalidArgument(scatter)) << scatter;
  EXPECT_NE(scatter.message().find("reduce_scatter_gradients needs shard_optimizer_state"),
            std::string::npos)
      << scatter;
  o.shard_optimizer_state = true;
  for (int copies : {1, 2}) {
    o.optimizer_state_copies = copies;
    EXPECT_TRUE(o.Validate().ok()) << copies << " copies";
  }
  o.reduce_scatter_gradients = false;
  torch::nn::Linear model(4, 2);
  torch::optim::LBFGS lbfgs(model->parameters(), torch::optim::LBFGSOptions(0.1));
  State state;
  state.model = model.ptr().get();
  state.optimizer = &lbfgs;
  auto started = Distributed::Start(o, state);
  ASSERT_TRUE(absl::IsInvalidArgument(started.status())) << started.status();
  EXPECT_NE(started.status().message().find("shard_optimizer_state"), std::string::npos)
      << started.status();
  EXPECT_NE(started.status().message().find("LBFGS"), std::string::npos) << started.status();
}

// Options::lr_schedule keeps the ratio between parameter groups (it used to
// set one rate on every group), and the rates in effect are what
// learning_rates() says.
TEST(StartTest, TheScheduleKeepsEachGroupsRatio) {
  auto server = InProcessCoordinator::Start(1);
  torch::nn::Sequential model(torch::nn::Linear(4, 8), torch::nn::Linear(8, 2));
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(model[0]->parameters(),
                      std::make_unique<torch::optim::AdamWOptions>(1e-3));
  groups.emplace_back(model[1]->parameters(),
                      std::make_unique<torch::optim::AdamWOptions>(1e-2));
  torch::optim::AdamW optimizer(groups, torch::optim::AdamWOptions(1e-3));
  Options o = QuietOptions(server->port(), "ratio" + std::to_string(::getpid()));
  o.steps = 2;
  o.lr_schedule = [](const Progress& p) { return 5e-4 / (1 + p.step); };
  State state;
  state.model = model.ptr().get();
  state.optimizer = &optimizer;
  auto job = Distributed::Start(o, state);
  ASSERT_TRUE(job.ok()) << job.status();
  Distributed& d = **job;
  for (int step = 0; !d.ShouldStop(); ++step) {
    const double first = 5e-4 / (1 + step);
    ASSERT_EQ(d.learning_rates().size(), 2u);
    EXPECT_DOUBLE_EQ(d.learning_rates()[0], first);
    EXPECT_DOUBLE_EQ(d.learning_rates()[1], 10 * first);
    EXPECT_DOUBLE_EQ(optimizer.param_groups()[1].options().get_lr(), 10 * first);
    optimizer.zero_grad();
    d.BeforeBackward();
    model->forward(torch::ones({8, 4})).sum().backward();
    ASSERT_TRUE(d.AfterBackward().ok());
    optimizer.step();
  }
  EXPECT_EQ(Distributed::ExitCode(d.Finish()), 0);
}

// The library's lines for people go to the sink the program chose, none to
// its standard output (they used to be written to std::cout).
TEST(StartTest, LinesForPeopleGoToTheProgramsSink) {
  auto server = InProcessCoordinator::Start(1);
  torch::nn::Linear model(4, 2);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
  Options o = QuietOptions(server->port(), "sink" + std::to_string(::getpid()));
  o.quiet = false;
  o.steps = 4;
  o.log_every = 2;
  std::vector<std::string> lines;
  o.output = [&lines](std::string_view line) { lines.emplace_back(line); };
  State state;
  state.model = model.ptr().get();
  state.optimizer = &optimizer;
  testing::internal::CaptureStdout();
  auto job = Distributed::Start(o, state);
  ASSERT_TRUE(job.ok()) << job.status();
  Distributed& d = **job;
  while (!d.ShouldStop()) {
    optimizer.zero_grad();
    d.BeforeBackward();
    model->forward(torch::ones({8, 4})).sum().backward();
    ASSERT_TRUE(d.AfterBackward().ok());
    optimizer.step();
  }
  EXPECT_EQ(Distributed::ExitCode(d.Finish()), 0);
  EXPECT_EQ(testing::internal::GetCapturedStdout(), "");
  ASSERT_EQ(lines.size(), 3u) << absl::StrJoin(lines, "\n");
  EXPECT_TRUE(absl::StartsWith(lines[0], "muster: generation 1, world 1 on 1 nodes")) << lines[0];
  EXPECT_TRUE(absl::StartsWith(lines[1], "step 2/4 ")) << lines[1];
  EXPECT_TRUE(absl::StartsWith(lines[2], "step 4/4 ")) << lines[2];
}

// Options of rank `i` of node "n" in `job`, on the coordinator at `port`,
// for `steps` steps.
Options RankOfNodeN(int port, const std::string& job, int i, int64_t steps) {
  Options o = QuietOptions(port, job);
  o.node_id = "n";
  o.local_rank = i;
  o.steps = steps;
  return o;
}

// A job of `o` training `model` alone.
absl::StatusOr<std::unique_ptr<Distributed>> StartModel(const Options& o,
                                                        torch::nn::Linear& model) {
  State state;
  state.model = model.ptr().get();
  return Distributed::Start(o, state);
}

// One synchronised pass of `model`, a Linear(4, 2), on ones.
absl::Status OnesPass(Distributed& d, torch::nn::Linear& model) {
  d.BeforeBackward();
  model->forward(torch::ones({8, 4})).sum().backward();
  return d.AfterBackward();
}

// An evaluation between steps may keep one rank far longer than a step
// takes: AllReduceSum waits for it (it used to take the step's collective
// timeout, call the late rank hung and regroup, again at every retry).
TEST(StartTest, AllReduceSumWaitsForARankThatEvaluatesLongerThanAStep) {
  auto server = InProcessCoordinator::Start(2);
  std::vector<std::thread> ranks;
  for (int i = 0; i < 2; ++i) {
    ranks.emplace_back([&, i] {
      torch::nn::Linear model(4, 2);
      Options o = RankOfNodeN(server->port(), "eval" + std::to_string(::getpid()), i, 3);
      o.collective_timeout_s = 0.5;
      auto job = StartModel(o, model);
      ASSERT_TRUE(job.ok()) << job.status();
      Distributed& d = **job;
      while (!d.ShouldStop()) {
        ASSERT_TRUE(OnesPass(d, model).ok());
      }
      if (d.rank() == 1) absl::SleepFor(absl::Seconds(2));  // a longer evaluation
      absl::StatusOr<std::vector<double>> sum = d.AllReduceSum({1.0});
      ASSERT_TRUE(sum.ok()) << sum.status();
      EXPECT_EQ((*sum)[0], 2.0);
      EXPECT_EQ(d.regroups(), 0);
      EXPECT_EQ(Distributed::ExitCode(d.Finish()), 0);
    });
  }
  for (std::thread& t : ranks) t.join();
}

// A rank lost while the others sum between steps: they regroup and are
// told ABORTED, and a second sum before the next ShouldStop is refused
// (FAILED_PRECONDITION) without a collective, for a replacement would be in
// the training loop, not in the evaluation; after ShouldStop they sum again.
TEST(StartTest, AfterASumThatRegroupedNoneIsTakenUntilTheNextStep) {
  auto server = InProcessCoordinator::Start(3, 3, "", /*min_members=*/2);
  std::vector<std::thread> ranks;
  for (int i = 0; i < 3; ++i) {
    ranks.emplace_back([&, i] {
      torch::nn::Linear model(4, 2);
      Options o = RankOfNodeN(server->port(), "lost-eval" + std::to_string(::getpid()), i, 3);
      auto job = StartModel(o, model);
      ASSERT_TRUE(job.ok()) << job.status();
      Distributed& d = **job;
      while (d.step() < 2 && !d.ShouldStop()) {
        ASSERT_TRUE(OnesPass(d, model).ok());
      }
      if (i == 2) {  // lost in the evaluation: gone without a word
        absl::SleepFor(absl::Milliseconds(500));
        job->reset();
        return;
      }
      absl::StatusOr<std::vector<double>> sum = d.AllReduceSum({1.0});
      EXPECT_TRUE(absl::IsAborted(sum.status())) << sum.status();
      EXPECT_NE(sum.status().message().find("skip it"), std::string::npos) << sum.status();
      sum = d.AllReduceSum({1.0});
      EXPECT_TRUE(absl::IsFailedPrecondition(sum.status())) << sum.status();
      while (!d.ShouldStop()) {
        ASSERT_TRUE(OnesPass(d, model).ok());
      }
      sum = d.AllReduceSum({1.0});
      ASSERT_TRUE(sum.ok()) << sum.status();
      EXPECT_EQ((*sum)[0], 2.0);
      EXPECT_EQ(Distributed::ExitCode(d.Finish()), 0);
    });
  }
  for (std::thread& t : ranks) t.join();
}

// Early stopping: one rank decides, between steps, that the job is done
// (here rank 1 after step 5, as a patience counter on a held-out loss
// would) and asks to finish. Every rank ends after the same step, the
// next one, as finished (exit 0, not a stop's 75), and the coordinator
// marks the job finished: a trainer that comes later, as a requeued job's
// would, is told so (no world for this trainer: the job has finished) and
// ends at once without training.
TEST(StartTest, AFinishAskedByOneRankEndsEveryRankAtTheSameStepAsFinished) {
  auto server = InProcessCoordinator::Start(2);
  const std::string job_name = "finish" + std::to_string(::getpid());
  std::vector<std::thread> ranks;
  std::vector<int64_t> steps(2, -1);
  for (int i = 0; i < 2; ++i) {
    ranks.emplace_back([&, i] {
      torch::nn::Linear model(4, 2);
      Options o = RankOfNodeN(server->port(), job_name, i, 100);
      auto job = StartModel(o, model);
      ASSERT_TRUE(job.ok()) << job.status();
      Distributed& d = **job;
      while (!d.ShouldStop()) {
        ASSERT_TRUE(OnesPass(d, model).ok());
        if (d.rank() == 1 && d.step() == 5) d.RequestFinish();
      }
      EXPECT_TRUE(d.finished());
      steps[i] = d.step();
      const absl::StatusOr<Distributed::Outcome> outcome = d.Finish();
      ASSERT_TRUE(outcome.ok()) << outcome.status();
      EXPECT_EQ(*outcome, Distributed::Outcome::kFinished);
      EXPECT_EQ(Distributed::ExitCode(outcome), 0);
    });
  }
  for (std::thread& t : ranks) t.join();
  EXPECT_EQ(steps[0], 6);
  EXPECT_EQ(steps[1], 6);

  torch::nn::Linear model(4, 2);
  Options o = QuietOptions(server->port(), job_name);
  o.node_id = "m";
  o.steps = 100;
  o.join_timeout_s = 10;
  auto late = StartModel(o, model);
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_TRUE((*late)->ShouldStop()) << "a trainer trains a finished job";
  EXPECT_EQ((*late)->step(), 0);
  EXPECT_EQ(Distributed::ExitCode((*late)->Finish()), 0);
}

// A job token the coordinator refuses (none, or another job's) is a
// configuration error: exit 78, which muster-agent does not restart.
TEST(ExitCodeTest, ARefusedJobTokenIsNotRestarted) {
  EXPECT_EQ(Distributed::ExitCode(absl::UnauthenticatedError("missing job token")),
            Distributed::kExitConfig);
  EXPECT_EQ(Distributed::ExitCode(absl::UnavailableError("connection refused")),
            Distributed::kExitError);
}

// A model declared as a plain object, as pytorch/examples' mnist.cpp
// declares its `Net model;`, not held by a shared_ptr, trains as any other.
TEST(StartTest, AModelThatIsAPlainObjectTrains) {
  auto server = InProcessCoordinator::Start(2);
  std::vector<std::thread> ranks;
  std::vector<torch::Tensor> weights(2);
  for (int i = 0; i < 2; ++i) {
    ranks.emplace_back([&, i] {
      torch::manual_seed(i);  // unequal at first: the start makes them equal
      torch::nn::LinearImpl model(4, 2);
      torch::optim::SGD optimizer(model.parameters(), 0.1);
      Options o = QuietOptions(server->port(), "plain" + std::to_string(::getpid()));
      o.node_id = "n";
      o.local_rank = i;
      o.steps = 3;
      State state;
      state.model = &model;
      state.optimizer = &optimizer;
      auto job = Distributed::Start(o, state);
      ASSERT_TRUE(job.ok()) << job.status();
      Distributed& d = **job;
      while (!d.ShouldStop()) {
        optimizer.zero_grad();
        d.BeforeBackward();
        model.forward(torch::full({8, 4}, d.rank() + 1.0)).sum().backward();
        ASSERT_TRUE(d.AfterBackward().ok());
        optimizer.step();
      }
      EXPECT_EQ(Distributed::ExitCode(d.Finish()), 0);
      weights[i] = model.weight.detach().clone();
    });
  }
  for (std::thread& t : ranks) t.join();
  ASSERT_TRUE(weights[0].defined() && weights[1].defined());
  EXPECT_TRUE(torch::equal(weights[0], weights[1]));
}

// State::modules and State::optimizers: what cannot be carried is refused
// by name before anything connects.
TEST(StartTest, SeveralModelsThatCannotBeCarriedAreRefusedByName) {
  torch::nn::Linear a(4, 2), b(2, 1);
  torch::optim::SGD oa(a->parameters(), torch::optim::SGDOptions(0.1));
  torch::optim::SGD ab(std::vector<torch::Tensor>{a->weight, b->weight},
                       torch::optim::SGDOptions(0.1));
  Options o;
  o.coordinator = "127.0.0.1:1";
  o.dataset_size = 64;
  o.batch_per_rank = 8;
  o.handle_signals = false;
  o.quiet = true;
  const auto refused = [&](const State& state, const std::string& named) {
    auto started = Distributed::Start(o, state);
    EXPECT_TRUE(absl::IsInvalidArgument(started.status())) << started.status();
    EXPECT_NE(started.status().message().find(named), std::string::npos) << started.status();
  };
  State state;
  refused(state, "State::modules is empty");
  state.modules = {{"gen", a.ptr().get()}, {"gen", b.ptr().get()}};
  refused(state, "'gen'");
  state.modules = {{"gen.0", a.ptr().get()}};
  refused(state, "'gen.0'");
  state.modules = {{"gen", nullptr}};
  refused(state, "'gen' is null");
  state.modules = {{"gen", a.ptr().get()}, {"again", a.ptr().get()}};
  refused(state, "module 'again' is module 'gen' again");
  state.modules = {{"gen", a.ptr().get()}, {"disc", b.ptr().get()}};
  state.optimizers = {{"gen", &oa}, {"both", &ab}};
  refused(state, "update the same parameter 'gen/weight'");
  state.optimizers = {{"gen", &oa}, {"gen", &oa}};
  refused(state, "State::optimizers: 'gen'");
}

// Two models, two optimizers and two synchronised passes per step (a GAN's
// shape), beside a frozen teacher: two ranks end bit-identical to each
// other and, within rounding, where one process on the global batch ends.
// The teacher is carried and never changes; a pass naming no module ends
// the run with INVALID_ARGUMENT naming it.
struct TwoModels {
  TwoModels()
      : gen(torch::nn::Linear(4, 4)),
        disc(torch::nn::Linear(4, 1)),
        teacher(torch::nn::Linear(4, 4)),
        g_opt(gen->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9)),
        d_opt(disc->parameters(), torch::optim::AdamOptions(1e-2)) {
    for (torch::Tensor& p : teacher->parameters()) p.set_requires_grad(false);
  }
  State state() {
    State s;
    s.modules = {{"generator", gen.ptr().get()},
                 {"discriminator", disc.ptr().get()},
                 {"teacher", teacher.ptr().get()}};
    s.optimizers = {{"generator", &g_opt}, {"discriminator", &d_opt}};
    return s;
  }
  // One step on examples `idx`: the discriminator's pass, then the
  // generator's. False when a pass failed.
  bool Step(Distributed& d, const std::vector<int64_t>& idx) {
    const torch::Tensor x = torch::tensor(idx, torch::kFloat32).unsqueeze(1) *
                            torch::arange(1, 5, torch::kFloat32) / 64;
    d_opt.zero_grad();
    torch::Tensor loss_d = (disc(x) - 1).pow(2).mean() + disc(gen(x).detach()).pow(2).mean();
    d.BeforeBackwardFor({"discriminator"});
    loss_d.backward();
    if (!d.AfterBackward().ok()) return false;
    d_opt.step();
    g_opt.zero_grad();
    torch::Tensor loss_g = (disc(gen(x)) - 1).pow(2).mean() + (gen(x) - teacher(x)).pow(2).mean();
    d.BeforeBackwardFor({"generator"});
    loss_g.backward();
    if (!d.AfterBackward().ok()) return false;
    g_opt.step();
    return true;
  }
  std::vector<torch::Tensor> Parameters() {
    std::vector<torch::Tensor> out;
    for (auto* m : {gen.ptr().get(), disc.ptr().get(), teacher.ptr().get()}) {
      for (const torch::Tensor& p : m->parameters()) out.push_back(p.detach().clone());
    }
    return out;
  }
  torch::nn::Linear gen, disc, teacher;
  torch::optim::SGD g_opt;
  torch::optim::Adam d_opt;
};

struct TwoModelsRun {
  std::vector<torch::Tensor> parameters;
  uint64_t digest = 0;
  int64_t steps = 0;
};

std::vector<TwoModelsRun> TrainTwoModels(int world, int batch) {
  auto server = InProcessCoordinator::Start(world);
  std::vector<TwoModelsRun> out(world);
  std::vector<std::thread> ranks;
  std::mutex rng;  // one global generator: each rank's models drawn whole
  for (int i = 0; i < world; ++i) {
    ranks.emplace_back([&, i] {
      std::unique_lock<std::mutex> drawing(rng);
      torch::manual_seed(1);
      TwoModels m;
      drawing.unlock();
      Options o = QuietOptions(server->port(), absl::StrCat("two", ::getpid(), "w", world));
      o.node_id = "n";
      o.local_rank = i;
      o.dataset_size = 96;
      o.batch_per_rank = batch;
      o.steps = 6;
      auto job = Distributed::Start(o, m.state());
      ASSERT_TRUE(job.ok()) << job.status();
      Distributed& d = **job;
      while (!d.ShouldStop()) ASSERT_TRUE(m.Step(d, d.Batch()));
      out[d.rank()] = {m.Parameters(), d.StateDigest(), d.step()};
      EXPECT_EQ(Distributed::ExitCode(d.Finish()), 0);
    });
  }
  for (std::thread& t : ranks) t.join();
  return out;
}

TEST(SeveralModelsTest, TwoPassesPerStepOnTwoRanksEndAsOneProcessOnTheGlobalBatch) {
  torch::manual_seed(1);
  const std::vector<torch::Tensor> initial = TwoModels().Parameters();
  const std::vector<TwoModelsRun> one = TrainTwoModels(1, 16);
  const std::vector<TwoModelsRun> two = TrainTwoModels(2, 8);
  ASSERT_EQ(one[0].steps, 6);
  ASSERT_EQ(two[0].steps, 6);
  EXPECT_EQ(two[0].digest, two[1].digest);
  EXPECT_EQ(MaxDiff(two[0].parameters, two[1].parameters), 0.0) << "ranks differ";
  EXPECT_LT(MaxDiff(two[0].parameters, one[0].parameters), 1e-5);
  // Both models trained; the teacher (the last two tensors) did not move.
  const size_t n = initial.size();
  EXPECT_GT(MaxDiff({initial[0], initial[2]}, {two[0].parameters[0], two[0].parameters[2]}), 1e-4);
  EXPECT_EQ(MaxDiff({initial[n - 2], initial[n - 1]},
                    {two[0].parameters[n - 2], two[0].parameters[n - 1]}),
            0.0);
}

// A language model's output projection tied to its token embedding, as
// LibTorch users tie it: the module registers the embedding's tensor a
// second time. One parameter under two names: accepted, reduced once,
// checkpointed once (under the first name LibTorch lists), and two ranks end as one
// process on the global batch. An optimizer given the tensor twice would
// step it twice: refused by name.
struct TiedLmImpl : torch::nn::Module {
  TiedLmImpl()
      : tok(register_module("tok", torch::nn::Embedding(16, 8))),
        mix(register_module("mix", torch::nn::Linear(8, 8))) {
    head_weight = register_parameter("head_weight", tok->weight);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return torch::linear(torch::tanh(mix(tok(x))), head_weight);
  }
  torch::nn::Embedding tok;
  torch::nn::Linear mix;
  torch::Tensor head_weight;
};
TORCH_MODULE(TiedLm);

std::vector<torch::Tensor> EachParameterOnce(torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  for (const torch::Tensor& p : m.parameters()) {
    const bool seen = std::any_of(out.begin(), out.end(), [&](const torch::Tensor& q) {
      return q.unsafeGetTensorImpl() == p.unsafeGetTensorImpl();
    });
    if (!seen) out.push_back(p);
  }
  return out;
}

std::vector<TwoModelsRun> TrainTiedLm(int world, int batch, const std::string& checkpoint_dir) {
  auto server = InProcessCoordinator::Start(world);
  std::vector<TwoModelsRun> out(world);
  std::vector<std::thread> ranks;
  for (int i = 0; i < world; ++i) {
    ranks.emplace_back([&, i] {
      TiedLm lm;
      torch::NoGradGuard same_start;
      for (torch::Tensor& p : EachParameterOnce(*lm)) p.copy_(torch::linspace(-1, 1, p.numel()).view_as(p));
      torch::optim::AdamW opt(EachParameterOnce(*lm), torch::optim::AdamWOptions(1e-2));
      Options o = QuietOptions(server->port(), absl::StrCat("tied", ::getpid(), "w", world));
      o.node_id = "n";
      o.local_rank = i;
      o.batch_per_rank = batch;
      o.steps = 6;
      o.checkpoint_dir = checkpoint_dir;
      o.checkpoint_every = 3;
      State state;
      state.model = lm.ptr().get();
      state.optimizer = &opt;
      auto job = Distributed::Start(o, state);
      ASSERT_TRUE(job.ok()) << job.status();
      Distributed& d = **job;
      while (!d.ShouldStop()) {
        torch::AutoGradMode grad(true);
        const torch::Tensor idx = torch::tensor(d.Batch(), torch::kInt64);
        torch::Tensor loss = torch::nn::functional::cross_entropy(lm(idx % 16), (idx * 3 + 1) % 16);
        opt.zero_grad();
        d.BeforeBackward();
        loss.backward();
        ASSERT_TRUE(d.AfterBackward().ok());
        opt.step();
      }
      std::vector<torch::Tensor> params;
      for (const torch::Tensor& p : EachParameterOnce(*lm)) params.push_back(p.detach().clone());
      out[d.rank()] = {params, d.StateDigest(), d.step()};
      EXPECT_EQ(lm->head_weight.unsafeGetTensorImpl(), lm->tok->weight.unsafeGetTensorImpl());
      EXPECT_EQ(Distributed::ExitCode(d.Finish()), 0);
    });
  }
  for (std::thread& t : ranks) t.join();
  return out;
}

TEST(TiedWeightTest, AWeightUnderTwoNamesTrainsAsOneProcessAndIsCheckpointedOnce) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/tied", ::getpid());
  const std::vector<TwoModelsRun> one = TrainTiedLm(1, 16, "");
  const std::vector<TwoModelsRun> two = TrainTiedLm(2, 8, dir);
  ASSERT_EQ(one[0].steps, 6);
  ASSERT_EQ(two[0].steps, 6);
  EXPECT_EQ(two[0].digest, two[1].digest);
  EXPECT_LT(MaxDiff(two[0].parameters, one[0].parameters), 1e-5);
  auto file = ParseSafetensors(ReadText(dir + "/step-6/model.safetensors"), "model");
  ASSERT_TRUE(file.ok()) << file.status();
  // Under the name LibTorch lists first: the module's own before its
  // children's.
  EXPECT_EQ(file->tensors.count("param.head_weight"), 1u);
  EXPECT_EQ(file->tensors.count("param.tok.weight"), 0u) << "the tied weight is stored twice";
  EXPECT_EQ(file->tensors.size(), 3u);  // head_weight, mix.weight, mix.bias
  std::filesystem::remove_all(dir);

  TiedLm lm;
  torch::optim::AdamW twice(lm->parameters(), torch::optim::AdamWOptions(1e-2));
  State state;
  state.model = lm.ptr().get();
  state.optimizer = &twice;
  auto refused = Distributed::Start(QuietOptions(1, "twice"), state);
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
  EXPECT_NE(refused.status().message().find("lists the parameter 'head_weight' twice"),
            std::string::npos)
      << refused.status();
}

TEST(SeveralModelsTest, APassNamingNoModuleEndsTheRunByName) {
  auto server = InProcessCoordinator::Start(1);
  TwoModels m;
  Options o = QuietOptions(server->port(), "nomodule" + std::to_string(::getpid()));
  o.steps = 2;
  auto job = Distributed::Start(o, m.state());
  ASSERT_TRUE(job.ok()) << job.status();
  Distributed& d = **job;
  ASSERT_FALSE(d.ShouldStop());
  d.BeforeBackwardFor({"critic"});
  absl::Status s = d.AfterBackward();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("no module 'critic' in State::modules (generator, discriminator, "
                             "teacher)"),
            std::string::npos)
      << s;
  EXPECT_TRUE(d.ShouldStop());
  d.Finish().IgnoreError();
}

// Options::clip_grad_norm, as a program that clips its gradients uses it:
// four ranks on two nodes train a small network with SGD and momentum
// (whose steps scale with the gradients), clipping every
// step's averaged gradients to a norm below theirs.
struct ClipRun {
  std::vector<torch::Tensor> parameters;
  std::vector<double> norms;  // each step's norm before clipping
  uint64_t digest = 0;
  int64_t steps = 0;
};

constexpr double kClipNorm = 0.02;

// `option`: muster clips (Options::clip_grad_norm); else the program calls
// clip_grad_norm_ after AfterBackward when `program_clips`. `copies` 0:
// unsharded; else sharded with that many copies and reduce-scattered.
// `log_dir`: rank 0's metrics, every step.
std::vector<ClipRun> TrainClipped(bool option, bool program_clips, int copies,
                                  const std::string& log_dir = "") {
  constexpr int kWorld = 4;
  auto server = InProcessCoordinator::Start(kWorld);
  std::vector<ClipRun> out(kWorld);
  std::vector<std::thread> ranks;
  std::mutex rng;
  for (int i = 0; i < kWorld; ++i) {
    ranks.emplace_back([&, i] {
      std::unique_lock<std::mutex> drawing(rng);
      torch::manual_seed(3);
      torch::nn::Sequential model(torch::nn::Linear(8, 32), torch::nn::Tanh(),
                                  torch::nn::Linear(32, 4));
      drawing.unlock();
      torch::optim::SGD optimizer(model->parameters(),
                                  torch::optim::SGDOptions(0.2).momentum(0.9));
      Options o = QuietOptions(server->port(), absl::StrCat("clip", ::getpid(), option,
                                                             program_clips, copies));
      o.node_id = absl::StrCat("n", i / 2);
      o.local_rank = i % 2;
      o.backend = Backend::kHier;
      o.steps = 12;
      o.clip_grad_norm = option ? kClipNorm : 0;
      o.shard_optimizer_state = copies > 0;
      o.optimizer_state_copies = std::max(copies, 1);
      o.reduce_scatter_gradients = copies > 0;
      o.log_dir = log_dir;
      o.log_every = 1;
      State state;
      state.model = model.ptr().get();
      state.optimizer = &optimizer;
      auto job = Distributed::Start(o, state);
      ASSERT_TRUE(job.ok()) << job.status();
      Distributed& d = **job;
      ClipRun& run = out[static_cast<size_t>(i)];
      while (!d.ShouldStop()) {
        const torch::Tensor idx = torch::tensor(d.Batch(), torch::kFloat32).unsqueeze(1);
        const torch::Tensor x = torch::sin(idx * torch::arange(1, 9, torch::kFloat32) / 7);
        const torch::Tensor y = torch::cos(idx * torch::arange(1, 5, torch::kFloat32) / 5);
        optimizer.zero_grad();
        const torch::Tensor loss = torch::mse_loss(model->forward(x), y);
        d.BeforeBackward();
        loss.backward();
        ASSERT_TRUE(d.AfterBackward().ok());
        run.norms.push_back(program_clips
                                ? torch::nn::utils::clip_grad_norm_(model->parameters(), kClipNorm)
                                : d.last_gradient_norm());
        optimizer.step();
      }
      for (const torch::Tensor& p : model->parameters()) {
        run.parameters.push_back(p.detach().clone());
      }
      run.digest = d.StateDigest();
      run.steps = d.step();
      EXPECT_EQ(Distributed::ExitCode(d.Finish()), 0);
    });
  }
  for (std::thread& t : ranks) t.join();
  return out;
}

// The option clips as the program's own clip_grad_norm_ does, bit for bit
// where the .grad hold the averages; reduce-scattered (one copy, and two
// copies on two nodes of two) within float32 rounding of it, every rank
// the same bits. Without clipping the run ends elsewhere, so the clipping
// acted (every step's norm is above the limit). Rank 0's metrics carry
// each step's norm as "grad_norm".
TEST(ClipGradNormTest, ClipsAsTheProgramsOwnClipWhetherAllReducedOrScattered) {
  const std::string logs = absl::StrCat(::testing::TempDir(), "/clip", ::getpid());
  const std::vector<ClipRun> program = TrainClipped(false, true, 0);
  const std::vector<ClipRun> option = TrainClipped(true, false, 0, logs);
  const std::vector<ClipRun> unclipped = TrainClipped(false, false, 0);
  ASSERT_EQ(program[0].steps, 12);
  ASSERT_EQ(program[0].norms.size(), 12u);
  for (double norm : program[0].norms) EXPECT_GT(norm, 2 * kClipNorm);
  EXPECT_GT(MaxDiff(unclipped[0].parameters, program[0].parameters), 1e-3);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(option[r].norms, program[0].norms) << "rank " << r;
    EXPECT_EQ(MaxDiff(option[r].parameters, program[0].parameters), 0.0) << "rank " << r;
  }
  const std::string metrics = ReadText(logs + "/metrics.jsonl");
  EXPECT_NE(metrics.find("{\"step\": 12, "), std::string::npos) << metrics;
  EXPECT_NE(metrics.find(absl::StrFormat("\"grad_norm\": %.8g", program[0].norms.back())),
            std::string::npos)
      << metrics;
  std::filesystem::remove_all(logs);
  for (int copies : {1, 2}) {
    const std::vector<ClipRun> scattered = TrainClipped(true, false, copies);
    ASSERT_EQ(scattered[0].steps, 12) << copies;
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(scattered[r].digest, scattered[0].digest) << copies << " copies, rank " << r;
      EXPECT_EQ(scattered[r].norms, scattered[0].norms) << copies << " copies, rank " << r;
      EXPECT_LT(MaxDiff(scattered[r].parameters, program[0].parameters), 1e-5)
          << copies << " copies, rank " << r;
    }
    for (size_t k = 0; k < program[0].norms.size(); ++k) {
      EXPECT_NEAR(scattered[0].norms[k], program[0].norms[k], 1e-5 * program[0].norms[k])
          << copies << " copies, step " << k + 1;
    }
  }
}

// muster::GradScaler registered as State::grad_scaler, four ranks on two
// nodes with AdamW: at step 4 rank 1's gradient of its last bias is inf.
// Every
// rank skips that step and only that one, halves the same scale and grows
// it after 3 good steps, and ends with the same digest (the scaler's state
// is in it); whole, sharded with two copies and reduce-scattered with one,
// where each rank steps only its own parts and so sees the inf only through
// the world's verdict. The three end within float32 rounding of each other.
struct ScaledRun {
  std::vector<bool> stepped;
  std::vector<double> scales;  // after each update
  std::vector<torch::Tensor> parameters;
  uint64_t digest = 0;
};

std::vector<ScaledRun> TrainScaled(int copies, bool reduce_scatter) {
  constexpr int kWorld = 4;
  auto server = InProcessCoordinator::Start(kWorld);
  std::vector<ScaledRun> out(kWorld);
  std::vector<std::thread> ranks;
  std::mutex rng;
  for (int i = 0; i < kWorld; ++i) {
    ranks.emplace_back([&, i] {
      std::unique_lock<std::mutex> drawing(rng);
      torch::manual_seed(5);
      torch::nn::Sequential model(torch::nn::Linear(8, 32), torch::nn::Tanh(),
                                  torch::nn::Linear(32, 4));
      drawing.unlock();
      torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-2));
      GradScalerOptions so;
      so.growth_interval = 3;
      GradScaler scaler(so);
      Options o = QuietOptions(server->port(),
                               absl::StrCat("scaled", ::getpid(), copies, reduce_scatter));
      o.node_id = absl::StrCat("n", i / 2);
      o.local_rank = i % 2;
      o.backend = Backend::kHier;
      o.steps = 10;
      o.shard_optimizer_state = copies > 0;
      o.optimizer_state_copies = std::max(copies, 1);
      o.reduce_scatter_gradients = reduce_scatter;
      State state;
      state.model = model.ptr().get();
      state.optimizer = &optimizer;
      state.grad_scaler = &scaler;
      auto job = Distributed::Start(o, state);
      ASSERT_TRUE(job.ok()) << job.status();
      Distributed& d = **job;
      ScaledRun& run = out[static_cast<size_t>(i)];
      while (!d.ShouldStop()) {
        const torch::Tensor idx = torch::tensor(d.Batch(), torch::kFloat32).unsqueeze(1);
        const torch::Tensor x = torch::sin(idx * torch::arange(1, 9, torch::kFloat32) / 7);
        const torch::Tensor y = torch::cos(idx * torch::arange(1, 5, torch::kFloat32) / 5);
        optimizer.zero_grad();
        torch::Tensor loss = torch::mse_loss(model->forward(x), y);
        // At step 4 the gradient of rank 1's last bias overflows (only
        // those 4 elements: one rank's part where the state is sharded).
        if (d.rank() == 1 && d.step() == 4) {
          loss = loss + model->parameters()[3].sum() * std::numeric_limits<float>::infinity();
        }
        d.BeforeBackward();
        scaler.scale(loss).backward();
        ASSERT_TRUE(d.AfterBackward().ok());
        scaler.unscale_(optimizer);
        run.stepped.push_back(scaler.step(optimizer));
        scaler.update();
        run.scales.push_back(scaler.get_scale());
      }
      for (const torch::Tensor& p : model->parameters()) {
        run.parameters.push_back(p.detach().clone());
      }
      run.digest = d.StateDigest();
      EXPECT_EQ(scaler.skipped_steps(), 1) << "rank " << d.rank();
      EXPECT_EQ(Distributed::ExitCode(d.Finish()), 0);
    });
  }
  for (std::thread& t : ranks) t.join();
  return out;
}

TEST(GradScalerTest, AnInfOnOneRankSkipsTheSameStepOnEveryRankShardedOrNot) {
  std::vector<bool> expected(10, true);
  expected[4] = false;
  const std::vector<ScaledRun> whole = TrainScaled(0, false);
  for (auto [copies, scatter] : {std::pair{0, false}, {2, false}, {1, true}}) {
    const std::vector<ScaledRun> runs = copies == 0 ? whole : TrainScaled(copies, scatter);
    for (int r = 0; r < 4; ++r) {
      const std::string where = absl::StrCat(copies, " copies, rank ", r);
      EXPECT_EQ(runs[r].stepped, expected) << where;
      EXPECT_EQ(runs[r].scales, runs[0].scales) << where;
      EXPECT_EQ(runs[r].digest, runs[0].digest) << where;
      EXPECT_LT(MaxDiff(runs[r].parameters, whole[0].parameters), 1e-5) << where;
    }
    ASSERT_EQ(runs[0].scales.size(), 10u);
    EXPECT_EQ(runs[0].scales[2], 2 * 65536.0) << "grown after 3 good steps";
    EXPECT_EQ(runs[0].scales[4], runs[0].scales[3] / 2) << "backed off after the inf";
  }
}

// Distributed::UpcomingBatch, what muster::DataLoader fetches ahead: after
// ShouldStop, the share k steps ahead is the Batch() that step gets (the
// world stays); from AfterBackward on, the schedule has moved past the
// step, and it gives nothing rather than shares counted from the next one.
TEST(UpcomingBatchTest, NamesTheSharesOfTheStepsAheadUntilAfterBackward) {
  auto server = InProcessCoordinator::Start(1);
  torch::nn::Linear model(2, 1);
  Options o = QuietOptions(server->port(), "upcoming" + std::to_string(::getpid()));
  o.steps = 6;
  State state;
  state.model = model.ptr().get();
  auto job = Distributed::Start(o, state);
  ASSERT_TRUE(job.ok()) << job.status();
  Distributed& d = **job;
  std::vector<std::vector<int64_t>> batches, one_ahead, two_ahead;
  while (!d.ShouldStop()) {
    batches.push_back(d.Batch());
    one_ahead.push_back(d.UpcomingBatch(1));
    two_ahead.push_back(d.UpcomingBatch(2));
    d.BeforeBackward();
    model(torch::ones({static_cast<int64_t>(d.Batch().size()), 2})).sum().backward();
    ASSERT_TRUE(d.AfterBackward().ok());
    EXPECT_TRUE(d.UpcomingBatch(1).empty()) << "step " << batches.size();
  }
  ASSERT_EQ(batches.size(), 6u);
  for (size_t s = 0; s < 6; ++s) {
    EXPECT_EQ(one_ahead[s], s + 1 < 6 ? batches[s + 1] : std::vector<int64_t>()) << s;
    EXPECT_EQ(two_ahead[s], s + 2 < 6 ? batches[s + 2] : std::vector<int64_t>()) << s;
  }
  d.Finish().IgnoreError();
}

// Options::join_timeout_s bounds how long Start tries an unreachable
// coordinator (it used to take two minutes whatever the program wanted).
TEST(StartTest, AnUnreachableCoordinatorFailsStartWithinTheJoinTimeout) {
  torch::nn::Linear model(4, 2);
  Options o;
  o.coordinator = "127.0.0.1:" + std::to_string(FreeLoopbackPort());
  o.dataset_size = 64;
  o.batch_per_rank = 8;
  o.handle_signals = false;
  o.quiet = true;
  o.state_listen = "";
  o.join_timeout_s = 2;
  State state;
  state.model = model.ptr().get();
  const absl::Time start = absl::Now();
  auto started = Distributed::Start(o, state);
  EXPECT_FALSE(started.ok());
  EXPECT_TRUE(absl::IsUnavailable(started.status()) || absl::IsDeadlineExceeded(started.status()))
      << started.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << started.status();
}

}  // namespace
}  // namespace muster
