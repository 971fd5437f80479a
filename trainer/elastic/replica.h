// Replica: this rank's copy of the model and what a step or a change of
// world does to it. It holds the training state (the modules and
// optimizers, checkpoint/training_state.h), the gradient syncs of its
// passes (one per set of modules a pass reduces, made on first use:
// ddp/gradient_sync.h), and the sync of the buffers a forward changes
// (ddp/buffer_sync.h, with Options::broadcast_buffers). As
// WorldChanges::Tensors it carries out a world change's moves on the
// tensors: the state transfer (state_sync.h), the failed step's gradients
// reduced again, the move to a new communicator.
//
// How the optimizers' state is kept, whole or sharded
// (ReplicaOptions::shard_copies), is its OptimizerState's
// (optimizer_state.h): the replica asks it which sync reduces a pass, where
// a reduction's gradients go, what entering a world moves and what the
// state transfer then moves, and does not branch on which it is. The
// engine asks it the same at a step boundary (optimizer_state()).
//
// Not thread-safe: the training thread's.
#ifndef MUSTER_TRAINER_ELASTIC_REPLICA_H_
#define MUSTER_TRAINER_ELASTIC_REPLICA_H_

#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "trainer/checkpoint/training_state.h"
#include "trainer/ddp/buffer_sync.h"
#include "trainer/ddp/gradient_sync.h"
#include "trainer/ddp/world_statistics.h"
#include "trainer/elastic/memory_account.h"
#include "trainer/elastic/optimizer_state.h"
#include "trainer/elastic/state_server.h"
#include "trainer/elastic/world_changes.h"

namespace muster {

struct ReplicaOptions {
  size_t bucket_bytes = 25u << 20;
  bool overlap = true;  // GradientSyncOptions::overlap
  // Sync the buffers a forward changed at each step boundary (BufferSync).
  bool broadcast_buffers = false;
  // The syncs' deadlines and timings; required, not owned.
  Clock* clock = nullptr;
  // Options::shard_optimizer_state: the copies of each shard of the
  // optimizer state (1 or 2); 0: every rank keeps the whole state.
  int shard_copies = 0;
  // Options::reduce_scatter_gradients: while the state is sharded, a pass
  // that reduces every parameter the sharded optimizers train
  // reduce-scatters its gradients (each rank gets the average of what it
  // owns) instead of all-reducing them. With shard_copies 1 only.
  bool reduce_scatter = false;
  // Options::clip_grad_norm: > 0 clips each pass's averaged gradients
  // (FinishPass, ResyncGradients) to this total 2-norm.
  double clip_norm = 0;
  // A loss scaler (State::grad_scaler), set together or not at all: each
  // pass's averaged gradients are multiplied by inverse_loss_scale() (its
  // 1/scale) before clipping, and unscaled(found) hears whether the world
  // found inf or NaN among them: the same verdict on every rank.
  std::function<float()> inverse_loss_scale;
  std::function<void(bool found)> unscaled;
};

class Replica : public WorldChanges::Tensors {
 public:
  Replica(TrainingState state, ReplicaOptions options);
  ~Replica() override;
  Replica(const Replica&) = delete;
  Replica& operator=(const Replica&) = delete;

  const TrainingState& state() const { return state_; }
  // Named modules or several optimizers: a step may hold several passes.
  bool several_passes() const { return several_passes_; }
  // The gradient syncs end (their threads stop); nothing reduces after.
  void Close();

  // The gradient sync of the named modules' parameters that require grad
  // now (all modules: none named), made on first use, and made anew when
  // they are others than its own (a program that freezes or unfreezes
  // layers between passes; the old one and its hooks go). Between passes.
  // INVALID_ARGUMENT for a name that is no module, modules with nothing to
  // reduce, or such a change where the optimizer state forbids it
  // (OptimizerState::AllowsTrainedChange). A pass for which the optimizer
  // state has a sync of its own gets that one (OptimizerState::PassSync);
  // call it after OptimizerState::ForStep.
  absl::StatusOr<GradientSync*> SyncFor(const std::vector<std::string>& modules);
  // A pass begins with `sync`, reducing (`reduce`) or accumulating, its
  // all-reduce carrying `control`, its buckets' deadline `timeout` after
  // it begins.
  void BeginPass(GradientSync* sync, bool reduce, const ControlWords& control,
                 absl::Duration timeout);
  // After the pass's backward: waits for its reduction (GradientSync::Finish)
  // and counts how much of it was hidden behind backward.
  absl::Status FinishPass(absl::Time deadline, const std::function<void()>& turn);
  // Whether the last FinishPass's pass summed SyncBatchNorm statistics
  // over more than one rank (its step cannot be salvaged:
  // WorldStatistics).
  bool pass_summed_statistics() const { return pass_summed_statistics_; }
  // The control words of the last pass, averaged over the world.
  WorldChanges::ControlAverages control() const { return current_->control(); }
  // The total 2-norm of the last pass's averaged gradients before
  // ReplicaOptions::clip_norm clipped them; NaN before any, or without it.
  double last_gradient_norm() const { return last_gradient_norm_; }
  // Percent of the reductions' time hidden behind backward, since the start.
  double overlap_pct() const;
  // The time the last FinishPass's reductions took on the communication
  // thread.
  absl::Duration last_reduce_time() const { return last_reduce_; }
  // Every gradient zeroed (a step dropped).
  void DropGradients();
  // The weights after `step` to `server` (what muster pull-weights
  // fetches), as safetensors with the step and `member` in its metadata,
  // when someone asked for them (StateServer::Wanted). A failed encoding
  // is logged; training goes on.
  void PublishTo(StateServer* server, int64_t step, uint64_t generation,
                 const std::string& member) const;

  // Collective: the buffers a forward changed, from rank 0, at the step
  // boundary (BufferSync::Sync); OK when none are synced.
  absl::Status SyncBuffers(Communicator* comm, absl::Time deadline);
  // A state transfer made every rank's buffers equal.
  void SettleBuffers();

  // Collective as a step's next pass begins, before its forward:
  // OptimizerState::BetweenPasses. A failure is the pass's: FinishPass
  // returns it.
  void GatherBetweenPasses(Communicator* comm, absl::Time deadline);
  // How the optimizers' state is kept.
  OptimizerState& optimizer_state() { return *optimizer_state_; }
  const OptimizerState& optimizer_state() const { return *optimizer_state_; }
  // The elements of per-element optimizer state this rank held at its last
  // step boundary (its shards'), or holds now (unsharded); -1: an optimizer
  // muster has no codec for.
  int64_t optimizer_state_elements() const { return optimizer_state_->StateElements(); }
  // Its tensors' bytes into `account`'s parameters, gradients, optimizer
  // state and communication, through `counter` (each storage once).
  void CountMemory(StorageCounter* counter, MemoryAccount* account) const;
  // After a pass's reduction, the step at its fullest: the account of what
  // this rank holds (CountMemory, with `staging` and `transfer` bytes from
  // the checkpointer and the state server), kept for memory() and logged
  // at INFO once per world, at its second pass (the optimizer state of the
  // first is made).
  void AccountMemory(int64_t staging, int64_t transfer);
  const MemoryAccount& memory() const { return memory_; }

  // WorldChanges::Tensors.
  absl::Status EnterWorld(Communicator* comm, const WorldInfo& world, int64_t step,
                          const std::optional<FailedStepMark>& failed,
                          absl::Time deadline) override;
  absl::Status TakeState(int source, Communicator* comm, bool in_step,
                         TrainingCounters* counters, absl::Time deadline) override;
  absl::Status CatchUpShards(Communicator* comm, bool stepped, absl::Time deadline) override;
  void UseCommunicator(Communicator* comm) override;
  absl::StatusOr<WorldChanges::ControlAverages> ResyncGradients(Communicator* comm,
                                                                bool contribute,
                                                                int contributors,
                                                                const ControlWords& words,
                                                                absl::Time deadline) override;

 private:
  // `which` of the optimizer state's syncs for a pass over `params`, or
  // null. Where the state's own sync went meanwhile, current_ no longer
  // points to it; where it gives one, the syncs it stands in for drop their
  // buffers meanwhile.
  GradientSync* StandIn(GradientSync* (OptimizerState::*which)(const std::vector<torch::Tensor>&),
                        const std::vector<torch::Tensor>& params);
  // The options of every gradient sync a pass gets.
  GradientSyncOptions SyncOptions() const;
  // After a pass's reduction: the loss scale taken out of its averaged
  // gradients (ReplicaOptions::inverse_loss_scale), then
  // ReplicaOptions::clip_norm over them: the parameters' .grad, or with
  // `scattered` the parts this rank keeps (OptimizerState::Reduced) (their squared norms summed
  // over the world: a collective, which also finds an inf or NaN in any
  // part). Errors: the communicator's.
  absl::Status UnscaleAndClip(bool scattered, absl::Time deadline);
  // UnscaleAndClip where each part of the gradients is counted by its owner.
  absl::Status UnscaleAndClipScattered(absl::Time deadline);

  const TrainingState state_;
  const ReplicaOptions options_;
  const bool several_passes_;
  // One gradient sync per set of modules a pass reduces (by their names,
  // joined; "" for all), over the parameters of theirs that required grad
  // when it was made, and the one of the pass under way. A pass whose
  // modules' trainable parameters are others (the program froze or
  // unfroze some) gets a sync of its own in its place.
  std::map<std::string, std::unique_ptr<GradientSync>> syncs_;
  GradientSync* current_ = nullptr;
  Communicator* comm_ = nullptr;
  // What every SyncBatchNorm of the modules sums over (set at
  // construction; local once Close ran).
  std::shared_ptr<WorldStatistics> statistics_;
  bool pass_summed_statistics_ = false;
  std::unique_ptr<BufferSync> buffers_;  // null without broadcast_buffers
  std::unique_ptr<OptimizerState> optimizer_state_;
  absl::Status pass_failure_;   // GatherBetweenPasses', until FinishPass
  double comm_total_ = 0, hidden_total_ = 0;
  MemoryAccount memory_;           // AccountMemory's last
  int passes_in_world_ = 0;        // AccountMemory's since UseCommunicator
  absl::Duration last_reduce_;
  double last_gradient_norm_ = std::numeric_limits<double>::quiet_NaN();
};

}  // namespace muster

#endif  // MUSTER_TRAINER_ELASTIC_REPLICA_H_
