// A byte-level transformer language model made elastic with libmuster,
// written the way nanoGPT-style programs are: hand-written causal
// self-attention, LayerNorm, dropout, the output projection tied to the token
// embedding, AdamW with weight decay on the 2-D weights only (two parameter
// groups), gradient accumulation over micro-batches, the program's own
// gradient clipping and warm-up + cosine learning rate, and evaluation on
// rank 0 alone every few steps. --amp bf16 runs its forward under autocast
// in bfloat16; --amp fp16 in float16, with muster::GradScaler's dynamic loss
// scaling (--loss-scale dynamic; the default for fp16 only).
//
//   lm [--text FILE] [--steps N | --epochs N] [--batch N] [--micro N]
//      [--context N] [--layers N] [--embd N] [--heads N] [--dropout P]
//      [--lr X] [--warmup N] [--clip X] [--eval-every N] [--eval-iters N]
//      [--amp none|bf16|fp16] [--loss-scale dynamic|none]
//      [--loss-scale-growth N] [--cuda 0|1]
//      [--checkpoint-dir D --checkpoint-every N] [--log-dir D]
//      [--summary FILE] [--parameters FILE] [--pace-ms N] [--node-id ID]
//      [--collective-timeout S] [--patience N]
//
// --text defaults to the GPL's text, which every Debian host has. Example i is
// the i-th window of --context bytes; the last tenth of the windows is held out
// for evaluation, which averages --eval-iters passes over it (as nanoGPT's
// estimate_loss averages eval_iters batches). --batch is windows per rank per
// step, split into --micro micro-batches. --collective-timeout sets
// Options::collective_timeout_s. --patience N stops early: once N evaluations
// in a row have not lowered the held-out loss, rank 0 asks the job to finish
// (Distributed::RequestFinish), and every rank ends after the next step with
// exit 0 (rank 0 keeps the count: a replaced rank 0 starts it again). --summary
// FILE writes the final state digest ({pid} in FILE is replaced); --parameters
// FILE writes rank 0's final parameters as text, one value per line.
#include <muster/muster.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>

namespace {

using Flags = std::map<std::string, std::string>;

std::string Flag(const Flags& flag, const std::string& name, const std::string& fallback) {
  auto it = flag.find(name);
  return it == flag.end() ? fallback : it->second;
}

std::string WithPid(std::string path) {
  if (auto at = path.find("{pid}"); at != std::string::npos) {
    path.replace(at, 5, std::to_string(::getpid()));
  }
  return path;
}

struct Config {
  int64_t context = 32, layers = 2, embd = 48, heads = 4;
  double dropout = 0.1;
};

struct CausalSelfAttentionImpl : torch::nn::Module {
  explicit CausalSelfAttentionImpl(const Config& c)
      : heads(c.heads),
        qkv(register_module("qkv", torch::nn::Linear(c.embd, 3 * c.embd))),
        proj(register_module("proj", torch::nn::Linear(c.embd, c.embd))),
        attn_drop(register_module("attn_drop", torch::nn::Dropout(c.dropout))),
        resid_drop(register_module("resid_drop", torch::nn::Dropout(c.dropout))) {}

  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2);
    std::vector<torch::Tensor> parts = qkv(x).split(C, 2);
    auto heads_of = [&](const torch::Tensor& t) {
      return t.view({B, T, heads, C / heads}).transpose(1, 2);
    };
    const torch::Tensor q = heads_of(parts[0]), k = heads_of(parts[1]), v = heads_of(parts[2]);
    torch::Tensor att = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(double(C / heads));
    // Each position sees itself and the ones before (not a buffer: nothing
    // to carry, checkpoint or copy between ranks).
    const torch::Tensor causal = torch::ones({T, T}, x.options().dtype(torch::kBool)).tril();
    att = att.masked_fill(causal.logical_not(), -std::numeric_limits<float>::infinity());
    att = attn_drop(torch::softmax(att, -1));
    const torch::Tensor y = torch::matmul(att, v).transpose(1, 2).contiguous().view({B, T, C});
    return resid_drop(proj(y));
  }

  int64_t heads;
  torch::nn::Linear qkv, proj;
  torch::nn::Dropout attn_drop, resid_drop;
};
TORCH_MODULE(CausalSelfAttention);

struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(const Config& c)
      : ln1(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.embd})))),
        attn(register_module("attn", CausalSelfAttention(c))),
        ln2(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.embd})))),
        mlp(register_module("mlp", torch::nn::Sequential(torch::nn::Linear(c.embd, 4 * c.embd),
                                                         torch::nn::GELU(),
                                                         torch::nn::Linear(4 * c.embd, c.embd),
                                                         torch::nn::Dropout(c.dropout)))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = x + attn(ln1(x));
    return x + mlp->forward(ln2(x));
  }
  torch::nn::LayerNorm ln1;
  CausalSelfAttention attn;
  torch::nn::LayerNorm ln2;
  torch::nn::Sequential mlp;
};
TORCH_MODULE(Block);

struct GptImpl : torch::nn::Module {
  explicit GptImpl(const Config& c)
      : tok(register_module("tok", torch::nn::Embedding(256, c.embd))),
        pos(register_module("pos", torch::nn::Embedding(c.context, c.embd))),
        drop(register_module("drop", torch::nn::Dropout(c.dropout))),
        blocks(register_module("blocks", torch::nn::ModuleList())),
        ln_f(register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.embd})))) {
    for (int64_t i = 0; i < c.layers; ++i) blocks->push_back(Block(c));
    // Weight tying: the output projection is the token embedding, registered
    // under a second name. One parameter: muster reduces and stores it once.
    lm_head = register_parameter("lm_head", tok->weight);
    torch::NoGradGuard no_grad;  // GPT-2's initialisation
    for (auto& p : named_parameters()) {
      if (p.key().find("ln") != std::string::npos) continue;  // LayerNorm keeps 1 and 0
      if (p.value().dim() >= 2) p.value().normal_(0, 0.02);
      else p.value().zero_();
    }
  }
  torch::Tensor forward(const torch::Tensor& idx) {
    torch::Tensor x = drop(tok(idx) + pos(torch::arange(idx.size(1), idx.options())));
    for (const auto& block : *blocks) x = block->as<Block>()->forward(x);
    return torch::linear(ln_f(x), lm_head);
  }
  torch::nn::Embedding tok, pos;
  torch::nn::Dropout drop;
  torch::nn::ModuleList blocks;
  torch::nn::LayerNorm ln_f;
  torch::Tensor lm_head;
};
TORCH_MODULE(Gpt);

// Each tensor once: named_parameters lists the tied weight under both names.
std::vector<std::pair<std::string, torch::Tensor>> UniqueParameters(torch::nn::Module& m) {
  std::set<const void*> seen;
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (auto& p : m.named_parameters()) {
    if (seen.insert(p.value().unsafeGetTensorImpl()).second) out.emplace_back(p.key(), p.value());
  }
  return out;
}

torch::Tensor ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  torch::Tensor bytes = torch::empty({static_cast<int64_t>(text.size())}, torch::kInt64);
  for (size_t i = 0; i < text.size(); ++i) bytes[i] = static_cast<unsigned char>(text[i]);
  return bytes;
}

// Windows `first` ... as inputs and next-byte targets.
std::pair<torch::Tensor, torch::Tensor> Windows(const torch::Tensor& bytes,
                                                const std::vector<int64_t>& examples,
                                                int64_t context) {
  const torch::Tensor starts = torch::tensor(examples, torch::kInt64) * context;
  const torch::Tensor pos = starts.unsqueeze(1) + torch::arange(context + 1);
  const torch::Tensor w = bytes.index_select(0, pos.flatten()).view(pos.sizes());
  return {w.narrow(1, 0, context), w.narrow(1, 1, context)};
}

// Warm-up, then cosine down to a tenth, from the step every rank agrees on.
double LearningRate(double peak, int64_t warmup, int64_t step, int64_t total) {
  if (step < warmup) return peak * (step + 1) / warmup;
  const double t = std::min(1.0, double(step - warmup) / std::max<int64_t>(1, total - warmup));
  return peak * (0.1 + 0.45 * (1 + std::cos(M_PI * t)));
}

}  // namespace

int main(int argc, char** argv) {
  Flags flag;
  for (int i = 1; i + 1 < argc; i += 2) flag[argv[i]] = argv[i + 1];
  Config c;
  c.context = std::stoll(Flag(flag, "--context", "32"));
  c.layers = std::stoll(Flag(flag, "--layers", "2"));
  c.embd = std::stoll(Flag(flag, "--embd", "48"));
  c.heads = std::stoll(Flag(flag, "--heads", "4"));
  c.dropout = std::stod(Flag(flag, "--dropout", "0.1"));
  const int micro = std::stoi(Flag(flag, "--micro", "2"));
  const double peak_lr = std::stod(Flag(flag, "--lr", "3e-3"));
  const int64_t warmup = std::stoll(Flag(flag, "--warmup", "10"));
  const double clip = std::stod(Flag(flag, "--clip", "1.0"));
  const int64_t eval_every = std::stoll(Flag(flag, "--eval-every", "20"));
  const int eval_iters = std::max(1, std::stoi(Flag(flag, "--eval-iters", "1")));
  const int patience = std::stoi(Flag(flag, "--patience", "0"));  // 0: no early stopping
  double best_val = std::numeric_limits<double>::infinity();
  int evals_without_gain = 0;
  const int pace_ms = std::stoi(Flag(flag, "--pace-ms", "0"));
  const std::string amp = Flag(flag, "--amp", "none");
  if (amp != "none" && amp != "bf16" && amp != "fp16") {
    std::cerr << "lm: --amp " << amp << ": none, bf16 or fp16\n";
    return 2;
  }
  muster::GradScalerOptions scaling;
  scaling.enabled = Flag(flag, "--loss-scale", amp == "fp16" ? "dynamic" : "none") == "dynamic";
  scaling.growth_interval = std::stoll(Flag(flag, "--loss-scale-growth", "2000"));
  muster::GradScaler scaler(scaling);

  const torch::Tensor bytes = ReadBytes(Flag(flag, "--text", "/usr/share/common-licenses/GPL-3"));
  const int64_t windows = (bytes.size(0) - 1) / c.context;
  const int64_t train_windows = windows - windows / 10;  // the rest is held out
  if (train_windows < 1) {
    std::cerr << "lm: the text has too few bytes for one window of " << c.context << "\n";
    return 2;
  }

  torch::set_num_threads(1);  // bit-identical runs: one reduction order
  torch::manual_seed(0);
  Gpt model(c);
  std::vector<torch::Tensor> decay, no_decay, params;
  for (auto& [name, p] : UniqueParameters(*model)) {
    (p.dim() >= 2 ? decay : no_decay).push_back(p);
    params.push_back(p);
  }
  torch::optim::AdamW optimizer(
      {torch::optim::OptimizerParamGroup(
           decay, std::make_unique<torch::optim::AdamWOptions>(
                      torch::optim::AdamWOptions(peak_lr).betas({0.9, 0.95}).weight_decay(0.1))),
       torch::optim::OptimizerParamGroup(
           no_decay, std::make_unique<torch::optim::AdamWOptions>(
                         torch::optim::AdamWOptions(peak_lr).betas({0.9, 0.95}).weight_decay(0)))});

  muster::Options options;
  options.dataset_size = train_windows;
  options.batch_per_rank = std::stoi(Flag(flag, "--batch", "8"));
  options.steps = std::stoll(Flag(flag, "--steps", "0"));
  options.epochs = options.steps > 0 ? 0 : std::stoll(Flag(flag, "--epochs", "1"));
  options.checkpoint_dir = Flag(flag, "--checkpoint-dir", "");
  options.checkpoint_every = std::stoll(Flag(flag, "--checkpoint-every", "0"));
  options.log_dir = Flag(flag, "--log-dir", "");
  options.log_every = 10;
  options.model_name = "byte-gpt";
  options.node_id = Flag(flag, "--node-id", "");
  options.cuda = Flag(flag, "--cuda", "0") == "1";
  options.collective_timeout_s = std::stod(Flag(flag, "--collective-timeout", "0"));
  const absl::StatusOr<torch::Device> device = muster::TrainingDevice(options);
  if (!device.ok()) {
    std::cerr << "lm: " << device.status() << "\n";
    return muster::Distributed::ExitCode(device.status());
  }
  model->to(*device);
  muster::State state;
  state.model = model.ptr().get();
  state.optimizer = &optimizer;
  if (scaler.enabled()) state.grad_scaler = &scaler;  // its scale travels and checkpoints
  auto job = muster::Distributed::Start(options, state);
  if (!job.ok()) {
    std::cerr << "lm: " << job.status() << "\n";
    return muster::Distributed::ExitCode(job.status());
  }
  muster::Distributed& d = **job;
  const double tokens_per_rank = double(options.batch_per_rank) * c.context;
  std::vector<int64_t> held_out;
  for (int64_t i = train_windows; i < windows && held_out.size() < 64; ++i) held_out.push_back(i);

  while (!d.ShouldStop()) {
    const int64_t step = d.step();
    const double lr = LearningRate(peak_lr, warmup, step, d.progress().total_steps);
    for (auto& group : optimizer.param_groups()) {
      static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
    }
    optimizer.zero_grad();
    const std::vector<int64_t> batch = d.Batch();
    double loss_sum = 0;
    for (int m = 0; m < micro; ++m) {
      // This micro-batch's windows, and dropout masks drawn from them and
      // the step: the same on a rerun, whatever the world.
      const size_t from = batch.size() * m / micro, to = batch.size() * (m + 1) / micro;
      d.BeforeBackward(/*sync=*/m == micro - 1);
      if (from == to) continue;
      const std::vector<int64_t> part(batch.begin() + from, batch.begin() + to);
      torch::manual_seed(static_cast<uint64_t>(step) * 1000003 + static_cast<uint64_t>(part[0]));
      auto [x, y] = Windows(bytes, part, c.context);
      torch::Tensor logits;
      {
        muster::Autocast autocast(device->type(), amp == "fp16" ? torch::kHalf : torch::kBFloat16,
                                  amp != "none");
        logits = model(x.to(*device));
      }
      // Summed over the micro-batch, divided by the rank's full share: the
      // world's average is the mean over the global batch.
      torch::Tensor loss = torch::nn::functional::cross_entropy(
                               logits.flatten(0, 1).to(torch::kFloat32), y.to(*device).flatten(),
                               torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum)) /
                           tokens_per_rank;
      scaler.scale(loss).backward();
      loss_sum += loss.item<double>();
    }
    if (!d.AfterBackward().ok()) continue;  // a peer failed and the step could not be salvaged
    scaler.unscale_(optimizer);  // before clipping (registered: AfterBackward did it)
    torch::nn::utils::clip_grad_norm_(params, clip);
    scaler.step(optimizer);  // skipped where a gradient overflowed, on every rank alike
    scaler.update();
    if (!d.Batch().empty()) d.RecordLoss(loss_sum * tokens_per_rank / (d.Batch().size() * c.context));
    if (d.rank() == 0 && eval_every > 0 && (step + 1) % eval_every == 0 && !held_out.empty()) {
      model->eval();
      torch::NoGradGuard no_grad;
      auto [x, y] = Windows(bytes, held_out, c.context);
      double val = 0;
      for (int i = 0; i < eval_iters; ++i) {
        val += torch::nn::functional::cross_entropy(model(x.to(*device)).flatten(0, 1),
                                                    y.to(*device).flatten())
                   .item<double>() /
               eval_iters;
      }
      model->train();
      std::cout << "lm: step " << step + 1 << ", held-out loss " << val << std::endl;
      d.LogScalars({{"val_loss", val}});
      if (val < best_val) {
        best_val = val;
        evals_without_gain = 0;
      } else if (patience > 0 && ++evals_without_gain == patience) {
        d.RequestFinish();  // every rank ends after the next step
      }
    }
    if (pace_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(pace_ms));
  }
  absl::StatusOr<muster::Distributed::Outcome> outcome = d.Finish();
  if (flag.count("--summary")) {
    char digest[17];
    std::snprintf(digest, sizeof digest, "%016llx",
                  static_cast<unsigned long long>(d.StateDigest()));
    std::ofstream(WithPid(flag["--summary"]))
        << "{\"rank\": " << d.rank() << ", \"world_size\": " << d.world_size()
        << ", \"steps\": " << d.step() << ", \"digest\": \"" << digest
        << "\", \"loss_scale\": " << scaler.get_scale()
        << ", \"skipped_steps\": " << scaler.skipped_steps() << "}\n";
  }
  if (flag.count("--parameters") && d.rank() == 0) {
    std::ofstream out(WithPid(flag["--parameters"]));
    out << std::setprecision(9);
    for (const torch::Tensor& p : params) {
      const torch::Tensor flat = p.detach().reshape({-1}).contiguous().cpu();
      for (int64_t i = 0; i < flat.numel(); ++i) out << flat[i].item<float>() << "\n";
    }
  }
  std::cout << "lm: rank " << d.rank() << " of " << d.world_size() << ", step " << d.step()
            << std::endl;
  return muster::Distributed::ExitCode(outcome);
}
