// Fine-tuning made elastic with libmuster, with gradual unfreezing: a
// pretrained backbone is frozen while a new head learns, and from step
// --unfreeze-at on the whole model trains. The program only flips
// requires_grad, as a fine-tuning script does; muster reduces whatever
// requires grad in each step (the parameters a step's backward reaches
// are decided at its BeforeBackward), so every rank stays identical
// across the switch. One SGD optimizer holds every parameter from the
// start: a parameter without a gradient is skipped by its step.
//
// The switch is decided from d.step(), not counted by the loop, so that a
// run resumed from a checkpoint (or a replacement trainer that took a
// live peer's state) freezes and unfreezes at the same steps.
//
// After step --lr-drop-at (the unfreezing by default) the program lowers
// the learning rate tenfold itself, as fine-tuning scripts do once the
// backbone trains. With no Options::lr_schedule the rates are the
// program's, and muster carries them as state: a resumed run or a
// replacement goes on at the lowered rate.
//
//   finetune [--steps N] [--unfreeze-at N] [--lr-drop-at N] [--batch N] [--checkpoint-dir D
//            --checkpoint-every N] [--summary FILE] [--parameters FILE]
//            [--pace-ms N] [--shard-optimizer 1]
//
// --shard-optimizer 1 shards the optimizer state (Options::
// shard_optimizer_state), which does not take a change of what requires
// grad: the run ends at the unfreezing with INVALID_ARGUMENT (exit 78).
//
// --summary FILE writes the final state digest ({pid} in FILE is replaced);
// --parameters FILE writes rank 0's final parameters as text, one value per
// line.
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

constexpr int64_t kExamples = 2048, kFeatures = 10, kClasses = 4;

// Example i: features from a generator seeded by i (the same on every
// rank), shifted by its class i % 4.
torch::Tensor Features(int64_t i) {
  torch::Generator gen = at::detail::createCPUGenerator(static_cast<uint64_t>(i) + 23);
  return torch::randn({kFeatures}, gen) + static_cast<double>(i % kClasses);
}

struct FineTuneImpl : torch::nn::Module {
  FineTuneImpl()
      : backbone(register_module(
            "backbone", torch::nn::Sequential(torch::nn::Linear(kFeatures, 32), torch::nn::ReLU(),
                                              torch::nn::Linear(32, 32), torch::nn::ReLU()))),
        head(register_module("head", torch::nn::Linear(32, kClasses))) {}
  torch::Tensor forward(const torch::Tensor& x) { return head->forward(backbone->forward(x)); }
  torch::nn::Sequential backbone;
  torch::nn::Linear head;
};
TORCH_MODULE(FineTune);

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
  torch::manual_seed(0);  // stands for the pretrained weights
  FineTune model;
  // The backbone starts frozen, as fine-tuning scripts freeze it before
  // they build the optimizer and start training.
  const auto train_backbone = [&model](bool on) {
    for (torch::Tensor& p : model->backbone->parameters()) p.requires_grad_(on);
  };
  train_backbone(false);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));

  muster::Options options;
  options.dataset_size = kExamples;
  options.batch_per_rank = std::stoi(Flag(flag, "--batch", "16"));
  options.steps = std::stoll(Flag(flag, "--steps", "200"));
  options.checkpoint_dir = Flag(flag, "--checkpoint-dir", "");
  options.checkpoint_every = std::stoi(Flag(flag, "--checkpoint-every", "0"));
  options.model_name = "finetune";
  options.shard_optimizer_state = Flag(flag, "--shard-optimizer", "0") == "1";
  const int64_t unfreeze_at =
      std::stoll(Flag(flag, "--unfreeze-at", std::to_string(options.steps / 2)));
  const int64_t lr_drop_at = std::stoll(Flag(flag, "--lr-drop-at", std::to_string(unfreeze_at)));
  muster::State state;
  state.model = model.ptr().get();
  state.optimizer = &optimizer;
  auto job = muster::Distributed::Start(options, state);
  if (!job.ok()) {
    std::cerr << "finetune: " << job.status() << "\n";
    return muster::Distributed::ExitCode(job.status());
  }
  muster::Distributed& d = **job;
  const double per_rank = options.batch_per_rank;
  const int pace_ms = std::stoi(Flag(flag, "--pace-ms", "0"));
  double loss = 0;
  while (!d.ShouldStop()) {
    train_backbone(d.step() >= unfreeze_at);
    optimizer.zero_grad();
    d.BeforeBackward();
    if (!d.Batch().empty()) {
      std::vector<torch::Tensor> xs, ys;
      for (int64_t i : d.Batch()) {
        xs.push_back(Features(i));
        ys.push_back(torch::tensor(i % kClasses));
      }
      // Summed over this rank's share, divided by the share's full size.
      namespace F = torch::nn::functional;
      torch::Tensor l = F::cross_entropy(model->forward(torch::stack(xs)), torch::stack(ys),
                                         F::CrossEntropyFuncOptions().reduction(torch::kSum)) /
                        per_rank;
      l.backward();
      loss = l.item<double>();
    }
    if (!d.AfterBackward().ok()) continue;  // a peer failed and the step could not be salvaged
    optimizer.step();
    // Here once for each step taken (d.step() counts it already), and never
    // for one that failed and comes again: a change relative to the rate in
    // effect belongs here.
    if (d.step() == lr_drop_at) {
      for (auto& group : optimizer.param_groups()) {
        group.options().set_lr(group.options().get_lr() / 10);
      }
    }
    d.RecordLoss(loss);
    if (pace_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(pace_ms));
  }
  absl::StatusOr<muster::Distributed::Outcome> outcome = d.Finish();
  if (!outcome.ok()) std::cerr << "finetune: " << outcome.status() << "\n";
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
  std::cout << "finetune: rank " << d.rank() << " of " << d.world_size() << ", step " << d.step()
            << ", loss " << loss << std::endl;
  return muster::Distributed::ExitCode(outcome);
}
