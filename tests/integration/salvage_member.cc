// A small libmuster trainer for the step-salvage tests: an MLP with Adam on
// synthetic examples, written against the public API only, with drills a
// test can place at an exact step.
//
//   salvage_member --node-id ID (--steps N | --epochs N) [--dataset N]
//                  [--batch N] [--accumulate N] [--salvage 0|1]
//                  [--die-at-step K] [--die-once FILE] [--leave-after-step K]
//                  [--record DIR] [--summary FILE] [--corrupt-at-step K]
//                  [--checkpoint-dir D --checkpoint-every N]
//                  [--check-state-every N] [--shard-optimizer 0|1]
//                  [--corrupt-state-at-step K]
//
// --die-at-step K: SIGKILL itself after the forward pass of step K, while
// the others are inside that step's all-reduce. --die-once FILE: the same
// in the first step that begins once FILE exists. --leave-after-step K: ask to
// leave; the world goes on without this member from step K + 1.
// --accumulate N: N micro-batches per step, the first N - 1 without sync.
// --corrupt-at-step K: after the optimizer step of step K, add 1e-6 to one
// weight of this member's first layer (what a bit flip or a bug would do):
// the ranks must notice before they commit a checkpoint.
// --corrupt-state-at-step K: the same to the first moment (exp_avg) of the
// first parameter the optimizer steps (with --shard-optimizer 1, this
// rank's own part of the state): a drift no parameter shows yet.
// --record DIR writes DIR/<pid>.txt, "epoch index" per example of every
// step that counted; --summary FILE ({pid} replaced) the final state.
#include <muster/muster.h>
#include <signal.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <type_traits>

namespace {

std::string Replace(std::string s, const std::string& from, const std::string& to) {
  const size_t at = s.find(from);
  return at == std::string::npos ? s : s.replace(at, from.size(), to);
}

// Example i: 16 features and 4 targets, a fixed function of i.
std::pair<torch::Tensor, torch::Tensor> Examples(const std::vector<int64_t>& indices) {
  const torch::Tensor i = torch::tensor(indices, torch::kFloat32).unsqueeze(1) + 1;
  return {torch::sin(i * (torch::arange(16) + 1) * 0.37), torch::cos(i * (torch::arange(4) + 1) * 0.11)};
}

// The optimizer state of `p`: LibTorch keys it by the parameter's
// TensorImpl, a pointer in 2.x and the pointer printed in 1.13.
template <typename Map>
typename Map::mapped_type& StateOf(Map& state, const torch::Tensor& p) {
  if constexpr (std::is_same_v<typename Map::key_type, std::string>) {
    std::ostringstream key;
    key << p.unsafeGetTensorImpl();
    return state.at(key.str());
  } else {
    return state.at(p.unsafeGetTensorImpl());
  }
}

// The drills --corrupt-at-step and --corrupt-state-at-step, after the
// optimizer's step: 1e-6 added to one weight of the first layer
// (`weight`), or to the first moment of the first parameter the optimizer
// steps (`state`).
void Corrupt(bool weight, bool state, torch::nn::Sequential& model, torch::optim::Adam& optimizer) {
  torch::NoGradGuard no_grad;
  if (weight) model[0]->as<torch::nn::Linear>()->weight[0][0].add_(1e-6);
  if (state) {
    const torch::Tensor& first = optimizer.param_groups()[0].params()[0];
    auto& held = static_cast<torch::optim::AdamParamState&>(*StateOf(optimizer.state(), first));
    held.exp_avg().reshape({-1})[0].add_(1e-6);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> flag;
  for (int i = 1; i + 1 < argc; i += 2) flag[argv[i]] = argv[i + 1];
  auto get = [&](const char* name, int64_t fallback) {
    return flag.count(name) ? std::stoll(flag[name]) : fallback;
  };
  torch::set_num_threads(1);
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(16, 32), torch::nn::Tanh(),
                              torch::nn::Linear(32, 32), torch::nn::Tanh(), torch::nn::Linear(32, 4));
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(1e-2));

  std::atomic<bool> leave{false};
  muster::Options options;
  options.node_id = flag["--node-id"];
  options.dataset_size = get("--dataset", 200);
  options.batch_per_rank = static_cast<int>(get("--batch", 4));
  options.steps = get("--steps", 0);
  options.epochs = get("--epochs", 1);
  options.bucket_mb = 0.002;  // a few buckets: the salvage reduces each of them
  options.salvage = get("--salvage", 1) != 0;
  options.leave_requested = &leave;
  options.lr_schedule = [](const muster::Progress& p) {  // scaled with the world, decaying
    return 1e-2 * p.lr_world_size / 4.0 * (1.0 - 0.5 * p.step / std::max<double>(1, p.total_steps));
  };
  options.state_listen = "";
  if (flag.count("--checkpoint-dir")) options.checkpoint_dir = flag["--checkpoint-dir"];
  options.checkpoint_every = get("--checkpoint-every", 0);
  options.check_state_every = get("--check-state-every", options.check_state_every);
  options.shard_optimizer_state = get("--shard-optimizer", 0) != 0;
  options.quiet = true;
  muster::State state;
  state.model = model.ptr().get();
  state.optimizer = &optimizer;
  auto job = muster::Distributed::Start(options, state);
  if (!job.ok()) {
    std::cerr << "salvage_member: " << job.status() << "\n";
    return 1;
  }
  muster::Distributed& d = **job;
  const int64_t accumulate = get("--accumulate", 1);
  std::ofstream record;
  if (flag.count("--record")) record.open(flag["--record"] + "/" + std::to_string(::getpid()) + ".txt");
  int dropped = 0;
  while (!d.ShouldStop()) {
    const int64_t epoch = d.epoch(), step = d.step() + 1;
    if (step == get("--leave-after-step", -1)) leave = true;
    const bool die = step == get("--die-at-step", -1) ||
                     (flag.count("--die-once") && std::ifstream(flag["--die-once"]).good());
    const std::vector<int64_t> batch = d.Batch();
    optimizer.zero_grad();
    for (int64_t m = 0; m < accumulate; ++m) {
      std::vector<int64_t> micro;
      for (size_t k = static_cast<size_t>(m); k < batch.size(); k += accumulate) micro.push_back(batch[k]);
      auto [x, y] = Examples(micro);
      torch::Tensor loss = torch::mse_loss(model->forward(x), y, torch::Reduction::Sum);
      if (die && m + 1 == accumulate) ::raise(SIGKILL);
      d.BeforeBackward(/*sync=*/m + 1 == accumulate);
      loss.backward();
    }
    if (!d.AfterBackward().ok()) {
      ++dropped;
      continue;
    }
    optimizer.step();
    Corrupt(step == get("--corrupt-at-step", -1), step == get("--corrupt-state-at-step", -1),
            model, optimizer);
    for (int64_t i : d.Batch()) record << epoch << " " << i << "\n";
    record.flush();
  }
  if (flag.count("--summary")) {
    std::ofstream(Replace(flag["--summary"], "{pid}", std::to_string(::getpid())))
        << "{\"rank\": " << d.rank() << ", \"world_size\": " << d.world_size()
        << ", \"steps\": " << d.step() << ", \"digest\": \"" << std::hex << d.StateDigest()
        << std::dec << "\", \"dropped\": " << dropped << ", \"regroups\": " << d.regroups() << "}\n";
  }
  return muster::Distributed::ExitCode(d.Finish());
}
