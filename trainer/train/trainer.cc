#include "trainer/train/trainer.h"

#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/lines.h"
#include "common/status_macros.h"
#include "muster/muster.h"
#include "trainer/data/dataset.h"
#include "trainer/models/models.h"

namespace muster {
namespace {

absl::StatusOr<std::unique_ptr<Dataset>> LoadData(const TrainOptions& o, bool train) {
  if (o.dataset == "fashion-mnist") {
    return LoadFashionMnist(o.data_dir.empty() ? kDefaultFashionMnistDir : o.data_dir, train);
  }
  if (o.dataset == "synthetic") {
    return NewSyntheticDataset(train ? o.synthetic_examples : o.synthetic_examples / 6,
                               o.synthetic_channels, o.synthetic_size, o.synthetic_size, 10);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dataset '", o.dataset, "' (fashion-mnist, synthetic)"));
}

// Images and labels of `indices` as tensors.
std::pair<torch::Tensor, torch::Tensor> Batch(const Dataset& data,
                                              const std::vector<int64_t>& indices,
                                              const torch::Device& device) {
  const int64_t n = static_cast<int64_t>(indices.size());
  torch::Tensor x = torch::empty({n, data.channels(), data.height(), data.width()});
  torch::Tensor y = torch::empty({n}, torch::kInt64);
  data.Fill(indices.data(), n, x.data_ptr<float>(), y.data_ptr<int64_t>());
  return {x.to(device), y.to(device)};
}

absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> MakeOptimizer(
    const TrainOptions& o, std::vector<torch::Tensor> params) {
  if (o.optimizer == "adamw") {
    return std::unique_ptr<torch::optim::Optimizer>(std::make_unique<torch::optim::AdamW>(
        params, torch::optim::AdamWOptions(o.lr).weight_decay(o.weight_decay)));
  }
  if (o.optimizer == "sgd") {
    return std::unique_ptr<torch::optim::Optimizer>(std::make_unique<torch::optim::SGD>(
        params,
        torch::optim::SGDOptions(o.lr).momentum(o.momentum).weight_decay(o.weight_decay)));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown optimizer '", o.optimizer, "' (sgd, adamw)"));
}

// The peak rate (linear scaling: times the world size the library says the
// rate is scaled for), linear warm-up, then cosine decay to 10% at the end.
double ScheduledLr(const TrainOptions& o, const Progress& p) {
  const double peak = o.lr * (o.lr_scaling == "linear" ? p.lr_world_size : 1);
  if (o.warmup_steps > 0 && p.step < o.warmup_steps) {
    return peak * static_cast<double>(p.step + 1) / o.warmup_steps;
  }
  if (p.total_steps <= o.warmup_steps) return peak;
  const double t = std::min(
      1.0, static_cast<double>(p.step - o.warmup_steps) / (p.total_steps - o.warmup_steps));
  return peak * (0.1 + 0.9 * 0.5 * (1.0 + std::cos(M_PI * t)));
}

// The library's options with what this program knows once its data and
// optimizer are built.
Options LibraryOptions(const TrainOptions& o, int64_t dataset_size) {
  Options lib = o.library;
  lib.dataset_size = dataset_size;
  lib.lr_schedule = [o](const Progress& p) { return ScheduledLr(o, p); };
  lib.model_name = o.model;
  lib.optimizer_name = o.optimizer;
  return lib;
}

struct Evaluation {
  double loss = 0;
  double accuracy = 0;
};

// Loss and accuracy over the whole test set: each rank takes a contiguous
// shard; sums are all-reduced. ABORTED: the world regrouped meanwhile.
absl::StatusOr<Evaluation> Evaluate(Net& model, const Dataset& test, Distributed& dist,
                                    const torch::Device& device) {
  torch::NoGradGuard no_grad;
  model.eval();
  const int64_t n = test.size();
  const int64_t lo = n * dist.rank() / dist.world_size();
  const int64_t hi = n * (dist.rank() + 1) / dist.world_size();
  std::vector<double> sums = {0, 0, 0};  // loss sum, correct, count
  std::vector<int64_t> idx;
  // Batches of at most 1000 examples and about 64 MB of input: an
  // evaluation costs no more memory than a few steps' batches.
  const int64_t example_bytes =  // Batch's float32
      std::max<int64_t>(1, test.example_floats() * static_cast<int64_t>(sizeof(float)));
  const int64_t per_batch = std::clamp<int64_t>((int64_t{64} << 20) / example_bytes, 1, 1000);
  for (int64_t start = lo; start < hi; start += per_batch) {
    idx.clear();
    for (int64_t i = start; i < std::min(hi, start + per_batch); ++i) idx.push_back(i);
    auto [x, y] = Batch(test, idx, device);
    torch::Tensor logits = model.forward(x);
    sums[0] += torch::cross_entropy_loss(logits, y, {}, at::Reduction::Sum).item<double>();
    sums[1] += logits.argmax(1).eq(y).sum().item<double>();
    sums[2] += static_cast<double>(idx.size());
  }
  model.train();
  MUSTER_ASSIGN_OR_RETURN(sums, dist.AllReduceSum(sums));
  return Evaluation{sums[0] / std::max(1.0, sums[2]), sums[1] / std::max(1.0, sums[2])};
}

// Evaluates and logs; retries after a regroup until a world completes it.
// Where muster-train's own lines go: the program's sink, else stdout.
LineSink Output(const TrainOptions& o) {
  return o.library.output ? o.library.output : StandardOutput();
}

// Evaluates and logs (to `say`, unless it is empty); retries after a regroup
// until a world completes it.
absl::StatusOr<Evaluation> EvaluateAndLog(Net& model, const Dataset& test, Distributed& dist,
                                          const torch::Device& device, const LineSink& say) {
  absl::StatusOr<Evaluation> ev = Evaluate(model, test, dist, device);
  while (absl::IsAborted(ev.status())) ev = Evaluate(model, test, dist, device);
  MUSTER_RETURN_IF_ERROR(ev.status());
  dist.LogScalars({{"test_loss", ev->loss}, {"test_accuracy", ev->accuracy}});
  if (say && dist.rank() == 0) {
    say(absl::StrFormat("eval step %d: test loss %.4f accuracy %.2f%%", dist.step(), ev->loss,
                        100 * ev->accuracy));
  }
  return ev;
}

std::shared_ptr<Net> SeededModel(const TrainOptions& o, const Dataset& train,
                                 absl::Status* status) {
  // The global generator is shared by threads (trainers as threads in
  // tests): seed and initialise in one piece.
  static std::mutex init_mu;
  std::lock_guard<std::mutex> lock(init_mu);
  torch::manual_seed(o.library.seed);
  auto model = MakeModel(o.model, {train.channels(), train.height(), train.width(), 10});
  *status = model.status();
  return model.ok() ? *model : nullptr;
}

// The loop a user writes: the library decides when it ends.
absl::Status TrainLoop(const TrainOptions& o, Net& model, torch::optim::Optimizer& optimizer,
                       const Dataset& train, const Dataset& test, Distributed& dist,
                       const torch::Device& device, Clock* clock, std::vector<double>* step_ms) {
  model.train();
  // Every `eval_every` steps, on every rank of the world alike (it is a
  // collective). With sharded optimizer state the model is whole again
  // only at the step boundary, so the evaluation comes after ShouldStop
  // (a joiner entering at such a step evaluates it with the others);
  // otherwise right after the step, where every rank has just taken it.
  const bool after_boundary = o.library.shard_optimizer_state;
  int64_t evaluated_at = -1;
  auto evaluate = [&]() -> absl::Status {
    if (o.eval_every <= 0 || dist.step() == evaluated_at || dist.step() % o.eval_every != 0 ||
        dist.step() >= dist.progress().total_steps) {
      return absl::OkStatus();
    }
    evaluated_at = dist.step();
    return EvaluateAndLog(model, test, dist, device, o.library.quiet ? LineSink() : Output(o))
        .status();
  };
  while (true) {
    // With time_steps: everything but loading the batch and evaluating, the
    // library's work at the step boundary included.
    absl::Time started = clock->Now();
    if (dist.ShouldStop()) break;
    if (after_boundary && dist.step() > 0) {
      const absl::Time evaluating = clock->Now();
      MUSTER_RETURN_IF_ERROR(evaluate());
      started += clock->Now() - evaluating;
    }
    const absl::Time loading = clock->Now();
    auto [x, y] = Batch(train, dist.Batch(), device);
    started += clock->Now() - loading;
    torch::Tensor loss;
    const int64_t parts = std::min<int64_t>(std::max(1, o.backward_calls), x.size(0));
    if (parts <= 1) {
      loss = torch::cross_entropy_loss(model.forward(x), y);
      optimizer.zero_grad();
      dist.BeforeBackward();
      loss.backward();
    } else {
      // Each part's mean, weighted by its share: the parts sum to the
      // batch's mean loss, and .grad to its gradient.
      optimizer.zero_grad();
      dist.BeforeBackward();
      const std::vector<torch::Tensor> xs = x.chunk(parts), ys = y.chunk(parts);
      loss = torch::zeros({}, x.options().dtype(torch::kFloat32));
      for (size_t i = 0; i < xs.size(); ++i) {
        torch::Tensor part = torch::cross_entropy_loss(model.forward(xs[i]), ys[i]) *
                             (static_cast<double>(xs[i].size(0)) / static_cast<double>(x.size(0)));
        part.backward();
        loss = loss + part.detach();
      }
    }
    if (o.compute_ms > 0) absl::SleepFor(absl::Milliseconds(o.compute_ms));
    if (absl::Status s = dist.AfterBackward(); !s.ok()) {
      if (absl::IsAborted(s)) continue;  // dropped; the world regrouped
      return s;
    }
    optimizer.step();
    if (o.time_steps) {
      // The step's GPU work included, as a PyTorch loop timed the same way.
      if (device.is_cuda()) torch::cuda::synchronize(device.index());
      step_ms->push_back(absl::ToDoubleMilliseconds(clock->Now() - started));
    }
    dist.RecordLoss(loss.item<double>());
    if (!after_boundary) MUSTER_RETURN_IF_ERROR(evaluate());
  }
  return absl::OkStatus();
}

// The figures muster-train reports (and tests compare) after the loop.
void Summarize(Net& model, Distributed& dist, double elapsed, int64_t first_step,
               TrainResult* result) {
  const Progress p = dist.progress();
  result->rank = p.rank;
  result->world_size = p.world_size;
  result->steps = p.step;
  result->steps_per_second = (p.step - first_step) / std::max(elapsed, 1e-9);
  result->samples_per_second = result->steps_per_second * p.global_batch;
  result->comm_overlap_pct = dist.comm_overlap_pct();
  result->timeline = dist.step_timeline();
  result->intra_op_threads = at::get_num_threads();
  result->regroups = dist.regroups();
  result->steps_salvaged = dist.steps_salvaged();
  result->steps_dropped = dist.steps_dropped();
  result->resumed_from_step = dist.resumed_from_step();
  result->optimizer_state_elements = dist.optimizer_state_elements();
  result->memory = dist.memory_account();
  result->last_gradient_norm = dist.last_gradient_norm();
  torch::NoGradGuard no_grad;
  // The parameters themselves (the storage outlives the model), and their
  // checksum a piece at a time: the summary costs no copy of the model.
  constexpr int64_t kPiece = int64_t{1} << 20;
  for (const torch::Tensor& t : model.parameters()) {
    result->parameters.push_back(t.detach().cpu());
    const torch::Tensor flat = t.detach().reshape({-1});
    for (int64_t at = 0; at < flat.numel(); at += kPiece) {
      const torch::Tensor piece = flat.narrow(0, at, std::min(kPiece, flat.numel() - at));
      result->parameter_checksum += piece.to(torch::kFloat64).abs().sum().item<double>();
    }
  }
}

}  // namespace

TrainResult::TrainResult() = default;
TrainResult::~TrainResult() = default;
TrainResult::TrainResult(TrainResult&&) = default;
TrainResult& TrainResult::operator=(TrainResult&&) = default;
TrainResult::TrainResult(const TrainResult&) = default;
TrainResult& TrainResult::operator=(const TrainResult&) = default;

absl::StatusOr<TrainResult> RunTraining(const TrainOptions& o, Clock* clock) {
  MUSTER_ASSIGN_OR_RETURN(const torch::Device device, TrainingDevice(o.library));
  // cuDNN's fastest convolution backward sums in a nondeterministic order.
  if (o.deterministic) at::globalContext().setDeterministicCuDNN(true);
  // LibTorch's threads: Start shares the node's CPUs among its trainers
  // (Options::intra_op_threads).
  MUSTER_ASSIGN_OR_RETURN(std::unique_ptr<Dataset> train, LoadData(o, /*train=*/true));
  MUSTER_ASSIGN_OR_RETURN(std::unique_ptr<Dataset> test, LoadData(o, /*train=*/false));
  absl::Status made;
  std::shared_ptr<Net> model = SeededModel(o, *train, &made);
  MUSTER_RETURN_IF_ERROR(made);
  model->to(device);
  MUSTER_ASSIGN_OR_RETURN(std::unique_ptr<torch::optim::Optimizer> optimizer,
                          MakeOptimizer(o, model->parameters()));
  State state;
  state.model = model.get();
  state.optimizer = optimizer.get();
  MUSTER_ASSIGN_OR_RETURN(std::unique_ptr<Distributed> dist,
                          Distributed::Start(LibraryOptions(o, train->size()), state));
  const absl::Time start = clock->Now();
  const int64_t first_step = dist->step();
  std::vector<double> step_ms;
  MUSTER_RETURN_IF_ERROR(
      TrainLoop(o, *model, *optimizer, *train, *test, *dist, device, clock, &step_ms));
  const double elapsed = absl::ToDoubleSeconds(clock->Now() - start);
  TrainResult result;
  if (dist->finished()) {
    MUSTER_ASSIGN_OR_RETURN(Evaluation ev,
                            EvaluateAndLog(*model, *test, *dist, device, LineSink()));
    result.test_loss = ev.loss;
    result.test_accuracy = ev.accuracy;
  }
  Summarize(*model, *dist, elapsed, first_step, &result);
  if (!step_ms.empty()) {
    // The mean and median of the steady state: the first steps warm up
    // caches, the allocator and the libraries' kernel choices.
    result.step_ms_warmup = step_ms.size() > 40 ? 20 : 0;
    std::vector<double> steady(step_ms.begin() + result.step_ms_warmup, step_ms.end());
    for (double ms : steady) result.step_ms_mean += ms / static_cast<double>(steady.size());
    std::sort(steady.begin(), steady.end());
    result.step_ms_p50 = steady[steady.size() / 2];
  }
  MUSTER_ASSIGN_OR_RETURN(Distributed::Outcome outcome, dist->Finish());
  result.checkpoints_committed = dist->checkpoints_committed();
  result.stopped = outcome == Distributed::Outcome::kStopped;
  result.exit_code = Distributed::ExitCode(outcome);
  result.left = outcome == Distributed::Outcome::kLeft;
  if (outcome == Distributed::Outcome::kFinished && result.rank == 0 && !o.library.quiet) {
    Output(o)(absl::StrFormat(
        "done: %d steps in %.1f s (%.0f samples/s); test loss %.4f, test accuracy %.2f%%%s",
        result.steps, elapsed, result.samples_per_second, result.test_loss,
        100 * result.test_accuracy,
        o.library.log_dir.empty() ? "" : absl::StrCat("; logs in ", o.library.log_dir)));
  }
  return result;
}

}  // namespace muster
