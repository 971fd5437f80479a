// A small GAN on Fashion-MNIST made elastic with libmuster, with the loop
// of pytorch/examples' DCGAN: two models (a generator and a discriminator,
// both with BatchNorm), two optimizers and two synchronised passes in every
// step. The discriminator's pass calls backward twice (real, then fake)
// before its optimizer steps; the generator's pass backpropagates through
// the images generated before the discriminator's pass, whose graph holds
// the generator's BatchNorm buffers. muster keeps both models, their
// buffers and both Adam states identical on every rank, moves them to
// joiners, checkpoints them and resumes them exactly.
//
//   gan [--node-id ID] [--data-dir D] [--examples N] [--steps N | --epochs N]
//       [--batch N] [--ghost-batch N] [--checkpoint-dir D --checkpoint-every N]
//       [--summary FILE] [--parameters FILE] [--pace-ms N] [--shard-optimizer 1]
//       [--sync-bn 1] [--kill-rank R --kill-at-step N]
//
// --shard-optimizer 1 shards both optimizers' state (Options::
// shard_optimizer_state): the generator's pass, which reads the
// discriminator its optimizer has just stepped, names its module before
// that forward, so the stepped parts are gathered first, and the
// optimizers come back whole after the loop, for the summary's digest.
// --sync-bn 1 makes both models' BatchNorm a muster::SyncBatchNorm: its
// statistics are the world's batch, so a world of four trains as one
// process with the global batch does (no --ghost-batch), and every rank
// runs each forward, an empty share included.
// --kill-rank R --kill-at-step N: rank R SIGKILLs itself inside step N,
// once the discriminator's pass has begun and before its forward (the
// process tests' drill: with --sync-bn the others lose it inside
// SyncBatchNorm's sum).
// --summary FILE writes the final state digest and the optimizer state
// this rank held ({pid} in FILE is replaced);
// --parameters FILE writes rank 0's final parameters (the generator's, then
// the discriminator's) as text, one value per line.
#include <muster/muster.h>
#include <muster/sync_batch_norm.h>
#include <torch/torch.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <csignal>
#include <chrono>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <string>
#include <thread>

namespace {

constexpr int64_t kNoise = 32, kPixels = 784;

// The images of an IDX file (gzip-compressed, as Debian's
// dataset-fashion-mnist ships it), the first `limit`, scaled to [-1, 1].
torch::Tensor ReadImages(const std::string& path, int64_t limit) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) throw std::runtime_error("cannot open " + path);
  unsigned char head[16];
  if (gzread(f, head, sizeof head) != sizeof head) throw std::runtime_error(path + ": no header");
  const int64_t count = (int64_t{head[4]} << 24) | (head[5] << 16) | (head[6] << 8) | head[7];
  const int64_t n = limit > 0 ? std::min(limit, count) : count;
  torch::Tensor t = torch::empty({n, kPixels}, torch::kUInt8);
  const int got = gzread(f, t.data_ptr(), static_cast<unsigned>(t.numel()));
  gzclose(f);
  if (got != t.numel()) throw std::runtime_error(path + " is truncated");
  return t.to(torch::kFloat32) / 127.5 - 1;
}

// As in DCGAN, a layer followed by BatchNorm has no bias: BatchNorm takes
// the mean out, so the bias's gradient is zero but for rounding, which Adam
// would turn into steps of a full learning rate.
// `sync_bn`: muster::SyncBatchNorm, the world's statistics.
torch::nn::AnyModule Norm(int64_t features, bool sync_bn) {
  if (sync_bn) return torch::nn::AnyModule(muster::SyncBatchNorm(features));
  return torch::nn::AnyModule(torch::nn::BatchNorm1d(features));
}

torch::nn::Sequential Generator(bool sync_bn) {
  torch::nn::Sequential net(torch::nn::Linear(torch::nn::LinearOptions(kNoise, 256).bias(false)));
  net->push_back(Norm(256, sync_bn));
  net->push_back(torch::nn::LeakyReLU());
  net->push_back(torch::nn::Linear(256, kPixels));
  net->push_back(torch::nn::Tanh());
  return net;
}

torch::nn::Sequential Discriminator(bool sync_bn) {
  torch::nn::Sequential net(torch::nn::Linear(torch::nn::LinearOptions(kPixels, 256).bias(false)));
  net->push_back(Norm(256, sync_bn));
  net->push_back(torch::nn::LeakyReLU());
  net->push_back(torch::nn::Linear(256, 1));
  return net;
}

// Noise drawn from the step and the examples: the same on a rerun. With
// SyncBatchNorm, each example's own (a world of four draws what one process
// with the global batch draws); else the part's, from its first example.
torch::Tensor Noise(int64_t step, const std::vector<int64_t>& part, bool per_example) {
  const auto seed = [step](int64_t example) {
    torch::manual_seed(static_cast<uint64_t>(step) * 1000003 + static_cast<uint64_t>(example));
  };
  if (!per_example || part.empty()) {
    seed(part.empty() ? 0 : part[0]);
    return torch::randn({static_cast<int64_t>(part.size()), kNoise});
  }
  std::vector<torch::Tensor> rows;
  for (int64_t example : part) {
    seed(example);
    rows.push_back(torch::randn({kNoise}));
  }
  return torch::stack(rows);
}

std::string Get(const std::map<std::string, std::string>& flag, const std::string& name,
                const std::string& fallback) {
  auto it = flag.find(name);
  return it == flag.end() ? fallback : it->second;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> flag;
  for (int i = 1; i + 1 < argc; i += 2) flag[argv[i]] = argv[i + 1];
  const torch::Tensor images =
      ReadImages(Get(flag, "--data-dir", "/usr/share/datasets/fashion-mnist") +
                     "/train-images-idx3-ubyte.gz",
                 std::stoll(Get(flag, "--examples", "0")));

  torch::set_num_threads(1);  // bit-identical runs: one reduction order
  torch::manual_seed(0);      // the same initial models everywhere (rank 0's win anyway)
  const bool sync_bn = Get(flag, "--sync-bn", "0") == "1";
  torch::nn::Sequential gen = Generator(sync_bn), disc = Discriminator(sync_bn);
  torch::optim::Adam g_opt(gen->parameters(), torch::optim::AdamOptions(2e-4).betas({0.5, 0.999}));
  torch::optim::Adam d_opt(disc->parameters(), torch::optim::AdamOptions(2e-4).betas({0.5, 0.999}));

  muster::Options options;
  options.node_id = Get(flag, "--node-id", "");
  options.dataset_size = images.size(0);
  options.batch_per_rank = std::stoi(Get(flag, "--batch", "64"));
  options.steps = std::stoll(Get(flag, "--steps", "0"));
  options.epochs = std::stoi(Get(flag, "--epochs", "1"));
  options.checkpoint_dir = Get(flag, "--checkpoint-dir", "");
  options.checkpoint_every = std::stoi(Get(flag, "--checkpoint-every", "0"));
  options.model_name = "fashion-gan";
  options.shard_optimizer_state = Get(flag, "--shard-optimizer", "0") == "1";
  // The summary's digest reads the optimizers' state after the loop.
  options.whole_optimizer_state_at_end = true;
  muster::State state;
  state.modules = {{"generator", gen.ptr().get()}, {"discriminator", disc.ptr().get()}};
  state.optimizers = {{"generator", &g_opt}, {"discriminator", &d_opt}};
  auto job = muster::Distributed::Start(options, state);
  if (!job.ok()) {
    std::cerr << "gan: " << job.status() << "\n";
    return muster::Distributed::ExitCode(job.status());
  }
  muster::Distributed& d = **job;
  // Sums over this rank's share, divided by the share's full size: a rank
  // whose share of an epoch's last batch is empty adds zero.
  const double per_rank = options.batch_per_rank;
  const auto bce = [per_rank](const torch::Tensor& logits, float target) {
    return torch::binary_cross_entropy_with_logits(
               logits, torch::full_like(logits, target), {}, {}, at::Reduction::Sum) /
           per_rank;
  };
  // --ghost-batch N: each rank's batch in parts of N examples, each with its
  // own forwards and backward calls, as N-example ranks would run them
  // (BatchNorm normalises each part on its own): one process with the
  // global batch then trains as a world of such ranks does.
  const size_t ghost = std::stoul(Get(flag, "--ghost-batch", "0"));
  const int pace_ms = std::stoi(Get(flag, "--pace-ms", "0"));
  const int kill_rank = std::stoi(Get(flag, "--kill-rank", "-1"));
  const int64_t kill_at_step = std::stoll(Get(flag, "--kill-at-step", "-1"));
  double d_loss = 0, g_loss = 0;
  while (!d.ShouldStop()) {
    const std::vector<int64_t>& batch = d.Batch();
    std::vector<torch::Tensor> reals, fakes;
    const size_t part_size = ghost > 0 ? ghost : std::max<size_t>(batch.size(), 1);
    for (size_t at = 0; at < std::max<size_t>(batch.size(), 1); at += part_size) {
      const std::vector<int64_t> part(batch.begin() + std::min(batch.size(), at),
                                      batch.begin() + std::min(batch.size(), at + part_size));
      // BatchNorm needs two examples: a smaller part (the end of an
      // epoch) adds nothing, its rank still joins both passes. With
      // SyncBatchNorm every rank runs the forwards, on what it has.
      if (part.size() < 2 && !sync_bn) continue;
      reals.push_back(images.index_select(0, torch::tensor(part, torch::kInt64)));
      fakes.push_back(gen->forward(Noise(d.step(), part, sync_bn)));
    }

    // The discriminator's pass: a backward for the real images, another for
    // the generated ones, then one optimizer step on the sum.
    d_opt.zero_grad();
    d.BeforeBackwardFor({"discriminator"});
    if (d.rank() == kill_rank && d.step() == kill_at_step) std::raise(SIGKILL);
    double loss_real = 0, loss_fake = 0;
    for (size_t k = 0; k < reals.size(); ++k) {
      torch::Tensor real_loss = bce(disc->forward(reals[k]), 1);
      real_loss.backward();
      torch::Tensor fake_loss = bce(disc->forward(fakes[k].detach()), 0);
      fake_loss.backward();
      loss_real += real_loss.item<double>();
      loss_fake += fake_loss.item<double>();
    }
    if (!d.AfterBackward().ok()) continue;  // a peer failed and the pass could not be salvaged
    d_opt.step();

    // The generator's pass, through the updated discriminator and the graph
    // of the generated images, built before the discriminator's pass.
    g_opt.zero_grad();
    d.BeforeBackwardFor({"generator"});
    double loss_g = 0;
    for (const torch::Tensor& fake : fakes) {
      torch::Tensor fake_loss = bce(disc->forward(fake), 1);
      fake_loss.backward();
      loss_g += fake_loss.item<double>();
    }
    if (!d.AfterBackward().ok()) continue;
    g_opt.step();

    if (reals.empty()) continue;
    d_loss = loss_real + loss_fake;
    g_loss = loss_g;
    d.RecordLoss(d_loss + g_loss);
    d.LogScalars({{"loss_d", d_loss}, {"loss_g", g_loss}});
    if (pace_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(pace_ms));
  }
  if (flag.count("--parameters") && d.rank() == 0) {
    std::ofstream out(flag["--parameters"]);
    out << std::setprecision(9);
    for (const auto& net : {gen, disc}) {
      for (const torch::Tensor& p : net->parameters()) {
        const torch::Tensor flat = p.detach().reshape({-1}).contiguous();
        for (int64_t i = 0; i < flat.numel(); ++i) out << flat[i].item<float>() << "\n";
      }
    }
  }
  if (flag.count("--summary")) {
    std::string path = flag["--summary"];
    if (auto at = path.find("{pid}"); at != std::string::npos) {
      path.replace(at, 5, std::to_string(::getpid()));
    }
    std::ofstream(path) << "{\"rank\": " << d.rank() << ", \"world_size\": " << d.world_size()
                        << ", \"steps\": " << d.step() << ", \"digest\": \"" << std::hex
                        << d.StateDigest() << std::dec << "\", \"state_elements\": "
                        << d.optimizer_state_elements() << "}\n";
  }
  std::cout << "gan: rank " << d.rank() << " of " << d.world_size() << ", step " << d.step()
            << ", loss_d " << d_loss << ", loss_g " << g_loss << std::endl;
  return muster::Distributed::ExitCode(d.Finish());
}
