// A character-level GRU language model with state of its own, made elastic
// with libmuster: AdamW with a cosine schedule, an exponential moving average
// of the weights (tensors beside the model, as used for evaluation), and a
// counter of optimizer updates kept as bytes. muster moves all of it to
// joiners, checkpoints it and restores it.
//
//   char_lm [--node-id ID] [--text FILE] [--epochs N | --steps N] [--batch N]
//           [--checkpoint-dir D --checkpoint-every N] [--log-dir D]
//           [--record DIR] [--summary FILE] [--pace-ms N]
//
// --record DIR writes DIR/<pid>.txt with "epoch index" for every example
// this process trained on in a committed step; --summary FILE writes the
// final state digest ({rank} and {pid} in FILE are replaced).
#include <muster/muster.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <thread>

namespace {

constexpr int64_t kContext = 32, kVocab = 128;

struct CharLm : torch::nn::Module {
  CharLm() {
    embed = register_module("embed", torch::nn::Embedding(kVocab, 32));
    gru = register_module("gru", torch::nn::GRU(torch::nn::GRUOptions(32, 96).batch_first(true)));
    head = register_module("head", torch::nn::Linear(96, kVocab));
  }
  torch::Tensor forward(torch::Tensor x) { return head(std::get<0>(gru(embed(x)))); }
  torch::nn::Embedding embed{nullptr};
  torch::nn::GRU gru{nullptr};
  torch::nn::Linear head{nullptr};
};

std::string Replace(std::string s, const std::string& from, const std::string& to) {
  const size_t at = s.find(from);
  return at == std::string::npos ? s : s.replace(at, from.size(), to);
}

// The text file as 7-bit character codes.
torch::Tensor ReadChars(const std::string& path) {
  std::ifstream in(path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  torch::Tensor chars = torch::empty({static_cast<int64_t>(text.size())}, torch::kInt64);
  for (size_t i = 0; i < text.size(); ++i) chars[i] = static_cast<int64_t>(text[i] & 0x7f);
  return chars;
}

using Flags = std::map<std::string, std::string>;
std::string Get(const Flags& flag, const char* name, const std::string& fallback) {
  return flag.count(name) ? flag.at(name) : fallback;
}

muster::Options OptionsFrom(const Flags& flag, int64_t examples) {
  muster::Options options;
  options.dataset_size = examples;
  options.batch_per_rank = std::stoi(Get(flag, "--batch", "8"));
  options.epochs = std::stoll(Get(flag, "--epochs", "2"));
  options.steps = std::stoll(Get(flag, "--steps", "0"));
  options.checkpoint_dir = Get(flag, "--checkpoint-dir", "");
  options.checkpoint_every = std::stoll(Get(flag, "--checkpoint-every", "0"));
  options.log_dir = Get(flag, "--log-dir", "");
  options.log_every = 10;
  options.model_name = "char-gru";
  options.node_id = Get(flag, "--node-id", "");  // default: from muster-agent, Slurm, ..., the host name
  options.lr_schedule = [](const muster::Progress& p) {  // warm-up, then cosine to 10%
    const double peak = 3e-3, t = std::min(1.0, p.step / std::max(1.0, p.total_steps - 1.0));
    return p.step < 10 ? peak * (p.step + 1) / 10 : peak * (0.1 + 0.45 * (1 + std::cos(M_PI * t)));
  };
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flag;
  for (int i = 1; i + 1 < argc; i += 2) flag[argv[i]] = argv[i + 1];
  const torch::Tensor chars = ReadChars(Get(flag, "--text", MUSTER_EXAMPLE_TEXT));
  const int64_t examples = (chars.size(0) - 1) / kContext;  // example i: window i

  torch::set_num_threads(1);  // bit-identical runs: one reduction order
  torch::manual_seed(0);
  auto model = std::make_shared<CharLm>();
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(3e-3));
  std::vector<std::pair<std::string, torch::Tensor>> ema;  // EMA weights: state beside the model
  for (const auto& p : model->named_parameters()) ema.emplace_back(p.key(), p.value().detach().clone());
  int64_t updates = 0;

  muster::State state;
  state.model = model.get();
  state.optimizer = &optimizer;
  for (const auto& [name, t] : ema) state.tensors.emplace_back("ema." + name, t);
  state.blobs = {{"updates", [&] { return std::to_string(updates); },
                  [&](const std::string& v) {
                    updates = std::stoll(v);
                    return absl::OkStatus();
                  }}};
  auto job = muster::Distributed::Start(OptionsFrom(flag, examples), state);
  if (!job.ok()) {
    std::cerr << "char_lm: " << job.status() << "\n";
    return muster::Distributed::ExitCode(job.status());  // 78 for bad options: not restarted
  }
  muster::Distributed& d = **job;
  std::ofstream record;
  if (flag.count("--record")) record.open(flag["--record"] + "/" + std::to_string(::getpid()) + ".txt");
  while (!d.ShouldStop()) {
    const int64_t epoch = d.epoch();  // of the batch ShouldStop prepared
    const torch::Tensor starts = torch::tensor(d.Batch(), torch::kInt64) * kContext;
    const torch::Tensor pos = starts.unsqueeze(1) + torch::arange(kContext + 1);
    const torch::Tensor window = chars.index_select(0, pos.flatten()).view(pos.sizes());
    const torch::Tensor x = window.narrow(1, 0, kContext), y = window.narrow(1, 1, kContext);
    torch::Tensor loss = torch::cross_entropy_loss(model->forward(x).flatten(0, 1), y.flatten());
    optimizer.zero_grad();
    d.BeforeBackward();
    loss.backward();
    if (!d.AfterBackward().ok()) continue;  // a peer failed and the step could not be salvaged
    optimizer.step();
    {
      torch::NoGradGuard no_grad;
      auto params = model->parameters();
      for (size_t i = 0; i < params.size(); ++i) ema[i].second.mul_(0.99).add_(params[i], 0.01);
    }
    ++updates;
    if (x.size(0) > 0) d.RecordLoss(loss.item<double>());  // the last batch of an epoch may leave a rank none
    for (int64_t i : d.Batch()) record << epoch << " " << i << "\n";
    record.flush();
    std::this_thread::sleep_for(std::chrono::milliseconds(std::stoi(Get(flag, "--pace-ms", "0"))));
  }
  if (flag.count("--summary")) {
    std::string path = Replace(Replace(flag["--summary"], "{rank}", std::to_string(d.rank())),
                               "{pid}", std::to_string(::getpid()));
    std::ofstream(path) << "{\"rank\": " << d.rank() << ", \"world_size\": " << d.world_size()
                        << ", \"steps\": " << d.step() << ", \"digest\": \"" << std::hex
                        << d.StateDigest() << std::dec << "\", \"updates\": " << updates << "}\n";
  }
  std::cout << "char_lm: rank " << d.rank() << " of " << d.world_size() << ", step " << d.step()
            << ", " << updates << " updates" << std::endl;
  return muster::Distributed::ExitCode(d.Finish());
}
