// libmuster: elastic, checkpointed data-parallel training for your own
// LibTorch model, coordinated by a muster job.
//
// You register what your training holds (model, optimizer, extra tensors and
// bytes); muster joins the job, shards your data, averages gradients, and
// keeps all of that state identical on every rank through failures, joins,
// drains, restarts and checkpoints:
//
//   muster::Options options;
//   options.dataset_size = data.size();
//   options.batch_per_rank = 64;
//   options.epochs = 3;
//   options.checkpoint_dir = "ckpt";  options.checkpoint_every = 100;
//   muster::State state;
//   state.model = model.ptr().get();
//   state.optimizer = &optimizer;
//   auto job = muster::Distributed::Start(options, state);
//   if (!job.ok()) return 1;
//   muster::Distributed& d = **job;
//   while (!d.ShouldStop()) {
//     torch::Tensor loss = LossOn(d.Batch());   // this rank's example indices
//     optimizer.zero_grad();
//     d.BeforeBackward();
//     loss.backward();
//     if (!d.AfterBackward().ok()) continue;    // a peer failed, the step could not be salvaged
//     optimizer.step();
//   }
//   return muster::Distributed::ExitCode(d.Finish());
//
// What happens inside, so that the loop stays this short:
//   * Start() joins, resumes from the newest committed checkpoint that
//     verifies (or from a live peer that is further ahead), forms the world,
//     connects the communicator and makes every rank's state identical.
//   * AfterBackward() all-reduces the gradients (bucketed, overlapped with
//     backward). When a peer fails it aborts, regroups with the survivors
//     (new communicator, state from the member furthest ahead, verified by a
//     checksum) and salvages the step: the survivors reduce the gradients
//     they still hold in the new world, so the step is the average over
//     their shares of the global batch, and the dead ranks' examples go back
//     to the sampler to lead the next step. It returns OK: no work is lost.
//     Only when nothing can be salvaged (Options::salvage off, or no
//     survivor holds a gradient of the step) it returns ABORTED: the step is
//     dropped and its examples come again, resharded over the new world.
//   * ShouldStop() acts at the step boundary all ranks agreed on through the
//     all-reduce: a stop signal (SIGUSR1/SIGTERM to every rank, Slurm's
//     warning) checkpoints and stops; a drain or SIGTERM to one rank makes it
//     leave; a join or leave regroups; checkpoints are taken on the schedule
//     of the options; the job ends after `steps` steps or `epochs` epochs
//     of global samples, the same step on every rank.
//
// Errors follow muster's convention: UNAVAILABLE (coordinator unreachable
// past the deadlines), ABORTED (a peer failed: the step is dropped),
// FAILED_PRECONDITION (the job has no place for this member), DATA_LOSS
// (ranks disagree on the state after a transfer), INVALID_ARGUMENT (bad
// options, named).
//
// Thread-safety: a Distributed belongs to the thread that runs the training
// loop; no method may be called concurrently. Internally a session thread
// talks to the coordinator and a communication thread reduces gradients.
#ifndef MUSTER_MUSTER_H_
#define MUSTER_MUSTER_H_

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "muster/backend.h"
#include "muster/signals.h"

namespace muster {

class FileSystem;  // common/file_system.h: the seam tests use to inject faults

// Bytes of your own state (counters, RNG, a data loader's position). `save`
// is called at checkpoints and state transfers; `load` receives what a save
// on the source rank returned and reports a bad value as an error.
struct Blob {
  std::string name;
  std::function<std::string()> save;
  std::function<absl::Status(const std::string&)> load;
};

// Everything muster moves to joiners, writes in checkpoints and restores on
// start. Pointers must outlive the Distributed.
struct State {
  torch::nn::Module* model = nullptr;  // required: parameters and buffers
  // Optional: its per-parameter state (SGD momentum, Adam and AdamW moments
  // and step counts) travels with the model. Other optimizers: register their
  // state as tensors or blobs.
  torch::optim::Optimizer* optimizer = nullptr;
  // Extra tensors (an EMA copy, running statistics), restored in place.
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  std::vector<Blob> blobs;
};

// Where the job stands; the same on every rank between steps.
struct Progress {
  int64_t step = 0;           // committed steps so far
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

  // ---- Communication ----
  Backend backend = Backend::kAuto;
  std::string address;       // the address other nodes reach this one at (default: host name)
  std::string job;           // names shared memory; default $MUSTER_JOB, $SLURM_JOB_ID or "muster"
  bool cuda = false;         // tensors and collectives on this process's GPU
  double bucket_mb = 25;     // gradient bucket size
  bool overlap = true;       // reduce buckets during backward
  double collective_timeout_s = 120;
  // A peer that fails during a step's all-reduce: the survivors reduce the
  // gradients they hold in the regrouped world and take the step (the dead
  // ranks' examples come again); false drops the step.
  bool salvage = true;

  // ---- Data: a distributed sampler over indices [0, dataset_size) ----
  int64_t dataset_size = 0;  // required
  int batch_per_rank = 0;    // required
  uint64_t seed = 1;         // per-epoch permutation seed
  int64_t steps = 0;         // > 0: stop after this many steps
  int64_t epochs = 1;        // with steps == 0: stop after epochs * dataset_size samples

  // ---- Learning rate ----
  // Called before every step; its result is set on every parameter group.
  // Null: the optimizer's own rate is left alone.
  std::function<double(const Progress&)> lr_schedule;
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
  // rank at once: like SIGUSR1) handlers at Start. Off when the program has
  // its own, or when ranks run as threads.
  bool handle_signals = true;
  const std::atomic<bool>* stop_requested = nullptr;   // set: stop at the next boundary
  const std::atomic<bool>* leave_requested = nullptr;  // set: leave at the next boundary
  int64_t stop_after_step = 0;  // behave as if stopped after this step (drills, tests)

  // ---- Output, from rank 0 ----
  bool quiet = false;       // no progress lines on stdout
  int64_t log_every = 20;   // a progress line every N steps
  std::string log_dir;      // JSON lines (metrics.jsonl) and TensorBoard events; "" = none

  // INVALID_ARGUMENT naming the first bad field.
  absl::Status Validate() const;
};

class Distributed {
 public:
  enum class Outcome {
    kFinished,  // trained the configured steps or epochs
    kStopped,   // stopped by a signal after a committed checkpoint: run again to resume
    kLeft,      // left the job early (SIGTERM to this rank, drained)
  };

  // Joins the job and enters the first world with identical state on every
  // rank (see the top of this file). Errors: INVALID_ARGUMENT (options,
  // state), UNAVAILABLE, DEADLINE_EXCEEDED, FAILED_PRECONDITION, DATA_LOSS.
  static absl::StatusOr<std::unique_ptr<Distributed>> Start(const Options& options, State state);
  virtual ~Distributed() = default;

  // At the top of every step. Acts at the step boundary (checkpoint, stop,
  // leave, regroup, publish to the state service), then returns true when
  // the loop should end (see Finish for why), or false after preparing the
  // next step: its batch and learning rate.
  virtual bool ShouldStop() = 0;
  // This rank's example indices for the step ShouldStop prepared.
  virtual const std::vector<int64_t>& Batch() const = 0;

  // Before loss.backward(). `sync` false accumulates gradients locally (like
  // DDP's no_sync); the next synchronised backward reduces the sum.
  virtual void BeforeBackward(bool sync = true) = 0;
  // After the step's last loss.backward(), before optimizer.step(): every
  // gradient is the average over the world, and the step counts. When a peer
  // failed, the world has regrouped and the step was salvaged (see the top
  // of this file): the gradients are the average over the ranks whose shares
  // were reduced, and Batch() is this rank's examples if its share counted,
  // else empty. ABORTED: nothing could be salvaged; the step is dropped (do
  // not call optimizer.step()). Other errors end the run (ShouldStop is true).
  virtual absl::Status AfterBackward() = 0;

  // Sums `values` over the world (evaluation, metrics). ABORTED: a peer
  // failed and the world regrouped; try again.
  virtual absl::StatusOr<std::vector<double>> AllReduceSum(std::vector<double> values) = 0;

  // The training loss of the last step, for the progress line and logs.
  virtual void RecordLoss(double loss) = 0;
  // Scalars for rank 0's JSON lines and TensorBoard at the current step.
  virtual void LogScalars(const std::map<std::string, double>& values) = 0;

  // How the loop ended, or the error that ended it. Waits for checkpoint
  // writes; a finished run leaves the job as finished.
  virtual absl::StatusOr<Outcome> Finish() = 0;
  // 0 finished or left, 75 stopped (sysexits EX_TEMPFAIL: resume later), 1 error.
  static int ExitCode(const absl::StatusOr<Outcome>& outcome);

  virtual Progress progress() const = 0;
  int rank() const { return progress().rank; }
  int world_size() const { return progress().world_size; }
  int64_t step() const { return progress().step; }
  int64_t epoch() const { return progress().epoch; }
  // True when training is over (not stopped, not left): evaluate now.
  virtual bool finished() const = 0;
  virtual int regroups() const = 0;                 // worlds entered after the first
  virtual int steps_salvaged() const = 0;           // failed steps taken in the regrouped world
  virtual int steps_dropped() const = 0;            // failed steps dropped (AfterBackward ABORTED)
  virtual int checkpoints_committed() const = 0;    // by this rank's reports
  virtual int64_t resumed_from_step() const = 0;    // -1: started fresh
  virtual double comm_overlap_pct() const = 0;      // all-reduce time hidden behind backward
  // XXH3-64 of the whole registered state (model, optimizer, extra tensors,
  // blobs) and the step and sample counters: equal on two ranks exactly
  // when they hold bit-identical state (what the library checks after every
  // state transfer). Between steps.
  virtual uint64_t StateDigest() const = 0;
};

}  // namespace muster

#endif  // MUSTER_MUSTER_H_
