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
//   if (!job.ok()) return muster::Distributed::ExitCode(job.status());
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
// Several models and optimizers (a GAN): register them as State::modules
// and State::optimizers, and give each backward pass of a step its own
// BeforeBackwardFor({"discriminator"}) ... AfterBackward() (State below;
// docs/library.md, "Several models"; examples/gan.cc).
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
// (ranks disagree on the state: after a transfer, or at a state check
// before a checkpoint, which is then never written), INVALID_ARGUMENT (bad
// options, named).
//
// One case ends the process instead of returning an error: a communicator
// build that hangs (Gloo's connect can block past its own timeout when a
// peer vanishes in the middle of it, and no call can wake it). After the
// build's deadline, or 10 s after a newer world is known, the library logs
// why and exits with 70 (sysexits EX_SOFTWARE), crash-only: under
// muster-agent the trainer is restarted and takes a live peer's state, where
// a stuck process would hold up its whole world. Run under muster-agent (or
// a launcher that restarts) when a peer may vanish.
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
#include "muster/amp.h"
#include "muster/backend.h"
#include "muster/blob.h"
#include "muster/memory_account.h"
#include "muster/optimizer_codec.h"
#include "muster/options.h"
#include "muster/signals.h"
#include "muster/step_timeline.h"

namespace muster {

// Everything muster moves to joiners, writes in checkpoints and restores on
// start. Pointers must outlive the Distributed.
struct State {
  // The model: parameters and buffers. Required unless `modules` names
  // the models.
  torch::nn::Module* model = nullptr;
  // Optional: its per-parameter state travels with the model, parameter
  // groups of any number and options included. muster knows LibTorch's
  // SGD, Adam, AdamW, RMSprop, Adagrad and LBFGS (muster/optimizer_codec.h);
  // for another optimizer, give its codec as optimizer_codec.
  torch::optim::Optimizer* optimizer = nullptr;
  std::shared_ptr<const OptimizerCodec> optimizer_codec;

  // Several models and optimizers (a GAN's generator and discriminator, an
  // actor and a critic, a frozen teacher beside its student), each named
  // (letters, digits, '_' and '-', unique). They travel, checkpoint and
  // resume as `model` and `optimizer` do; a module none of whose parameters
  // requires grad is carried as state and never reduced. Each step may then
  // hold several synchronised backward passes, each reducing the modules
  // that BeforeBackwardFor names (docs/library.md, "Several models").
  struct NamedModule {
    std::string name;
    torch::nn::Module* module = nullptr;
  };
  struct NamedOptimizer {
    NamedOptimizer(std::string name, torch::optim::Optimizer* optimizer,
                   std::shared_ptr<const OptimizerCodec> codec = nullptr)
        : name(std::move(name)), optimizer(optimizer), codec(std::move(codec)) {}
    std::string name;
    torch::optim::Optimizer* optimizer = nullptr;
    std::shared_ptr<const OptimizerCodec> codec;  // null: LibTorch's own (as above)
  };
  std::vector<NamedModule> modules;
  std::vector<NamedOptimizer> optimizers;
  // Extra tensors (an EMA copy, running statistics), restored in place.
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  std::vector<Blob> blobs;
  // Optional: the program's loss scaler (mixed precision, muster/amp.h).
  // AfterBackward unscales each pass's averaged gradients and gives it the
  // world's verdict on inf and NaN, so every rank skips the same steps; its
  // state travels and checkpoints as the blob "grad_scaler".
  GradScaler* grad_scaler = nullptr;
};

// The device this process trains on: with options.cuda, GPU
// (local rank modulo the GPUs this process sees: a task bound to one GPU
// sees it as device 0); else the CPU. Put the model there before Start.
// Errors: FAILED_PRECONDITION for cuda without a usable GPU, and
// ResolvePlacement's.
absl::StatusOr<torch::Device> TrainingDevice(const Options& options);

class Distributed {
 public:
  enum class Outcome {
    kFinished,  // trained the configured steps or epochs, or RequestFinish
    // Stopped (a stop signal or RequestStop) with a committed checkpoint of
    // the step it stopped at: run again to resume from exactly there.
    kStopped,
    kLeft,  // left the job early (SIGTERM to this rank, drained)
    // Stopped, but no checkpoint of that step committed: no checkpoint_dir,
    // or the checkpoint failed twice (a full or read-only file system, the
    // coordinator unreachable), or the job was paused. A restart resumes
    // from the newest committed checkpoint, repeating the steps after it;
    // the log says, at ERROR, which step that is.
    kStoppedWithoutCheckpoint,
  };
  // Process exit codes (ExitCode). 0: finished or left.
  static constexpr int kExitStopped = 75;                   // sysexits EX_TEMPFAIL: resume later
  static constexpr int kExitStoppedWithoutCheckpoint = 74;  // sysexits EX_IOERR: steps repeat
  static constexpr int kExitConfig = 78;  // sysexits EX_CONFIG: bad options or state (INVALID_ARGUMENT)
  // sysexits EX_DATAERR: the ranks' state disagreed (DATA_LOSS); nothing of
  // it was committed. A restart would resume from the newest committed
  // checkpoint and, with the same program, disagree again.
  static constexpr int kExitDataLoss = 65;
  static constexpr int kExitError = 1;    // any other error

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
  // This rank's example indices for the step `ahead` (>= 1) steps after
  // it, as they stand if the world does not change and no peer fails
  // (empty when that step is past the end, or outside ShouldStop ... the
  // step's AfterBackward): what a loader may fetch ahead
  // (muster::DataLoader). Batch() of that step is what counts.
  virtual std::vector<int64_t> UpcomingBatch(int ahead) = 0;

  // Before the pass's first loss.backward(). The pass may call backward any
  // number of times (real and fake losses, one per task): AfterBackward
  // reduces their sum. `sync` false accumulates gradients locally (like
  // DDP's no_sync) and needs no AfterBackward of its own; the step's last
  // pass, with `sync` true, reduces the whole sum (AfterBackward right after
  // a no-sync BeforeBackward ends the run with FAILED_PRECONDITION).
  virtual void BeforeBackward(bool sync = true) = 0;
  // The same for a backward pass that reduces only the named State::modules
  // (a GAN's discriminator pass, then its generator pass). With
  // State::modules or several optimizers, a step may hold several passes
  // (BeforeBackward or BeforeBackwardFor), each closed by its
  // own AfterBackward and followed by its optimizer's step; the step ends at
  // the next ShouldStop. A name that is not a module, or a module with no
  // parameter that requires grad, ends the run with INVALID_ARGUMENT (from
  // AfterBackward). When a peer fails in a pass, the survivors salvage that
  // pass when every rank of the new world holds its gradient; otherwise the
  // pass is dropped (ABORTED) and the step begins again at ShouldStop, with
  // the passes before kept: its examples come again.
  virtual void BeforeBackwardFor(const std::vector<std::string>& modules, bool sync = true) = 0;
  // After the pass's last loss.backward(), before optimizer.step(): every
  // gradient is the average over the world of each rank's whole local sum
  // for the pass (every backward call of it), and the step counts. When a peer
  // failed, the world has regrouped and the step was salvaged (see the top
  // of this file): the gradients are the average over the ranks whose shares
  // were reduced, and Batch() is this rank's examples if its share counted,
  // else empty. ABORTED: nothing could be salvaged; the step is dropped (do
  // not call optimizer.step()). Other errors end the run (ShouldStop is true).
  virtual absl::Status AfterBackward() = 0;

  // Sums `values` over the world (evaluation, metrics), between steps.
  // ABORTED: a peer failed and the world regrouped, and its members are not
  // all in this evaluation (a replacement begins in the loop): skip the
  // evaluation; every later call until the next ShouldStop is
  // FAILED_PRECONDITION, with no collective.
  virtual absl::StatusOr<std::vector<double>> AllReduceSum(std::vector<double> values) = 0;

  // The learning rate of each parameter group for the step ShouldStop
  // prepared, as set by the schedule (Options::lr_schedule,
  // group_lr_schedule) or the optimizer's own; with no optimizer, the
  // schedule's rate (empty without one).
  virtual std::vector<double> learning_rates() const = 0;

  // The training loss of the last step, for the progress line and logs.
  virtual void RecordLoss(double loss) = 0;
  // Scalars for rank 0's JSON lines and TensorBoard at the current step.
  virtual void LogScalars(const std::map<std::string, double>& values) = 0;

  // How the loop ended, or the error that ended it. Waits for checkpoint
  // writes; a finished run leaves the job as finished.
  virtual absl::StatusOr<Outcome> Finish() = 0;
  // 0 finished or left; kExitStopped (75), kExitStoppedWithoutCheckpoint
  // (74); kExitConfig (78) for INVALID_ARGUMENT and for UNAUTHENTICATED
  // (a job token the coordinator refuses); kExitDataLoss (65) for
  // DATA_LOSS (the ranks disagree); kExitError (1) for other
  // errors. muster-agent restarts a trainer only after kExitError, 70 or a
  // signal (docs/library.md, "Exit codes"). Also for Start's error
  // (ExitCode(job.status())): a refusal of the options or the state is 78,
  // which no restart repeats; an unreachable coordinator is 1.
  static int ExitCode(const absl::StatusOr<Outcome>& outcome);

  // Ask every rank to checkpoint and stop (as SIGUSR1 does), or this rank to
  // leave (as SIGTERM to one rank does), at a step boundary: the ranks learn
  // of a request from the control words AfterBackward exchanges, so one made
  // before a step's first BeforeBackward acts at that step's boundary, and one made
  // between steps (after optimizer.step()) at the next step's. For a
  // program that owns its signals (Options::handle_signals false).
  // Async-signal-safe (they set flags); any thread.
  virtual void RequestStop() = 0;
  virtual void RequestLeave() = 0;
  // Ask the job to end as finished (early stopping: the program's own
  // criterion, such as a held-out loss that stopped improving), at a step
  // boundary as for RequestStop: every rank's ShouldStop returns true after
  // the same step, finished() is true, Finish returns kFinished (exit 0),
  // and the coordinator marks the job finished, so a requeue of it trains
  // no further. One rank asking is enough (decide it from a sum, or on one
  // rank); it wins over a stop or leave asked at the same step. Nothing is
  // checkpointed for it (save what you keep, as at the last step). Async-
  // signal-safe; any thread.
  virtual void RequestFinish() = 0;
  // OK, or the error that will end the run, as soon as it happened (Finish
  // returns it too).
  virtual absl::Status status() const = 0;

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
  // The step of the state this process started with: the checkpoint it
  // restored, or a live peer's when that was further ahead (a replacement
  // in a running job); -1: started fresh.
  virtual int64_t resumed_from_step() const = 0;
  virtual bool resumed_from_live_state() const = 0;  // resumed_from_step is a live peer's
  virtual double comm_overlap_pct() const = 0;      // all-reduce time hidden behind backward
  // Where this rank's steps spend their time, phase by phase (medians;
  // muster/step_timeline.h says what each phase holds).
  virtual StepTimeline step_timeline() const = 0;
  // The elements of per-element optimizer state (Adam's two moments, SGD's
  // momentum) this rank held at its last step boundary: with
  // Options::shard_optimizer_state its parts, else the whole state; -1 for
  // an optimizer muster has no codec for.
  virtual int64_t optimizer_state_elements() const = 0;
  // With Options::clip_grad_norm: the total 2-norm of the last reduced
  // pass's averaged gradients before clipping (what
  // torch::nn::utils::clip_grad_norm_ returns), the same on every rank. NaN
  // before the first pass, or without clipping.
  virtual double last_gradient_norm() const = 0;
  // The bytes this rank held by category (muster/memory_account.h) after
  // its last AfterBackward: the step at its fullest, the averaged
  // gradients, the optimizer state and every buffer live. Zero before the
  // first.
  virtual MemoryAccount memory_account() const = 0;
  // XXH3-64 of the whole registered state (model, optimizer, extra tensors,
  // blobs) and the step and sample counters: equal on two ranks exactly
  // when they hold bit-identical state (what the library checks after every
  // state transfer, before every checkpoint and every
  // Options::check_state_every steps). Between steps: after ShouldStop
  // returned, or after the loop (buffers a forward changed are copied from
  // rank 0 in ShouldStop, so between optimizer.step() and the next
  // ShouldStop they may still differ).
  virtual uint64_t StateDigest() const = 0;
};

}  // namespace muster

#endif  // MUSTER_MUSTER_H_
