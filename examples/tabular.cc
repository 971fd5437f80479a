// A classifier with BatchNorm on synthetic tabular data, made elastic with
// libmuster the way a LibTorch user writes it: examples come through
// LibTorch's data loader (muster::StepSampler), RMSprop trains two parameter
// groups with their own rates (the head 10x the body), a step decay is set
// per group, and BatchNorm's running statistics stay equal on every rank
// (muster copies rank 0's at each step boundary).
//
//   tabular [--steps N] [--batch N] [--decay-every N] [--checkpoint-dir D
//           --checkpoint-every N] [--record DIR] [--summary FILE]
//           [--pace-ms N] [--broadcast-buffers 0|1]
//
// --record DIR writes DIR/<pid>.txt with one line per committed step:
// "<step> <state digest> <step prepared> <rate of group 0> <rate of group 1>";
// --summary FILE writes the final digest ({pid} in FILE is replaced).
#include <muster/data.h>
#include <muster/muster.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <thread>

namespace {

constexpr int64_t kExamples = 4096, kFeatures = 16, kClasses = 4;
constexpr double kBodyLr = 1e-3, kHeadLr = 1e-2;

// Example i: class i % 4, features drawn around that class's centre from a
// generator seeded by i, so every rank builds the same example alike.
class Blobs : public torch::data::datasets::Dataset<Blobs> {
 public:
  torch::data::Example<> get(size_t index) override {
    torch::Generator gen = at::detail::createCPUGenerator(static_cast<uint64_t>(index) + 1);
    const int64_t label = static_cast<int64_t>(index % kClasses);
    torch::Tensor x = torch::randn({kFeatures}, gen) + static_cast<double>(label);
    return {x, torch::tensor(label)};
  }
  torch::optional<size_t> size() const override { return kExamples; }
};

using Flags = std::map<std::string, std::string>;
std::string Get(const Flags& flag, const char* name, const std::string& fallback) {
  return flag.count(name) ? flag.at(name) : fallback;
}

std::string Hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flag;
  for (int i = 1; i + 1 < argc; i += 2) flag[argv[i]] = argv[i + 1];
  torch::set_num_threads(1);  // bit-identical runs: one reduction order
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(kFeatures, 32), torch::nn::BatchNorm1d(32),
                              torch::nn::ReLU(), torch::nn::Linear(32, kClasses));
  // Two groups: the body (first layer and BatchNorm) and the head.
  std::vector<torch::optim::OptimizerParamGroup> groups;
  std::vector<torch::Tensor> body = model[0]->parameters();
  for (const torch::Tensor& p : model[1]->parameters()) body.push_back(p);
  const auto options = torch::optim::RMSpropOptions(kBodyLr).momentum(0.9);
  groups.emplace_back(body, std::make_unique<torch::optim::RMSpropOptions>(options));
  groups.emplace_back(model[3]->parameters(),
                      std::make_unique<torch::optim::RMSpropOptions>(
                          torch::optim::RMSpropOptions(options).lr(kHeadLr)));
  torch::optim::RMSprop optimizer(groups, options);

  muster::Options o;
  o.dataset_size = kExamples;
  o.batch_per_rank = std::stoi(Get(flag, "--batch", "16"));
  o.steps = std::stoll(Get(flag, "--steps", "300"));
  o.epochs = 0;
  o.checkpoint_dir = Get(flag, "--checkpoint-dir", "");
  o.checkpoint_every = std::stoll(Get(flag, "--checkpoint-every", "0"));
  o.broadcast_buffers = Get(flag, "--broadcast-buffers", "1") == "1";
  o.model_name = "tabular-bn";
  o.log_every = 20;
  const int64_t decay_every = std::stoll(Get(flag, "--decay-every", "50"));
  o.group_lr_schedule = [decay_every](const muster::Progress& p, size_t group) {
    const double base = group == 0 ? kBodyLr : kHeadLr;
    return base * std::pow(0.5, static_cast<double>(p.step / decay_every));
  };
  muster::State state;
  state.model = model.ptr().get();
  state.optimizer = &optimizer;
  auto job = muster::Distributed::Start(o, state);
  if (!job.ok()) {
    std::cerr << "tabular: " << job.status() << "\n";
    return muster::Distributed::ExitCode(job.status());
  }
  muster::Distributed& d = **job;
  auto loader = torch::data::make_data_loader(
      Blobs().map(torch::data::transforms::Stack<>()), muster::StepSampler(d),
      torch::data::DataLoaderOptions().batch_size(o.batch_per_rank));
  std::ofstream record;
  if (flag.count("--record")) {
    record.open(flag["--record"] + "/" + std::to_string(::getpid()) + ".txt");
  }
  const int pace_ms = std::stoi(Get(flag, "--pace-ms", "0"));
  // The digest of a step is taken between steps, once ShouldStop has
  // synchronised the BatchNorm statistics its forward passes changed.
  std::string taken;  // the last step's line, waiting for its digest
  const auto write_taken = [&] {
    if (record.is_open() && !taken.empty()) {
      record << d.step() << " " << Hex(d.StateDigest()) << taken << std::endl;
    }
    taken.clear();
  };
  while (!d.ShouldStop()) {
    write_taken();
    const int64_t prepared = d.step();
    const std::vector<double> rates = d.learning_rates();
    model->train();
    optimizer.zero_grad();
    d.BeforeBackward();
    for (auto& batch : *loader) {  // this rank's share of the step; none at all is fine
      torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(batch.data), batch.target);
      loss.backward();
      d.RecordLoss(loss.item<double>());
    }
    if (!d.AfterBackward().ok()) continue;  // a peer failed and the step could not be salvaged
    optimizer.step();
    std::ostringstream line;
    line << " " << prepared;
    for (double r : rates) line << " " << r;
    taken = line.str();
    if (pace_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(pace_ms));
  }
  write_taken();
  absl::StatusOr<muster::Distributed::Outcome> outcome = d.Finish();
  if (flag.count("--summary")) {
    std::string path = flag["--summary"];
    if (const size_t at = path.find("{pid}"); at != std::string::npos) {
      path.replace(at, 5, std::to_string(::getpid()));
    }
    std::ofstream(path) << "{\"rank\": " << d.rank() << ", \"steps\": " << d.step()
                        << ", \"digest\": \"" << Hex(d.StateDigest()) << "\"}\n";
  }
  std::cout << "tabular: rank " << d.rank() << " of " << d.world_size() << ", step " << d.step()
            << std::endl;
  return muster::Distributed::ExitCode(outcome);
}
