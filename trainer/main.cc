// muster-train: the built-in trainer (models, data sets) over the trainer
// library. Run one per GPU or CPU slot; see README.md.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "common/clock.h"
#include "common/flag_names.h"
#include "common/lines.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "muster/options.h"
#include "muster/signals.h"
#include "muster/step_timeline.h"
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
ABSL_FLAG(std::string, gradient_compression, "none",
          "none, bf16 or fp16: the type gradient buckets cross nodes in (as DDP's "
          "bf16/fp16_compress_hook; inside a node they stay float32; a one-node world is not "
          "compressed)");
ABSL_FLAG(bool, broadcast_buffers, true,
          "copy the model's buffers (BatchNorm statistics) from rank 0 at each step boundary");
ABSL_FLAG(double, collective_timeout, 0,
          "seconds a step's all-reduce waits for the slowest peer before the world counts as "
          "broken and is regrouped without a rank that does not come (0: follow the job, 10x the "
          "slowest recent step and at least 10 s)");
ABSL_FLAG(double, rendezvous_timeout, 600,
          "seconds a trainer waits for a world before it gives up (a spare waits as long as the "
          "job runs)");
ABSL_FLAG(int64_t, check_state_every, 100,
          "the ranks compare their state digests before every checkpoint and every N steps "
          "(0: before checkpoints only); a mismatch stops with exit 65 and commits nothing");
ABSL_FLAG(int32_t, backward_calls, 1,
          "benchmarks: each rank's batch in this many parts, each with its own forward and "
          "backward inside the step's one synchronised pass (what several backward calls in a "
          "pass cost)");
ABSL_FLAG(int32_t, compute_ms, 0,
          "benchmarks: every step also spends this long as if computing (an accelerator's step "
          "time on a small CPU machine, so that a smaller world is not faster)");
ABSL_FLAG(bool, time_steps, false,
          "time every step but its batch loading: the library's work at the step boundary, "
          "forward, backward, all-reduce and the optimizer step done on the device (synchronises "
          "the GPU once per step); the summary's step_ms_p50 and step_ms_mean");
ABSL_FLAG(bool, deterministic, false,
          "deterministic cuDNN convolutions (slower): a resumed GPU run ends bit for bit as an "
          "uninterrupted one");
ABSL_FLAG(bool, salvage, true,
          "when a peer fails during a step's all-reduce, reduce the survivors' gradients in the "
          "regrouped world and take the step (false: drop it)");
ABSL_FLAG(bool, shard_optimizer, false,
          "keep about 1/W of the optimizer state on each rank (ZeRO-1), each part also on "
          "--optimizer-state-copies - 1 other ranks so a rank's death loses nothing");
ABSL_FLAG(int32_t, optimizer_state_copies, 2,
          "with --shard-optimizer: the ranks that keep each part of the state (1 or 2; with 1 a "
          "dead rank's part comes from the newest committed checkpoint)");
ABSL_FLAG(bool, reduce_scatter, false,
          "with --shard-optimizer: reduce-scatter the gradients (each rank gets the average of "
          "the parts it steps) instead of all-reducing them; with two copies only where a rank "
          "and its buddy share a column (two nodes of equal size)");
ABSL_FLAG(double, clip_grad_norm, 0,
          "clip each step's averaged gradients to this total 2-norm (0: no clipping); with "
          "--reduce-scatter too");
ABSL_FLAG(int64_t, eval_every, 0, "evaluate every N steps (0: at the end)");
ABSL_FLAG(int64_t, log_every, 20, "progress line every N steps");
ABSL_FLAG(std::string, log_dir, "", "JSON-lines metrics and TensorBoard events (rank 0)");
ABSL_FLAG(uint64_t, seed, 1, "random seed (model init, data order)");
ABSL_FLAG(std::string, backend, "auto", "auto, gloo, shm, hier or nccl");
ABSL_FLAG(std::string, device, "cpu", "cpu or cuda");
ABSL_FLAG(std::string, node_id, "", "node identity (default: from Slurm/torchrun/OpenMPI or the host name)");
ABSL_FLAG(int, local_rank, -1, "rank on this node (default: from the launcher, else 0)");
ABSL_FLAG(std::string, interface, "",
          "network interface whose address carries the traffic between nodes, e.g. ib0 "
          "(default $MUSTER_SOCKET_IFNAME; not with --address)");
ABSL_FLAG(std::string, address, "", "address other nodes reach this one at (default: where the coordinator sees this trainer's connection come from)");
ABSL_FLAG(std::string, job, "", "job name for shared memory (default: $SLURM_JOB_ID or 'muster')");
ABSL_FLAG(int, threads, 0,
          "LibTorch intra-op threads (0: the CPUs this process may use / trainers on its node, unless OMP_NUM_THREADS is set; -1: LibTorch's own)");
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

using muster::TrainOptions;

// Exit codes: the library's (muster::Distributed::ExitCode, docs/library.md)
// and 2 for bad flags.
constexpr int kExitBadFlags = 2;
constexpr int kExitConfig = 78;  // sysexits EX_CONFIG, as Distributed::kExitConfig
constexpr int kExitDataLoss = 65;  // sysexits EX_DATAERR, as Distributed::kExitDataLoss

// The library's options from the flags: the job, communication, data
// schedule, checkpoints and output.
absl::StatusOr<muster::Options> LibraryOptionsFromFlags() {
  muster::Options lib;
  lib.coordinator = absl::GetFlag(FLAGS_coordinator);
  if (lib.coordinator.empty() && std::getenv("MUSTER_COORDINATOR") == nullptr) {
    return absl::InvalidArgumentError(
        "no coordinator: pass --coordinator HOST:PORT or set MUSTER_COORDINATOR");
  }
  lib.token_file = absl::GetFlag(FLAGS_token_file);
  lib.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  lib.node_id = absl::GetFlag(FLAGS_node_id);
  lib.local_rank = absl::GetFlag(FLAGS_local_rank);
  MUSTER_ASSIGN_OR_RETURN(lib.backend, muster::ParseBackend(absl::GetFlag(FLAGS_backend)));
  lib.address = absl::GetFlag(FLAGS_address);
  lib.interface = absl::GetFlag(FLAGS_interface);
  lib.job = absl::GetFlag(FLAGS_job);
  const std::string device = absl::GetFlag(FLAGS_device);
  if (device != "cpu" && device != "cuda") {
    return absl::InvalidArgumentError("--device must be cpu or cuda, not '" + device + "'");
  }
  lib.cuda = device == "cuda";
  lib.bucket_mb = absl::GetFlag(FLAGS_bucket_mb);
  lib.overlap = absl::GetFlag(FLAGS_overlap);
  absl::StatusOr<muster::GradientCompression> compression =
      muster::ParseGradientCompression(absl::GetFlag(FLAGS_gradient_compression));
  if (!compression.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--gradient-compression: ", compression.status().message()));
  }
  lib.gradient_compression = *compression;
  lib.broadcast_buffers = absl::GetFlag(FLAGS_broadcast_buffers);
  lib.check_state_every = absl::GetFlag(FLAGS_check_state_every);
  lib.collective_timeout_s = absl::GetFlag(FLAGS_collective_timeout);
  lib.rendezvous_timeout_s = absl::GetFlag(FLAGS_rendezvous_timeout);
  lib.salvage = absl::GetFlag(FLAGS_salvage);
  lib.shard_optimizer_state = absl::GetFlag(FLAGS_shard_optimizer);
  lib.optimizer_state_copies = absl::GetFlag(FLAGS_optimizer_state_copies);
  lib.reduce_scatter_gradients = absl::GetFlag(FLAGS_reduce_scatter);
  lib.clip_grad_norm = absl::GetFlag(FLAGS_clip_grad_norm);
  lib.batch_per_rank = absl::GetFlag(FLAGS_batch_size);
  lib.seed = absl::GetFlag(FLAGS_seed);
  lib.steps = absl::GetFlag(FLAGS_steps);
  lib.epochs = absl::GetFlag(FLAGS_epochs);
  const std::string elastic_lr = absl::GetFlag(FLAGS_elastic_lr);
  if (elastic_lr != "scale" && elastic_lr != "keep") {
    return absl::InvalidArgumentError("--elastic-lr must be scale or keep, not '" +
                                      elastic_lr + "'");
  }
  lib.elastic_lr = elastic_lr == "keep" ? muster::ElasticLr::kKeep : muster::ElasticLr::kScale;
  lib.checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  lib.checkpoint_every = absl::GetFlag(FLAGS_checkpoint_every);
  lib.checkpoint_interval_s = absl::GetFlag(FLAGS_checkpoint_interval);
  lib.resume = absl::GetFlag(FLAGS_resume);
  lib.state_listen = absl::GetFlag(FLAGS_state_listen);
  lib.state_tls_cert = absl::GetFlag(FLAGS_state_tls_cert);
  lib.state_tls_key = absl::GetFlag(FLAGS_state_tls_key);
  lib.handle_signals = true;  // the library's handlers, installed first thing in main
  lib.quiet = absl::GetFlag(FLAGS_quiet);
  lib.log_every = std::max<int64_t>(1, absl::GetFlag(FLAGS_log_every));
  lib.log_dir = absl::GetFlag(FLAGS_log_dir);
  if (lib.batch_per_rank < 1 || lib.epochs < 0 || lib.steps < 0 || !(lib.bucket_mb > 0)) {
    return absl::InvalidArgumentError(
        "--batch-size and --bucket-mb must be positive, --steps and --epochs not negative");
  }
  return lib;
}

// The run from the flags. INVALID_ARGUMENT names the bad flag.
absl::StatusOr<TrainOptions> OptionsFromFlags() {
  TrainOptions o;
  MUSTER_ASSIGN_OR_RETURN(o.library, LibraryOptionsFromFlags());
  o.model = absl::GetFlag(FLAGS_model);
  o.dataset = absl::GetFlag(FLAGS_dataset);
  o.data_dir = absl::GetFlag(FLAGS_data_dir);
  o.synthetic_size = absl::GetFlag(FLAGS_synthetic_size);
  o.synthetic_channels = absl::GetFlag(FLAGS_synthetic_channels);
  o.lr = absl::GetFlag(FLAGS_lr);
  o.lr_scaling = absl::GetFlag(FLAGS_lr_scaling);
  o.optimizer = absl::GetFlag(FLAGS_optimizer);
  o.momentum = absl::GetFlag(FLAGS_momentum);
  o.weight_decay = absl::GetFlag(FLAGS_weight_decay);
  o.warmup_steps = absl::GetFlag(FLAGS_warmup_steps);
  o.compute_ms = std::max(0, absl::GetFlag(FLAGS_compute_ms));
  o.backward_calls = std::max(1, absl::GetFlag(FLAGS_backward_calls));
  o.time_steps = absl::GetFlag(FLAGS_time_steps);
  o.deterministic = absl::GetFlag(FLAGS_deterministic);
  o.eval_every = absl::GetFlag(FLAGS_eval_every);
  o.library.intra_op_threads = absl::GetFlag(FLAGS_threads);
  // muster-train's lines for people (the world line, progress, eval, done)
  // go to its standard output.
  o.library.output = muster::StandardOutput();
  if (!(o.lr > 0)) return absl::InvalidArgumentError("--lr must be positive");
  if (o.optimizer != "sgd" && o.optimizer != "adamw") {
    return absl::InvalidArgumentError("--optimizer must be sgd or adamw, not '" + o.optimizer +
                                      "'");
  }
  if (o.lr_scaling != "linear" && o.lr_scaling != "none") {
    return absl::InvalidArgumentError("--lr-scaling must be linear or none, not '" +
                                      o.lr_scaling + "'");
  }
  return o;
}

// The step timeline's fields as JSON members, "phase_<field>": ...
std::string TimelineJson(const muster::StepTimeline& t) {
  return absl::StrFormat(
      "\"phase_steps\": %d, \"phase_step_ms\": %.3f, \"phase_forward_ms\": %.3f, "
      "\"phase_before_backward_ms\": %.3f, \"phase_backward_ms\": %.3f, "
      "\"phase_after_backward_ms\": %.3f, \"phase_optimizer_ms\": %.3f, "
      "\"phase_boundary_ms\": %.3f, \"phase_reduce_ms\": %.3f, \"phase_gather_ms\": %.3f",
      t.steps, t.step_ms, t.forward_ms, t.before_backward_ms, t.backward_ms,
      t.after_backward_ms, t.optimizer_ms, t.boundary_ms, t.reduce_ms, t.gather_ms);
}

// The memory account's bytes, as "memory_<category>" fields.
std::string MemoryJson(const muster::MemoryAccount& m) {
  return absl::StrFormat(
      "\"memory_parameters\": %d, \"memory_gradients\": %d, \"memory_optimizer_state\": %d, "
      "\"memory_communication\": %d, \"memory_staging\": %d, \"memory_transfer\": %d, "
      "\"memory_total\": %d",
      m.parameters, m.gradients, m.optimizer_state, m.communication, m.staging, m.transfer,
      m.total());
}

// --summary-json: this trainer's final figures, one file per trainer.
void WriteSummary(const muster::Placement& place, const muster::TrainResult& r) {
  const std::string path = absl::StrReplaceAll(
      absl::GetFlag(FLAGS_summary_json),
      {{"{node}", place.node}, {"{local_rank}", std::to_string(place.local_rank)}});
  if (path.empty()) return;
  std::ofstream(path) << absl::StrFormat(
      "{\"rank\": %d, \"world_size\": %d, \"steps\": %d, \"steps_per_s\": %.4f, "
      "\"samples_per_s\": %.2f, \"comm_overlap_pct\": %.2f, \"test_accuracy\": %.4f, "
      "\"test_loss\": %.4f, \"regroups\": %d, \"steps_salvaged\": %d, \"steps_dropped\": %d, "
      "\"step_ms_p50\": %.3f, \"step_ms_mean\": %.3f, \"step_ms_warmup\": %d, "
      "\"intra_op_threads\": %d, \"optimizer_state_elements\": %d, "
      "\"parameter_checksum\": %.17g, \"last_gradient_norm\": %s, %s, %s}\n",
      r.rank, r.world_size, r.steps, r.steps_per_second, r.samples_per_second,
      r.comm_overlap_pct, r.test_accuracy, r.test_loss, r.regroups, r.steps_salvaged,
      r.steps_dropped, r.step_ms_p50, r.step_ms_mean, r.step_ms_warmup, r.intra_op_threads,
      r.optimizer_state_elements, r.parameter_checksum,
      std::isnan(r.last_gradient_norm) ? "null" : absl::StrFormat("%.9g", r.last_gradient_norm),
      TimelineJson(r.timeline), MemoryJson(r.memory));
}

int Run() {
  absl::StatusOr<TrainOptions> o = OptionsFromFlags();
  absl::StatusOr<muster::Placement> place =
      o.ok() ? muster::ResolvePlacement(o->library) : o.status();
  if (!place.ok()) {
    std::cerr << "muster-train: " << place.status().message() << "\n";
    return kExitBadFlags;
  }
  MUSTER_LOG(INFO) << "member " << place->member_id << " (identity from " << place->source
                   << (place->spare ? ", a spare" : "") << "), coordinator "
                   << (o->library.coordinator.empty() ? std::getenv("MUSTER_COORDINATOR")
                                                      : o->library.coordinator)
                   << ", model " << o->model << ", dataset " << o->dataset << ", batch "
                   << o->library.batch_per_rank << ", lr " << o->lr << " (" << o->lr_scaling
                   << "), optimizer " << o->optimizer << ", bucket " << o->library.bucket_mb
                   << " MiB, backend " << absl::GetFlag(FLAGS_backend)
                   << ", gradient compression "
                   << muster::GradientCompressionName(o->library.gradient_compression)
                   << ", device " << absl::GetFlag(FLAGS_device);
  absl::StatusOr<muster::TrainResult> result = muster::RunTraining(*o, muster::RealClock::Get());
  if (!result.ok()) {
    std::cerr << "muster-train: " << result.status() << "\n";
    if (absl::IsInvalidArgument(result.status()) || absl::IsUnauthenticated(result.status())) {
      return kExitConfig;  // as Distributed::ExitCode
    }
    return absl::IsDataLoss(result.status()) ? kExitDataLoss : 1;
  }
  WriteSummary(*place, *result);
  return result->exit_code;
}

}  // namespace

int main(int argc, char** argv) {
  muster::ListOwnFlagsInHelp();
  absl::SetProgramUsageMessage(
      "muster-train --coordinator HOST:PORT [--token-file F] --model mlp|cnn|resnet18 "
      "--dataset fashion-mnist|synthetic --batch-size N --steps N|--epochs N [options]");
  // First of all, so that a signal during start-up (loading LibTorch and
  // the data takes a while) is not fatal but acted on at the first step.
  muster::InstallSignalHandlers();
  muster::DashesToUnderscores(argc, argv);
  muster::ParseFlags(argc, argv);
  return Run();
}
