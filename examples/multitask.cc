// A multi-task model made elastic with libmuster: a shared trunk and two
// heads, a classifier and a regressor, trained with Adam. As many multi-task
// programs do, each loss term gets its own backward call (the first keeps
// the graph for the second), and one optimizer step follows. muster reduces
// the sum of both: what .grad holds after AfterBackward is the world's
// average of each rank's whole local gradient, as if one backward had run on
// the sum of the losses.
//
// With --tasks alternate, a step trains one task, as programs that sample a
// task per step do: the classifier on even steps, the regressor on odd ones
// (decided from d.step()). The other head has no gradient in that step on
// any rank, and Adam leaves it alone, as it would in one process.
//
//   multitask [--steps N] [--batch N] [--tasks both|alternate]
//             [--checkpoint-dir D --checkpoint-every N]
//             [--summary FILE] [--parameters FILE] [--pace-ms N]
//
// --summary FILE writes the final state digest ({pid} in FILE is replaced);
// --parameters FILE writes rank 0's final parameters as text, one value per
// line (to compare a world of several ranks with one process that trains
// on the same global batches).
#include <muster/muster.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <string>
#include <thread>

namespace {

constexpr int64_t kExamples = 2048, kFeatures = 12, kClasses = 3;

// Example i: features from a generator seeded by i (the same on every rank),
// its class i % 3 shifting them, and a regression target from them.
struct Example {
  torch::Tensor x, label, target;
};
Example Get(int64_t i) {
  torch::Generator gen = at::detail::createCPUGenerator(static_cast<uint64_t>(i) + 7);
  const int64_t label = i % kClasses;
  torch::Tensor x = torch::randn({kFeatures}, gen) + static_cast<double>(label);
  return {x, torch::tensor(label), x.narrow(0, 0, 3).sum().unsqueeze(0)};
}

struct MultiTaskImpl : torch::nn::Module {
  MultiTaskImpl()
      : trunk(register_module("trunk", torch::nn::Sequential(torch::nn::Linear(kFeatures, 32),
                                                              torch::nn::ReLU()))),
        classify(register_module("classify", torch::nn::Linear(32, kClasses))),
        regress(register_module("regress", torch::nn::Linear(32, 1))) {}
  torch::nn::Sequential trunk;
  torch::nn::Linear classify, regress;
};
TORCH_MODULE(MultiTask);

std::string Flag(const std::map<std::string, std::string>& flag, const std::string& name,
                 const std::string& fallback) {
  auto it = flag.find(name);
  return it == flag.end() ? fallback : it->second;
}

std::string WithPid(std::string path) {
  if (auto at = path.find("{pid}"); at != std::string::npos) {
    path.replace(at, 5, std::to_string(::getpid()));
  }
  return path;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> flag;
  for (int i = 1; i + 1 < argc; i += 2) flag[argv[i]] = argv[i + 1];
  torch::set_num_threads(1);  // bit-identical runs: one reduction order
  torch::manual_seed(0);
  MultiTask model;
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(1e-3));

  muster::Options options;
  options.dataset_size = kExamples;
  options.batch_per_rank = std::stoi(Flag(flag, "--batch", "16"));
  options.steps = std::stoll(Flag(flag, "--steps", "200"));
  options.checkpoint_dir = Flag(flag, "--checkpoint-dir", "");
  options.checkpoint_every = std::stoi(Flag(flag, "--checkpoint-every", "0"));
  options.model_name = "multitask";
  muster::State state;
  state.model = model.ptr().get();
  state.optimizer = &optimizer;
  auto job = muster::Distributed::Start(options, state);
  if (!job.ok()) {
    std::cerr << "multitask: " << job.status() << "\n";
    return muster::Distributed::ExitCode(job.status());
  }
  muster::Distributed& d = **job;
  // Sums over this rank's share divided by the share's full size: the
  // world's average is then the mean over the global batch, whatever the
  // world size.
  const double per_rank = options.batch_per_rank;
  const int pace_ms = std::stoi(Flag(flag, "--pace-ms", "0"));
  const bool alternate = Flag(flag, "--tasks", "both") == "alternate";
  double loss_cls = 0, loss_reg = 0;
  while (!d.ShouldStop()) {
    const bool train_cls = !alternate || d.step() % 2 == 0;
    const bool train_reg = !alternate || d.step() % 2 == 1;
    optimizer.zero_grad();
    d.BeforeBackward();
    if (!d.Batch().empty()) {
      std::vector<torch::Tensor> xs, labels, targets;
      for (int64_t i : d.Batch()) {
        Example e = Get(i);
        xs.push_back(e.x);
        labels.push_back(e.label);
        targets.push_back(e.target);
      }
      const torch::Tensor features = model->trunk->forward(torch::stack(xs));
      torch::Tensor cls = torch::nn::functional::cross_entropy(
                              model->classify->forward(features), torch::stack(labels),
                              torch::nn::functional::CrossEntropyFuncOptions().reduction(
                                  torch::kSum)) /
                          per_rank;
      torch::Tensor reg = torch::nn::functional::mse_loss(
                              model->regress->forward(features), torch::stack(targets),
                              torch::nn::functional::MSELossFuncOptions().reduction(torch::kSum)) /
                          per_rank;
      if (train_cls) cls.backward({}, /*retain_graph=*/train_reg);  // the trunk's graph
      if (train_reg) reg.backward();                                  // serves both terms
      loss_cls = cls.item<double>();
      loss_reg = reg.item<double>();
    }
    if (!d.AfterBackward().ok()) continue;  // a peer failed and the step could not be salvaged
    optimizer.step();
    d.RecordLoss(loss_cls + loss_reg);
    if (pace_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(pace_ms));
  }
  absl::StatusOr<muster::Distributed::Outcome> outcome = d.Finish();
  if (flag.count("--summary")) {
    char digest[17];
    std::snprintf(digest, sizeof digest, "%016llx",
                  static_cast<unsigned long long>(d.StateDigest()));
    std::ofstream(WithPid(flag["--summary"]))
        << "{\"rank\": " << d.rank() << ", \"world_size\": " << d.world_size()
        << ", \"steps\": " << d.step() << ", \"digest\": \"" << digest << "\"}\n";
  }
  if (flag.count("--parameters") && d.rank() == 0) {
    std::ofstream out(WithPid(flag["--parameters"]));
    out << std::setprecision(9);
    for (const torch::Tensor& p : model->parameters()) {
      const torch::Tensor flat = p.detach().reshape({-1}).contiguous();
      for (int64_t i = 0; i < flat.numel(); ++i) out << flat[i].item<float>() << "\n";
    }
  }
  std::cout << "multitask: rank " << d.rank() << " of " << d.world_size() << ", step " << d.step()
            << ", classification loss " << loss_cls << ", regression loss " << loss_reg
            << std::endl;
  return muster::Distributed::ExitCode(outcome);
}
