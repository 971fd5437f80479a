// muster-train: the built-in trainer (models, data sets) over the trainer
// library. Run one per GPU or CPU slot; see README.md.
#include <signal.h>
#include <unistd.h>

#include <atomic>

#include <cstdlib>
#include <fstream>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "common/flag_names.h"
#include "common/launch_env.h"
#include "common/logging.h"
#include "common/token.h"
#include "muster/signals.h"
#include "trainer/train/trainer.h"

ABSL_FLAG(std::string, coordinator, "", "host:port of the coordinator (or $MUSTER_COORDINATOR)");
ABSL_FLAG(std::string, token_file, "", "job token file (or $MUSTER_TOKEN_FILE)");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA of a TLS coordinator");
ABSL_FLAG(std::string, model, "cnn", "mlp, cnn or resnet18");
ABSL_FLAG(std::string, dataset, "fashion-mnist", "fashion-mnist or synthetic");
ABSL_FLAG(std::string, data_dir, "", "Fashion-MNIST directory (default /usr/share/datasets/fashion-mnist)");
ABSL_FLAG(int, synthetic_size, 28, "synthetic images are N x N");
ABSL_FLAG(int, synthetic_channels, 1, "synthetic image channels");
ABSL_FLAG(int, batch_size, 64, "examples per rank per step");
ABSL_FLAG(int64_t, steps, 0, "train this many steps (overrides --epochs)");
ABSL_FLAG(int, epochs, 1, "train this many epochs");
ABSL_FLAG(double, lr, 0.01, "peak learning rate for one rank (see --lr-scaling)");
ABSL_FLAG(std::string, lr_scaling, "linear", "linear: multiply --lr by the world size; none");
ABSL_FLAG(std::string, elastic_lr, "scale",
          "after a regroup: scale the learning rate to the new world size (with "
          "--lr-scaling=linear), or keep the first world's");
ABSL_FLAG(std::string, optimizer, "sgd", "sgd (with momentum) or adamw");
ABSL_FLAG(double, momentum, 0.9, "SGD momentum");
ABSL_FLAG(double, weight_decay, 0.0, "weight decay");
ABSL_FLAG(int64_t, warmup_steps, 50, "linear warm-up steps, then cosine decay to 10%");
ABSL_FLAG(double, bucket_mb, 25, "gradient bucket size in MiB");
ABSL_FLAG(bool, overlap, true, "all-reduce buckets during backward (false: after it)");
ABSL_FLAG(int32_t, compute_ms, 0,
          "benchmarks: every step also spends this long as if computing (an accelerator's step "
          "time on a small CPU machine, so that a smaller world is not faster)");
ABSL_FLAG(bool, salvage, true,
          "when a peer fails during a step's all-reduce, reduce the survivors' gradients in the "
          "regrouped world and take the step (false: drop it)");
ABSL_FLAG(int64_t, eval_every, 0, "evaluate every N steps (0: at the end)");
ABSL_FLAG(int64_t, log_every, 20, "progress line every N steps");
ABSL_FLAG(std::string, log_dir, "", "JSON-lines metrics and TensorBoard events (rank 0)");
ABSL_FLAG(uint64_t, seed, 1, "random seed (model init, data order)");
ABSL_FLAG(std::string, backend, "auto", "auto, gloo, shm, hier or nccl");
ABSL_FLAG(std::string, device, "cpu", "cpu or cuda");
ABSL_FLAG(std::string, node_id, "", "node identity (default: from Slurm/torchrun/OpenMPI or the host name)");
ABSL_FLAG(int, local_rank, -1, "rank on this node (default: from the launcher, else 0)");
ABSL_FLAG(std::string, address, "", "address other nodes reach this one at (default: host name)");
ABSL_FLAG(std::string, job, "", "job name for shared memory (default: $SLURM_JOB_ID or 'muster')");
ABSL_FLAG(int, threads, 0, "LibTorch intra-op threads (0: cores / trainers on this node)");
ABSL_FLAG(std::string, summary_json, "",
          "write this trainer's final figures to FILE as JSON; {node} and {local_rank} in "
          "FILE are replaced (one file per trainer under muster-agent)");
ABSL_FLAG(bool, quiet, false, "no progress lines");
ABSL_FLAG(std::string, checkpoint_dir, "", "directory (shared by all nodes) for checkpoints; empty: none");
ABSL_FLAG(int64_t, checkpoint_every, 0, "checkpoint every N steps");
ABSL_FLAG(double, checkpoint_interval, 0, "checkpoint every N seconds");
ABSL_FLAG(std::string, state_listen, "0.0.0.0:0",
          "host:port of this trainer's state service (muster pull-weights); port 0 picks a "
          "free one; empty: none");
ABSL_FLAG(std::string, state_tls_cert, "", "PEM certificate: the state service serves TLS");
ABSL_FLAG(std::string, state_tls_key, "", "PEM private key for --state-tls-cert");
ABSL_FLAG(bool, resume, true, "resume from the newest committed checkpoint");

namespace {

// Exit code after a signal (SIGUSR1/SIGTERM) made every rank checkpoint and
// stop: "try again" (sysexits.h EX_TEMPFAIL); a requeued job resumes.
constexpr int kExitStoppedBySignal = 75;

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

int Run() {
  using namespace muster;  // NOLINT
  TrainOptions o;
  o.client.target = absl::GetFlag(FLAGS_coordinator);
  if (o.client.target.empty()) o.client.target = Env("MUSTER_COORDINATOR");
  if (o.client.target.empty()) {
    std::cerr << "muster-train: no coordinator: pass --coordinator HOST:PORT or set "
                 "MUSTER_COORDINATOR\n";
    return 2;
  }
  auto token = ResolveToken(absl::GetFlag(FLAGS_token_file));
  if (!token.ok()) {
    std::cerr << "muster-train: " << token.status() << "\n";
    return 2;
  }
  o.client.token = *token;
  o.client.tls.ca = absl::GetFlag(FLAGS_tls_ca);
  char host[256] = "localhost";
  ::gethostname(host, sizeof(host) - 1);
  LaunchFlags lf{absl::GetFlag(FLAGS_node_id), absl::GetFlag(FLAGS_local_rank)};
  auto id = ResolveLaunchIdentity(lf, [](const char* n) { return std::getenv(n); }, host);
  if (!id.ok()) {
    std::cerr << "muster-train: " << id.status() << "\n";
    return 2;
  }
  o.client.member_id = id->member_id();
  o.client.node = id->node;
  o.client.local_rank = static_cast<uint32_t>(id->local_rank);
  o.client.spare = id->spare;
  o.local_world_size = id->local_world_size;
  auto backend = ParseBackend(absl::GetFlag(FLAGS_backend));
  if (!backend.ok()) {
    std::cerr << "muster-train: " << backend.status() << "\n";
    return 2;
  }
  o.comm.backend = *backend;
  o.comm.job = absl::GetFlag(FLAGS_job);
  if (o.comm.job.empty()) o.comm.job = Env("SLURM_JOB_ID").empty() ? "muster" : Env("SLURM_JOB_ID");
  o.comm.gloo.hostname = absl::GetFlag(FLAGS_address);
  const std::string device = absl::GetFlag(FLAGS_device);
  if (device != "cpu" && device != "cuda") {
    std::cerr << "muster-train: --device must be cpu or cuda\n";
    return 2;
  }
  o.comm.cuda = device == "cuda";
  o.comm.cuda_device = id->local_rank;
  o.model = absl::GetFlag(FLAGS_model);
  o.dataset = absl::GetFlag(FLAGS_dataset);
  o.data_dir = absl::GetFlag(FLAGS_data_dir);
  o.synthetic_size = absl::GetFlag(FLAGS_synthetic_size);
  o.synthetic_channels = absl::GetFlag(FLAGS_synthetic_channels);
  o.batch_size = absl::GetFlag(FLAGS_batch_size);
  o.steps = absl::GetFlag(FLAGS_steps);
  o.epochs = absl::GetFlag(FLAGS_epochs);
  o.lr = absl::GetFlag(FLAGS_lr);
  o.lr_scaling = absl::GetFlag(FLAGS_lr_scaling);
  o.elastic_lr = absl::GetFlag(FLAGS_elastic_lr);
  o.optimizer = absl::GetFlag(FLAGS_optimizer);
  o.momentum = absl::GetFlag(FLAGS_momentum);
  o.weight_decay = absl::GetFlag(FLAGS_weight_decay);
  o.warmup_steps = absl::GetFlag(FLAGS_warmup_steps);
  o.bucket_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_bucket_mb) * (1 << 20));
  o.overlap = absl::GetFlag(FLAGS_overlap);
  o.salvage = absl::GetFlag(FLAGS_salvage);
  o.compute_ms = std::max(0, absl::GetFlag(FLAGS_compute_ms));
  o.eval_every = absl::GetFlag(FLAGS_eval_every);
  o.log_every = std::max<int64_t>(1, absl::GetFlag(FLAGS_log_every));
  o.log_dir = absl::GetFlag(FLAGS_log_dir);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.threads = absl::GetFlag(FLAGS_threads);
  if (o.batch_size < 1 || o.epochs < 0 || o.steps < 0 || o.lr <= 0 || o.bucket_bytes == 0) {
    std::cerr << "muster-train: --batch-size, --lr and --bucket-mb must be positive\n";
    return 2;
  }
  if (o.optimizer != "sgd" && o.optimizer != "adamw") {
    std::cerr << "muster-train: --optimizer must be sgd or adamw\n";
    return 2;
  }
  if (o.elastic_lr != "scale" && o.elastic_lr != "keep") {
    std::cerr << "muster-train: --elastic-lr must be scale or keep, not '" << o.elastic_lr
              << "'\n";
    return 2;
  }
  if (o.lr_scaling != "linear" && o.lr_scaling != "none") {
    std::cerr << "muster-train: --lr-scaling must be linear or none\n";
    return 2;
  }
  MUSTER_LOG(INFO) << "member " << o.client.member_id << " (identity from " << id->source
                   << "), coordinator " << o.client.target << ", model " << o.model
                   << ", dataset " << o.dataset << ", batch " << o.batch_size << ", lr " << o.lr
                   << " (" << o.lr_scaling << "), optimizer " << o.optimizer << ", bucket "
                   << absl::GetFlag(FLAGS_bucket_mb) << " MiB, backend "
                   << absl::GetFlag(FLAGS_backend) << ", device " << device;
  o.quiet = absl::GetFlag(FLAGS_quiet);
  o.checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  o.checkpoint_every = absl::GetFlag(FLAGS_checkpoint_every);
  o.checkpoint_interval_s = absl::GetFlag(FLAGS_checkpoint_interval);
  o.resume = absl::GetFlag(FLAGS_resume);
  o.state_listen = absl::GetFlag(FLAGS_state_listen);
  o.state_tls.cert = absl::GetFlag(FLAGS_state_tls_cert);
  o.state_tls.key = absl::GetFlag(FLAGS_state_tls_key);
  o.handle_signals = true;  // the library's handlers, installed first thing in main
  auto result = RunTraining(o);
  if (!result.ok()) {
    std::cerr << "muster-train: " << result.status() << "\n";
    return 1;
  }
  if (const std::string path = absl::StrReplaceAll(
          absl::GetFlag(FLAGS_summary_json),
          {{"{node}", id->node}, {"{local_rank}", std::to_string(id->local_rank)}});
      !path.empty()) {
    std::ofstream(path) << absl::StrFormat(
        "{\"rank\": %d, \"world_size\": %d, \"steps\": %d, \"steps_per_s\": %.4f, "
        "\"samples_per_s\": %.2f, \"comm_overlap_pct\": %.2f, \"test_accuracy\": %.4f, "
        "\"test_loss\": %.4f, \"regroups\": %d, \"steps_salvaged\": %d, \"steps_dropped\": %d, "
        "\"parameter_checksum\": %.17g}\n",
        result->rank, result->world_size, result->steps, result->steps_per_second,
        result->samples_per_second, result->comm_overlap_pct, result->test_accuracy,
        result->test_loss, result->regroups, result->steps_salvaged, result->steps_dropped,
        result->parameter_checksum);
  }
  if (result->stopped) return kExitStoppedBySignal;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "muster-train --coordinator HOST:PORT [--token-file F] --model mlp|cnn|resnet18 "
      "--dataset fashion-mnist|synthetic --batch-size N --steps N|--epochs N [options]");
  // First of all, so that a signal during start-up (loading LibTorch and
  // the data takes a while) is not fatal but acted on at the first step.
  muster::InstallSignalHandlers();
  muster::DashesToUnderscores(argc, argv);
  absl::ParseCommandLine(argc, argv);
  return Run();
}
