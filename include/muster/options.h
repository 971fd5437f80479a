// muster::Options (what a muster::Distributed is started with), Progress
// (where the job stands) and Placement (where this process runs in the job).
// No LibTorch here: programs that define their own flags include this header
// to fill Options without pulling in LibTorch's headers; muster/muster.h
// includes it.
#ifndef MUSTER_OPTIONS_H_
#define MUSTER_OPTIONS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "muster/backend.h"

namespace muster {

class FileSystem;  // common/file_system.h: the seam tests use to inject faults

// Where the job stands; the same on every rank between steps.
struct Progress {
  // Committed steps so far: a one-pass step counts from its
  // AfterBackward's OK, a step of several passes from the next ShouldStop.
  int64_t step = 0;
  int64_t total_steps = 0;    // step + the steps left at this world size
  int64_t epoch = 0;          // epoch of the next global batch
  int64_t sample_offset = 0;  // global samples consumed by all committed steps
  int64_t global_batch = 0;   // samples per step at this world size
  int rank = 0;
  int world_size = 0;
  uint64_t generation = 0;
  // The world size the learning rate is scaled for: the current one with
  // ElasticLr::kScale, the first world's with kKeep.
  int lr_world_size = 0;
};

// After a regroup the learning rate follows the new world (kScale) or keeps
// the one of the world training started in (kKeep).
enum class ElasticLr { kScale, kKeep };

struct Options {
  // ---- The job ----
  std::string coordinator;  // host:port; default $MUSTER_COORDINATOR
  std::string token_file;   // default $MUSTER_TOKEN_FILE; none: no token
  std::string token;        // the token itself (wins over token_file)
  std::string tls_ca;       // PEM CA of a TLS coordinator
  std::string node_id;      // default: from Slurm/torchrun/OpenMPI, else the host name
  int local_rank = -1;      // default: from the launcher, else 0
  uint64_t incarnation = 0; // 0: a fresh one
  // How long Start tries to reach the coordinator and join (UNAVAILABLE
  // after), and how long a member waits for a world to form (the job below
  // its minimum; DEADLINE_EXCEEDED after).
  double join_timeout_s = 120;
  double rendezvous_timeout_s = 600;

  // ---- Communication ----
  Backend backend = Backend::kAuto;
  // The address other nodes reach this one at. Default: where the
  // coordinator sees this member's connection come from (loopback when the
  // whole job runs on the coordinator's host, else this node's address on the
  // network the coordinator is reached through).
  std::string address;
  // The network interface whose address carries the traffic between nodes
  // (Gloo's), e.g. "ib0" for the data network of a node that also has a
  // management network, as NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME choose.
  // Default $MUSTER_SOCKET_IFNAME; unset: `address` as above. Not together
  // with `address`.
  std::string interface;
  std::string job;           // names shared memory; default $MUSTER_JOB, $SLURM_JOB_ID or "muster"
  bool cuda = false;         // tensors and collectives on this process's GPU
  double bucket_mb = 25;     // gradient bucket size
  bool overlap = true;       // reduce buckets during backward
  // LibTorch's intra-op threads (torch::set_num_threads), set on the
  // training thread each time a world is entered. 0: the CPUs this process
  // may run on (its affinity, as Slurm or taskset bind it) shared out among
  // the trainers of its node in that world, at least 1, as torchrun sets
  // OMP_NUM_THREADS=1 for several trainers per node; left alone when
  // $OMP_NUM_THREADS is set. Several trainers each running LibTorch's
  // default (every core) on one node oversubscribe it: OpenMP's workers spin
  // while the others compute. N > 0: N threads. -1: never touched.
  int intra_op_threads = 0;
  // The type gradient buckets cross nodes in (muster/backend.h), as DDP's
  // bf16_compress_hook / fp16_compress_hook: kBf16 or kFp16 halve the
  // bytes between nodes. Buckets are reduced in float32 inside each node;
  // each node's float32 partial sums are rounded once to the 16-bit type,
  // summed across nodes (float32 accumulation over Gloo, the type's on
  // NCCL) and widened back into the float32 gradients, averaged over the
  // world in float32. A world of one node is not compressed (nothing
  // crosses nodes; said once in the log). The step's control words and
  // every other collective stay float32; step salvage re-reduces the
  // float32 gradients the survivors hold, compressed the same way. Every
  // trainer of a job must use the same value. A value outside the enum is
  // refused by Validate.
  GradientCompression gradient_compression = GradientCompression::kNone;
  // How long a step's all-reduce waits for the slowest peer before the
  // world counts as broken: reported to the coordinator, which regroups and
  // leaves out a member that does not come (a rank hung in compute). 0
  // follows the job: 10x the slowest of the last 20 steps, at least 10 s
  // (120 s for the first steps). Set it above anything one rank does alone
  // between steps while the others wait (an evaluation on rank 0 only).
  // Building a communicator, the state transfer and AllReduceSum (an
  // evaluation, whose ranks may arrive far apart) wait at least 120 s.
  double collective_timeout_s = 0;
  // The modules' buffers (BatchNorm's running statistics and step count,
  // any registered buffer) that a forward pass changed on some rank are
  // copied from rank 0 at every step boundary (in ShouldStop, after every
  // pass of the step, before a checkpoint), as DDP's broadcast_buffers
  // copies them before a forward: every rank holds the same state between
  // steps, and nothing is written into a tensor that a graph of the step
  // may still need. false: each rank keeps its own (the ranks' state
  // digests then differ, and the state checks below stop the job).
  bool broadcast_buffers = true;
  // The ranks compare their state digests (one all-reduce of a word per
  // rank, after hashing the whole state) before every checkpoint, and
  // every `check_state_every` steps (0: before checkpoints only). Ranks
  // that disagree stop the run with DATA_LOSS naming them and the first
  // module tensor that differs, and that checkpoint is never written.
  int64_t check_state_every = 100;
  // A peer that fails during a step's all-reduce: the survivors reduce the
  // gradients they hold in the regrouped world and take the step (the dead
  // ranks' examples come again); false drops the step.
  bool salvage = true;
  // ZeRO stage 1 (docs/sharding.md): each rank keeps the optimizer state
  // of about 1/W of the parameters, and `optimizer_state_copies` ranks
  // (another node's where there is one) keep each part, so a rank's death
  // loses nothing. A world of at most `optimizer_state_copies` ranks,
  // where every rank would keep every part, is not sharded: it steps as
  // unsharded and writes whole checkpoints. At each step boundary the parameters are all-gathered
  // from the ranks that stepped them; a change of world regathers the
  // state from the survivors in memory. The gradients are all-reduced as
  // without (so the numbers are the unsharded run's, bit for bit; see
  // reduce_scatter_gradients for one copy), and the
  // state is whole on every rank for a moment only where something reads
  // it whole (a change of world that no copy survives; see
  // whole_optimizer_state_at_end for the end of the run). A checkpoint, the
  // stop's too, is written a file a rank, each its own part (the periodic
  // state check compares each part's copies where they are kept), and a
  // load reads only the parts the rank keeps.
  // Every optimizer must be one of LibTorch's with per-element state (SGD,
  // Adam, AdamW, RMSprop, Adagrad) over float32 parameters on one device;
  // Start refuses others (LBFGS, a program's own codec) with
  // INVALID_ARGUMENT.
  // Between optimizer.step() and the next ShouldStop each rank's model
  // holds the new values only in the parts it keeps: evaluate or save the
  // model after ShouldStop (or after the loop), not right after the step.
  // A step of several passes (State::modules, a GAN): each pass's
  // BeforeBackwardFor gathers what the earlier passes' optimizers stepped,
  // so call it before the pass's forward, as examples/gan.cc does, when
  // that forward reads a module stepped earlier in the step (the
  // generator's pass through the updated discriminator).
  // Clipping the gradients in place between AfterBackward and
  // optimizer.step() (clip_grad_norm_ on the model's parameters) counts, as
  // unsharded; a change through the optimizer's own parameter list does
  // not (it holds the parts this rank keeps). A change to the parameters
  // after optimizer.step() (a WGAN's weight clipping, on every rank) is kept
  // where a group's parameters are contiguous (the parts a rank keeps are
  // then their own storage); elsewhere it is overwritten. With 1 copy, a dead rank's
  // part has no holder: every rank of the next world restores the newest
  // committed checkpoint in the running job and trains the steps since
  // again (without checkpoint_dir, NOT_FOUND ends the run). Every trainer
  // of a job must use the same values.
  bool shard_optimizer_state = false;
  int optimizer_state_copies = 2;
  // With shard_optimizer_state: at the end of training and after the
  // checkpoint to stop, the program's optimizers are given back with the
  // whole state on every rank (a moment of unsharded memory), so that it
  // may read or save them. false (the default): they are given back with
  // their own parameter lists and no state; the parameters are the
  // trained ones on every rank, and the state is in the checkpoints.
  bool whole_optimizer_state_at_end = false;
  // With shard_optimizer_state: while the state is sharded, a pass that
  // reduces every parameter the optimizers train reduce-scatters the
  // gradients instead of all-reducing them, so that each rank receives the
  // average of the parts it steps alone. With one copy the reduction moves
  // half the bytes, and the all-gather of the parameters the other half;
  // with two copies it does so on two nodes of equal size (a rank and its
  // buddy share a column: the node's all-gather of the gradients is saved)
  // and elsewhere all-reduces (docs/sharding.md, "Reduce-scatter"). The
  // parameters' .grad then hold this rank's own gradient, not the average:
  // clipping them does not change the step, so a program that clips its
  // gradients sets clip_grad_norm instead, and one that reads them must not
  // set this. A pass over some of the parameters (a GAN's), and every pass
  // where the state is whole (a world of one, a salvaged step),
  // all-reduces as without it. The result equals the
  // all-reduced run's within float32 summation order, and is the same bits
  // on every rank. Start refuses it without sharded state.
  bool reduce_scatter_gradients = false;
  // > 0: after each pass's reduction (AfterBackward, a salvaged pass too),
  // the gradients the optimizers step with are scaled so that their total
  // 2-norm over the pass's parameters is at most this, as
  // torch::nn::utils::clip_grad_norm_(parameters, clip_grad_norm) does to
  // the averaged gradients (bit for bit where the .grad hold them: without
  // reduce_scatter_gradients). With it no rank holds every averaged
  // gradient: the squared norms of the parts each rank owns are summed over
  // the world (one all-reduce of a float64), and each rank scales the parts
  // it steps, within float32 rounding of the all-reduced run.
  // Distributed::last_gradient_norm is the norm before clipping. 0: no
  // clipping by muster (a program that does not reduce-scatter may clip
  // the .grad itself after AfterBackward).
  double clip_grad_norm = 0;

  // ---- Data: a distributed sampler over indices [0, dataset_size) ----
  int64_t dataset_size = 0;  // required
  int batch_per_rank = 0;    // required
  uint64_t seed = 1;         // per-epoch permutation seed
  int64_t steps = 0;         // > 0: stop after this many steps
  int64_t epochs = 1;        // with steps == 0: stop after epochs * dataset_size samples

  // ---- Learning rate ----
  // Called before every step with where the job stands: the rate of the
  // optimizer's first parameter group. Every other group gets it times its
  // own rate at Start over the first group's, so the groups' ratios hold.
  // Without State::optimizer the program applies it itself: read it as
  // Distributed::learning_rates()[0]. Null: the rates are left alone.
  std::function<double(const Progress&)> lr_schedule;
  // Called before every step for each parameter group (by its index in
  // param_groups()): that group's rate. Wins over lr_schedule. Needs
  // State::optimizer (Start refuses it without one).
  std::function<double(const Progress&, size_t group)> group_lr_schedule;
  ElasticLr elastic_lr = ElasticLr::kScale;

  // ---- Checkpoints (empty dir: none) ----
  std::string checkpoint_dir;        // shared by all nodes
  int64_t checkpoint_every = 0;      // steps; 0 = not by steps
  double checkpoint_interval_s = 0;  // seconds; 0 = not by time
  bool resume = true;                // restore the newest committed checkpoint at start
  std::string model_name;            // recorded in checkpoints and logs
  std::string optimizer_name;
  FileSystem* checkpoint_fs = nullptr;  // default: the real file system

  // ---- The state service (muster pull-weights); "" = none ----
  std::string state_listen = "0.0.0.0:0";
  std::string state_tls_cert, state_tls_key;

  // ---- Stopping ----
  // Installs SIGUSR1 (stop: checkpoint, exit 75) and SIGTERM (leave; every
  // rank at once: like SIGUSR1) handlers at Start, keeping and calling the
  // program's own (muster/signals.h). Off: the program owns its signals and
  // calls Distributed::RequestStop/RequestLeave; also off when ranks run as
  // threads.
  bool handle_signals = true;
  const std::atomic<bool>* stop_requested = nullptr;   // set: stop at the next boundary
  const std::atomic<bool>* leave_requested = nullptr;  // set: leave at the next boundary
  int64_t stop_after_step = 0;  // behave as if stopped after this step (drills, tests)

  // ---- Output, from rank 0 ----
  bool quiet = false;       // no lines for people at all (below)
  // Where rank 0's lines for people go: the world line, progress lines, a
  // resume, a leave, a stop. One call per line, without the newline, from
  // the training thread. Unset: standard output. muster-train's progress
  // line is one such sink; a program with a terminal UI passes its own.
  std::function<void(std::string_view line)> output;
  int64_t log_every = 20;   // a progress line every N steps
  std::string log_dir;      // JSON lines (metrics.jsonl) and TensorBoard events; "" = none

  // INVALID_ARGUMENT naming the first bad field.
  absl::Status Validate() const;
};

// Where this process runs in the job, resolved as Distributed::Start will
// resolve it: Options::node_id and local_rank when set, else muster-agent's
// MUSTER_NODE_ID / MUSTER_LOCAL_RANK / MUSTER_LOCAL_WORLD_SIZE / MUSTER_SPARE,
// else OpenMPI's, torchrun's or Slurm's variables, else one process on this
// host. Use it before Start to pick this process's GPU (local_rank) or its
// share of the node's cores (local_world_size).
struct Placement {
  std::string member_id;     // "<node>/<local_rank>": the stable id in the job
  std::string node;
  int local_rank = 0;
  int local_world_size = 1;  // trainers on this node, as the launcher says
  bool spare = false;        // started as a hot spare (muster-agent --spares)
  std::string source;        // "flags", "muster-agent", "openmpi", "torchrun", "slurm", "local"
};

// Reads only the environment and the host name; thread-safe. Errors:
// INVALID_ARGUMENT naming a launcher variable that is set but not a number.
absl::StatusOr<Placement> ResolvePlacement(const Options& options);

}  // namespace muster

#endif  // MUSTER_OPTIONS_H_
