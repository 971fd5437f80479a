// OptimizerState: how a replica keeps its optimizers' state through steps
// and worlds, whole on every rank (WholeOptimizerState) or sharded
// (ShardedOptimizerState, Options::shard_optimizer_state). The replica and
// the engine ask it at each point of a step and of a world change: which
// sync reduces a pass, what a reduction leaves where, what moves as a world
// is entered, what goes along to the next world, what a checkpoint writes.
// They do not branch on the way it is kept; the whole state's answers are
// "nothing to do" and "everything, as the state transfer moves it".
//
//   as a step's first backward begins:             ForStep
//   a pass's sync (before its backward):           PassSync
//   after a pass's reduction:                      Reduced
//   as a later pass of the same step begins:       BetweenPasses
//   at each step boundary, first:                  AtBoundary
//   a path that reads the whole state:             MakeWhole
//   a new world, first, before the state transfer: Enter, then the
//                                                  transfer of Transferred()
//
// Not thread-safe: the training thread's.
#ifndef MUSTER_TRAINER_ELASTIC_OPTIMIZER_STATE_H_
#define MUSTER_TRAINER_ELASTIC_OPTIMIZER_STATE_H_

#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/file_system.h"
#include "trainer/checkpoint/optimizer_shard_files.h"
#include "trainer/checkpoint/training_state.h"
#include "trainer/comm/world_info.h"
#include "trainer/ddp/gradient_sync.h"
#include "trainer/elastic/optimizer_shards.h"
#include "trainer/elastic/world_changes.h"

namespace muster {

struct OptimizerStateOptions {
  // The copies of each shard (1 or 2); 0: the state is kept whole.
  int copies = 0;
  // ReplicaOptions::reduce_scatter.
  bool reduce_scatter = false;
  // The options of the syncs it makes (PassSync).
  GradientSyncOptions sync;
};

// The optimizers of `state`, in order.
std::vector<torch::optim::Optimizer*> OptimizersOf(const TrainingState& state);

class OptimizerState {
 public:
  // `state`'s optimizers and parameters are the program's, not owned.
  static std::unique_ptr<OptimizerState> Make(const TrainingState& state,
                                              OptimizerStateOptions options);
  virtual ~OptimizerState() = default;

  // Whether it is kept sharded (the mode), and whether it is sharded now:
  // between a step's first backward and whatever makes it whole.
  virtual bool sharding() const = 0;
  virtual bool sharded() const = 0;
  // Whether the optimizers can be kept this way (INVALID_ARGUMENT naming
  // what cannot, before any world).
  virtual absl::Status Check() const = 0;

  // A step. ForStep: as its first backward begins, kept for `comm`'s
  // world. BetweenPasses: collective as a later pass begins (the
  // parameters the earlier passes' optimizers stepped). AtBoundary:
  // collective at the boundary, first (the parameters from the ranks that
  // stepped them). MakeWhole: collective, the whole state on every rank
  // (until ForStep).
  virtual absl::Status ForStep(Communicator* comm) = 0;
  virtual absl::Status BetweenPasses(Communicator* comm, absl::Time deadline) = 0;
  virtual absl::Status AtBoundary(Communicator* comm, absl::Time deadline) = 0;
  virtual absl::Status MakeWhole(Communicator* comm, absl::Time deadline) = 0;

  // A pass. PassSync: the sync of its own that a pass over `params` uses,
  // or null (the replica's sync of those parameters); sync(): the one it
  // holds, or null. AllowsTrainedChange: OK, or why the parameters that
  // require grad must not change (`change` says how they did).
  // ResyncSync: the sync a salvage's re-reduction of such a pass goes
  // through, every rank alike, or null (the pass's own).
  virtual GradientSync* PassSync(const std::vector<torch::Tensor>& params) = 0;
  virtual GradientSync* ResyncSync(const std::vector<torch::Tensor>& params) = 0;
  virtual GradientSync* sync() const = 0;
  virtual absl::Status AllowsTrainedChange(const std::string& change) const = 0;
  // After a reduction by `by` (null: a salvage's re-reduction): the
  // averaged gradients go where the optimizers step them. True where each
  // rank got only its own parts (reduce-scattered): KeptGradientSquares
  // and ScaleKeptGradients then stand for the .grad's norm and scaling.
  virtual bool Reduced(const GradientSync* by) = 0;
  virtual double KeptGradientSquares() const = 0;
  virtual void ScaleKeptGradients(double factor) = 0;

  // A world. UseCommunicator: its syncs reduce over `comm`. Enter: every
  // rank of a new world, first, before the state transfer
  // (WorldChanges::Tensors::EnterWorld). Transferred: what the state
  // transfer moves after it (the training state, or all of it but what
  // Enter moved); StateTransferred after it. CatchUp: after a salvaged
  // step that some ranks were outside of (WorldChanges::Tensors::
  // CatchUpShards).
  virtual void UseCommunicator(Communicator* comm) = 0;
  virtual absl::Status Enter(Communicator* comm, const WorldInfo& world, int64_t step,
                             const std::optional<FailedStepMark>& failed, absl::Time deadline) = 0;
  virtual TrainingState Transferred() const = 0;
  virtual void StateTransferred() = 0;
  virtual absl::Status CatchUp(Communicator* comm, bool stepped, absl::Time deadline) = 0;
  // At a boundary after which the world changes, `leaving` ranks leaving
  // it: whether the state goes into the next world as it is held
  // (GoesAlong), or can be handed over to the ranks that stay first
  // (CanHandOver, HandOver: collective over `comm`, the world it is held
  // in, `leaves` this rank among the leavers). Otherwise it is made whole
  // first (MakeWhole).
  virtual bool GoesAlong(int leaving) const = 0;
  virtual bool CanHandOver(int leaving) const = 0;
  virtual absl::Status HandOver(Communicator* comm, bool leaves, absl::Time deadline) = 0;
  // What it holds dropped, the optimizers' parameter lists as before (the
  // state is then restored from a checkpoint, or the run ends). Close:
  // its syncs end too (their threads stop); nothing reduces after.
  virtual void Release() = 0;
  virtual void Close() = 0;

  // Checkpoints. LoadAtEntry: a restored checkpoint's optimizer state in
  // its shard `files` (of `step`), read as the first world is entered.
  // OwnShard: the part this rank owns, for its file (FAILED_PRECONDITION
  // unless sharded()). CheckAgrees: collective, whether every rank holds
  // the same state and `counters` (the kept parts compared where kept).
  virtual void LoadAtEntry(int64_t step, std::vector<ShardFileRef> files, FileSystem* fs) = 0;
  virtual absl::StatusOr<OwnShardState> OwnShard() const = 0;
  virtual absl::Status CheckAgrees(const std::vector<int64_t>& counters, Communicator* comm,
                                   absl::Time deadline) const = 0;

  // The elements of per-element state this rank held at its last boundary
  // (sharded), or holds now; -1: an optimizer muster has no codec for.
  virtual int64_t StateElements() const = 0;
};

}  // namespace muster

#endif  // MUSTER_TRAINER_ELASTIC_OPTIMIZER_STATE_H_
