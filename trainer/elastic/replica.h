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
// With sharded optimizer state (ReplicaOptions::shard_copies), it keeps
// the state sharded through steps (sharded_optimizers.h). Entering a world
// (EnterWorld) moves it straight to the new world's shards where every
// rank is in the same failed step or none is (a join, a death mid-step
// with no joiner): the state transfer then leaves the optimizers out, and
// a salvaged step steps the shards. Otherwise it is whole on every rank
// until the next step begins (Reshard), so that the state transfer, a
// salvaged step and its catch-up move and step the whole state as an
// unsharded run does. It is made whole again (WholeState) for whatever
// reads it whole at a boundary (a checkpoint, the end of training); the
// periodic state check compares it sharded.
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
#include "trainer/elastic/optimizer_shards.h"
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

class ShardedOptimizers;  // sharded_optimizers.h

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
  // reduce, or such a change while the optimizer state is sharded. With
  // ReplicaOptions::reduce_scatter, while the state is sharded, the pass of
  // exactly the parameters the shards train gets the reduce-scattering sync
  // of the shards (made anew with them); call it after Reshard.
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

  // With shard_copies: whether the optimizers can be sharded
  // (INVALID_ARGUMENT naming what cannot, before any world).
  absl::Status CheckSharding() const;
  // Sharded optimizer state (OK at once without): collective at each step
  // boundary, first: the parameters from the owners of each range.
  absl::Status GatherParameters(Communicator* comm, absl::Time deadline);
  // Sharded optimizer state (nothing without): collective as a step's next
  // pass begins, before its forward: the parameters the earlier passes'
  // optimizers stepped (ShardedOptimizers::BetweenPasses). A failure is
  // the pass's: FinishPass returns it.
  void GatherBetweenPasses(Communicator* comm, absl::Time deadline);
  // Collective: the whole state on every rank of `comm` (until Reshard).
  absl::Status WholeState(Communicator* comm, absl::Time deadline);
  // Collective: whether every rank holds the same state (CheckRanksAgree
  // with `counters`). Sharded optimizer state stays sharded: the model,
  // extras and counters are compared over the world, and each shard where
  // it is kept (OptimizerShards::CheckCopiesAgree).
  absl::Status CheckStateAgrees(const std::vector<int64_t>& counters, Communicator* comm,
                                absl::Time deadline) const;
  // Whether the optimizer state is sharded now (between a step's first
  // backward and whatever makes it whole).
  bool ShardedNow() const;
  // The state of the shard this rank owns, for its checkpoint file.
  // FAILED_PRECONDITION when the state is not sharded.
  absl::StatusOr<OwnShardState> OwnShard() const;
  // As a step begins: the state sharded for `comm`'s world, unless it is.
  // Errors: OptimizerShards::Make's INVALID_ARGUMENT.
  absl::Status Reshard(Communicator* comm);
  // The shards dropped, the optimizers' parameter lists as before (the
  // state is then restored from a checkpoint).
  void ReleaseShards();
  // Whether the optimizer state is to be sharded (Options::
  // shard_optimizer_state), sharded now or not.
  bool Sharding() const { return sharded_ != nullptr; }
  // With Sharding(): the optimizer state of a restored checkpoint, in its
  // shard `files` (of step `step`), is read at the first world's entry,
  // each rank its own ranges where that world shards
  // (ShardedOptimizers::LoadAtGather), else whole.
  void LoadShardsAtEntry(int64_t step, std::vector<ShardFileRef> files, FileSystem* fs);
  // Whether the shards can go into the next world as they are, `leaving`
  // ranks leaving it: where none leaves, or one does and each of its ranges
  // has a second holder. A rank missing from that world for another reason
  // (a death) loses what a death loses (with one copy: its ranges, read
  // again from the checkpoint).
  bool ShardsGoAlong(int leaving) const {
    return ShardedNow() && (leaving == 0 || (leaving == 1 && options_.shard_copies >= 2));
  }
  // Where the shards do not go along, `leaving` ranks leaving: whether they
  // can be handed over to the ranks that stay, which then shard
  // (ShardedOptimizers::CanHandOver), so that the state is never whole.
  bool CanHandOverShards(int leaving) const;
  // Collective over `comm`, the world the shards are of, at the boundary
  // before `leaves` (this rank among the leavers, or not) take effect:
  // ShardedOptimizers::HandOver.
  absl::Status HandOverShards(Communicator* comm, bool leaves, absl::Time deadline);
  // The elements of per-element optimizer state this rank held at its last
  // step boundary (its shards'), or holds now (unsharded); -1: an optimizer
  // muster has no codec for.
  int64_t optimizer_state_elements() const;
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
  // SyncFor's sync while the state is sharded, for a pass over `params`, or
  // null: without shards, or where `params` are not the very parameters the
  // shards train (a GAN's pass). It reduce-scatters with reduce_scatter
  // where the layout allows, else all-reduces in buckets that are the
  // shards' gradient vectors (GiveGradientVectors).
  GradientSync* ShardSyncFor(const std::vector<torch::Tensor>& params);
  // ShardSyncFor, where it gives a sync, with the syncs it stands in for
  // made to drop their buffers meanwhile.
  GradientSync* StandInShardSync(const std::vector<torch::Tensor>& params);
  // `plan`'s buffers (over `params` parameters): views of one gradient
  // vector per group of `shards`, in the group's flat order, which the
  // sharded optimizers' ShareGradients then use as they are. The
  // gradients then cost the buckets' memory once, as unsharded they cost
  // the buckets' and the .grad's.
  void GiveGradientVectors(const OptimizerShards& shards, size_t params,
                           std::vector<GradientSync::BucketPlan>* plan);
  // The options of every gradient sync a pass gets.
  GradientSyncOptions SyncOptions() const;
  // After a pass's reduction: the loss scale taken out of its averaged
  // gradients (ReplicaOptions::inverse_loss_scale), then
  // ReplicaOptions::clip_norm over them: the parameters' .grad, or with
  // `scattered` the sharded optimizers' parts (their squared norms summed
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
  // The sync of a pass over every parameter the shards train
  // (ShardSyncFor), made for the shards of ShardedOptimizers::
  // times_sharded() `of`, and its buckets.
  struct ShardSync {
    uint64_t of = 0;
    std::vector<ShardedBucket> plan;
    std::unique_ptr<GradientSync> sync;
  };
  ShardSync shard_;
  GradientSync* current_ = nullptr;
  Communicator* comm_ = nullptr;
  // What every SyncBatchNorm of the modules sums over (set at
  // construction; local once Close ran).
  std::shared_ptr<WorldStatistics> statistics_;
  bool pass_summed_statistics_ = false;
  std::unique_ptr<BufferSync> buffers_;  // null without broadcast_buffers
  std::unique_ptr<ShardedOptimizers> sharded_;  // null without shard_copies
  int64_t held_elements_ = -1;  // the shards' state at the last boundary
  absl::Status pass_failure_;   // GatherBetweenPasses', until FinishPass
  double comm_total_ = 0, hidden_total_ = 0;
  MemoryAccount memory_;           // AccountMemory's last
  int passes_in_world_ = 0;        // AccountMemory's since UseCommunicator
  absl::Duration last_reduce_;
  double last_gradient_norm_ = std::numeric_limits<double>::quiet_NaN();
};

}  // namespace muster

#endif  // MUSTER_TRAINER_ELASTIC_REPLICA_H_
