// Knowledge distillation made elastic with libmuster: a frozen teacher with
// BatchNorm, in eval mode, teaches a smaller student on synthetic data. Both
// are registered as State::modules: the student is trained and reduced, the
// teacher (no parameter requires grad) travels with the state, checkpoints
// and resumes as the student does, and is never reduced. Its buffers do not
// change in eval mode, so muster copies none of them between steps.
//
//   distill [--steps N] [--batch N] [--temperature T] [--checkpoint-dir D
//           --checkpoint-every N] [--summary FILE] [--parameters FILE]
//           [--pace-ms N]
//
// --summary FILE writes the final state digest ({pid} in FILE is replaced);
// --parameters FILE writes rank 0's final student parameters as text, one
// value per line.
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

constexpr int64_t kExamples = 2048, kFeatures = 10, kClasses = 5;

// Example i: features from a generator seeded by i, the same on every rank.
torch::Tensor Features(int64_t i) {
  torch::Generator gen = at::detail::createCPUGenerator(static_cast<uint64_t>(i) + 11);
  return torch::randn({kFeatures}, gen) + static_cast<double>(i % kClasses);
}

// The teacher: trained elsewhere (here: a fixed seed stands for its
// weights), with BatchNorm statistics of its own.
torch::nn::Sequential Teacher() {
  torch::manual_seed(1234);
  torch::nn::Sequential teacher(torch::nn::Linear(kFeatures, 64), torch::nn::BatchNorm1d(64),
                                torch::nn::ReLU(), torch::nn::Linear(64, kClasses));
  torch::NoGradGuard no_grad;
  auto bn = teacher[1]->as<torch::nn::BatchNorm1d>();
  bn->running_mean.uniform_(-0.5, 0.5);
  bn->running_var.uniform_(0.5, 2.0);
  for (torch::Tensor& p : teacher->parameters()) p.requires_grad_(false);
  teacher->eval();
  return teacher;
}

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
  torch::nn::Sequential teacher = Teacher();
  torch::manual_seed(0);
  torch::nn::Sequential student(torch::nn::Linear(kFeatures, 16), torch::nn::ReLU(),
                                torch::nn::Linear(16, kClasses));
  torch::optim::SGD optimizer(student->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  const double temperature = std::stod(Flag(flag, "--temperature", "2"));

  muster::Options options;
  options.dataset_size = kExamples;
  options.batch_per_rank = std::stoi(Flag(flag, "--batch", "16"));
  options.steps = std::stoll(Flag(flag, "--steps", "200"));
  options.checkpoint_dir = Flag(flag, "--checkpoint-dir", "");
  options.checkpoint_every = std::stoi(Flag(flag, "--checkpoint-every", "0"));
  options.model_name = "distill";
  muster::State state;
  state.modules = {{"student", student.ptr().get()}, {"teacher", teacher.ptr().get()}};
  state.optimizers = {{"student", &optimizer}};
  auto job = muster::Distributed::Start(options, state);
  if (!job.ok()) {
    std::cerr << "distill: " << job.status() << "\n";
    return muster::Distributed::ExitCode(job.status());
  }
  muster::Distributed& d = **job;
  const double per_rank = options.batch_per_rank;
  const int pace_ms = std::stoi(Flag(flag, "--pace-ms", "0"));
  double loss = 0;
  while (!d.ShouldStop()) {
    optimizer.zero_grad();
    d.BeforeBackwardFor({"student"});
    if (!d.Batch().empty()) {
      std::vector<torch::Tensor> xs;
      for (int64_t i : d.Batch()) xs.push_back(Features(i));
      const torch::Tensor x = torch::stack(xs);
      torch::Tensor soft_targets;
      {
        torch::NoGradGuard no_grad;
        soft_targets = torch::softmax(teacher->forward(x) / temperature, 1);
      }
      const torch::Tensor log_probs = torch::log_softmax(student->forward(x) / temperature, 1);
      // KL(teacher || student), summed over this rank's share and divided
      // by the share's full size, scaled by T^2 as Hinton et al. do.
      torch::Tensor kd = torch::nn::functional::kl_div(
                             log_probs, soft_targets,
                             torch::nn::functional::KLDivFuncOptions().reduction(torch::kSum)) *
                         (temperature * temperature) / per_rank;
      kd.backward();
      loss = kd.item<double>();
    }
    if (!d.AfterBackward().ok()) continue;  // a peer failed and the step could not be salvaged
    optimizer.step();
    d.RecordLoss(loss);
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
    for (const torch::Tensor& p : student->parameters()) {
      const torch::Tensor flat = p.detach().reshape({-1}).contiguous();
      for (int64_t i = 0; i < flat.numel(); ++i) out << flat[i].item<float>() << "\n";
    }
  }
  std::cout << "distill: rank " << d.rank() << " of " << d.world_size() << ", step " << d.step()
            << ", loss " << loss << std::endl;
  return muster::Distributed::ExitCode(outcome);
}
