// ShardedOptimizers: a trainer's sharded optimizer state through steps and
// worlds (docs/design/sharding.md, "Through steps and worlds"): what the
// replica calls at each point, over OptimizerShards.
//
//   a new world, every rank, before the state transfer:  Gather (straight
//                                                         to the new shards
//                                                         where it can)
//   as a step's first backward begins:                    Reshard (Shard;
//                                                         not where KeepsWhole)
//   after each pass's reduction (.grad averaged):         TakeGradients
//   the user's optimizer.step() steps the kept shards
//   as the next pass of the same step begins (a GAN):     BetweenPasses
//   at each step boundary, first:                         AtBoundary
//   a path that reads the whole state (a checkpoint):     Whole
//
// Between a Gather that made the state whole and Shard, and inside
// WithWholeState, the optimizers hold the whole state of every parameter
// as an unsharded run does, so the paths that read or move it (state
// transfer, checkpoints, state checks) run unchanged. A Gather straight to
// the new shards leaves the optimizer state out of the state transfer
// (ShardedOptimizerState::Transferred).
//
// Not thread-safe: the training thread's.
#ifndef MUSTER_TRAINER_ELASTIC_SHARDED_OPTIMIZERS_H_
#define MUSTER_TRAINER_ELASTIC_SHARDED_OPTIMIZERS_H_

#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "trainer/comm/communicator.h"
#include "trainer/elastic/optimizer_shards.h"

namespace muster {

class ShardedOptimizers {
 public:
  // `optimizers`: the program's, not owned; `copies`: 1 or 2.
  ShardedOptimizers(std::vector<torch::optim::Optimizer*> optimizers, int copies);

  // Whether `optimizers` can be sharded (before any world): Make's
  // INVALID_ARGUMENT, naming what cannot.
  static absl::Status Check(const std::vector<torch::optim::Optimizer*>& optimizers);

  // Collective over the new world's `comm`, every rank, `node` this rank's
  // node index in it; `failed_step` (-1 for none) and `failed_generation`:
  // the step that failed under this rank. Where some rank holds shards of
  // the last layout, every rank is in the same failed step or none is (or,
  // where no rank holds it whole, the ranks outside it are joiners and
  // each new shard has a keeper in it: CatchUp then brings the joiners the
  // step), and this world shards (not KeepsWhole), this world's shards
  // straight from the last layout's (OptimizerShards::Redistribute: each
  // rank receives only what it keeps, a range with no living holder from
  // the whole source; sharded() after). Otherwise the whole state on every
  // rank, each range from a rank of the last layout that lives on (or the
  // whole source), received by everyone else. NOT_FOUND (every rank) when a
  // range with state has no living holder: the shards are kept as they
  // were (Release drops them; Shard then shards for this world whatever
  // the optimizers hold). RESOURCE_EXHAUSTED (every rank, nothing changed)
  // where the world would be made whole only to bring the failed step to
  // the ranks outside it (WholeOnlyToSalvage): the caller drops the step
  // and gathers again with no rank in a step, which goes straight.
  absl::Status Gather(Communicator* comm, uint64_t generation, int node, absl::Time deadline,
                      int64_t failed_step = -1, uint64_t failed_generation = 0,
                      int64_t step = -1);
  // Collective over the world the shards are of, after a salvaged step
  // that some of its ranks were outside of (`stepped` false: joiners that
  // Gather moved straight to their shards, as they were before the step):
  // each rank outside receives its shards' state as the step left it,
  // from a keeper that took the step, and every rank that took it writes
  // the stepped ranges into its parameters (OptimizerShards::
  // Redistribute over the same layout); a rank outside takes them from
  // the state transfer that follows (ParametersTransferred, before the
  // boundary's AtBoundary). OK at once when the state is
  // whole (the state transfer moves it). Errors: Redistribute's (a rank
  // outside the step then holds no shards; the others keep theirs).
  absl::Status CatchUp(Communicator* comm, bool stepped, absl::Time deadline);
  // After Gather (and the transfer): shards for `comm`'s world, unless
  // KeepsWhole for its size.
  absl::Status Shard(Communicator* comm);
  // The kept shards' gradients from the parameters' averaged .grad, shared
  // with them (OptimizerShards::ShareGradients: in-place clipping counts).
  void TakeGradients();
  // The flat gradient vector of each group (by the layout's groups, an
  // undefined tensor where none is given) that TakeGradients shares the
  // .grad through, in place of one of its own: the gradient sync's buckets
  // (ShardedOptimizerState::GiveGradientVectors), which then hold the averaged
  // gradients already. Kept through reshards (a group's flat order does
  // not depend on the world); empty: the shards make their own.
  void UseGradientVectors(std::vector<torch::Tensor> vectors) {
    gradient_vectors_ = std::move(vectors);
  }
  // For a reduce-scattering sync (Options::reduce_scatter_gradients), as
  // each bucket's reduce-scatter completes (GradientSyncOptions::take, on
  // the sync's communication thread): what of `part`, elements [offset,
  // ...) of bucket `bucket`'s gradients, belongs to the shards this rank
  // keeps (its own, and with two copies the one it backs up), averaged over
  // the world, into those shards' masters' .grad. The parameters' .grad
  // keep this rank's own sum.
  void TakeScattered(const ShardedBucket& bucket, int64_t offset, const torch::Tensor& part);
  // TakeGradients' counterpart once a reduce-scattering pass is taken.
  void ScatteredTaken() { whole_.reset(); }
  // After TakeScattered: the sum of the squares of the averaged gradients
  // of the parts this rank owns (not those it backs up), every group's; 0
  // without shards. Summed over the world, the squared norm of the pass.
  double OwnGradientSquares() const;
  // After TakeScattered: the kept shards' gradients times `factor`, so an
  // owner and its buddy scale alike.
  void ScaleKeptGradients(double factor);
  // After a state transfer wrote the parameters while the state is
  // sharded: the masters take their values (OptimizerShards::
  // TakeParameterValues).
  void ParametersTransferred() {
    if (shards_ != nullptr) shards_->TakeParameterValues();
  }
  // Collective: the parameters from the owners of each range, and the
  // parameters' .grad cleared (the optimizers no longer clear them).
  absl::Status AtBoundary(Communicator* comm, absl::Time deadline);
  // Collective, as a step's next pass begins: the parameters an earlier
  // pass's optimizer stepped, from the owners of each range
  // (OptimizerShards::GatherStepped); the .grad are left as they are. OK
  // at once when the state is whole.
  absl::Status BetweenPasses(Communicator* comm, absl::Time deadline);
  // Collective over `comm` (the world the shards are of): the whole state
  // on every rank, as after Gather; Shard makes the shards again. OK at
  // once when the state is whole.
  absl::Status Whole(Communicator* comm, absl::Time deadline);
  // Collective: `path` with the whole state on every rank of `comm` (the
  // world the shards are of), sharded again after, whatever it returns.
  absl::Status WithWholeState(Communicator* comm, const std::function<absl::Status()>& path,
                              absl::Time deadline);
  // Collective over `comm` (the world the shards are of), at a step
  // boundary after which `leaving` ranks leave, this one among them where
  // `leaves`: the shards of the ranks that stay, in place of the whole
  // state (OptimizerShards::HandOver), so that nothing goes with a leaver.
  // A leaver keeps nothing (as after Release). The next world's Gather
  // moves the shards on from that layout, which is newer than the world's
  // own and older than any later world's. Only where the ranks that stay
  // shard (CanHandOver). Errors: HandOver's, with nothing changed.
  absl::Status HandOver(Communicator* comm, bool leaves, absl::Time deadline);
  bool CanHandOver(int world, int leaving) const {
    return shards_ != nullptr && !KeepsWhole(world - leaving);
  }
  // Gather's and Whole's opposite without a collective: the optimizers get
  // their parameter lists back, the shards' state dropped (a rank leaving
  // the job, whose state nobody needs).
  void Release();

  // A checkpoint written sharded that this rank restored all but its
  // optimizer state from (Engine's resume): the shard files, of step
  // `step`, are read at the next Gather. Where no rank of that world holds
  // shards, every rank restored the same step this way, and the world
  // shards, each rank reads only the ranges it keeps
  // (OptimizerShards::Load); elsewhere `whole` loads the whole state into
  // the optimizers first (a world of at most `copies`, ranks that restored
  // different steps), or the files are dropped (a live world's state
  // comes from its holders).
  struct PendingLoad {
    int64_t step = 0;
    std::vector<ShardFileRef> files;
    FileSystem* fs = nullptr;
    NamedTensors names;  // the parameters, as the files name them
    std::function<absl::Status()> whole;
  };
  void LoadAtGather(PendingLoad load) { pending_ = std::move(load); }

  // As a step begins: shards for `comm`'s world (Shard) unless the state
  // is sharded, and the parameters' .grad cleared (a step that ran with
  // the whole state left them, and the optimizers no longer clear them).
  // Where KeepsWhole, neither: the optimizers hold the parameters and
  // clear their .grad as unsharded ones do.
  absl::Status Reshard(Communicator* comm);
  // The elements of per-element optimizer state this rank holds: its
  // shards', or the whole state's. Errors: Make's INVALID_ARGUMENT.
  absl::StatusOr<int64_t> StateElements() const;

  // Whether a world of `world` ranks keeps the whole state on every rank:
  // with `world` <= copies, each rank would keep every part, so sharding
  // would save nothing and only add the masters' copies and the gradients'
  // (a world of one, or of two with two copies). The state then stays
  // whole and the step is the unsharded one; Shard and Reshard leave it so.
  bool KeepsWhole(int world) const { return world <= copies_; }
  bool sharded() const { return shards_ != nullptr; }
  int copies() const { return copies_; }
  // How many times the state was sharded: a new value means new shards
  // (a new layout, or the same one made again).
  uint64_t times_sharded() const { return times_sharded_; }
  const OptimizerShards* shards() const { return shards_.get(); }

 private:
  // Whether Gather goes straight to this world's shards (its comment).
  bool Straight(const ShardWorld& agreed, int world) const;
  // Whether this world would be entered by the whole regather only because
  // some ranks are outside the failed step the others are in, and no rank
  // in it keeps some shard one outside keeps (one copy), or a rank holds
  // the whole state: entered with no rank in a step, it would go straight.
  bool WholeOnlyToSalvage(const ShardWorld& agreed, int world) const;
  // Where the ranks outside a failed step are joiners
  // (ShardWorld::outside_step): whether each shard of this world's layout
  // has a keeper in the step, which steps it for the joiners (CatchUp).
  bool SteppersKeepEveryShard(const ShardWorld& agreed) const;
  // Gather's part for a pending load in a world no rank holds shards of
  // (`fresh`): true where the shards were loaded (PendingLoad's comment).
  // Collective where this world shards.
  absl::StatusOr<bool> LoadPending(Communicator* comm, bool fresh, absl::Time deadline);

  std::vector<torch::optim::Optimizer*> optimizers_;
  int copies_;
  std::unique_ptr<OptimizerShards> shards_;
  // Layouts are told apart by a version: twice the generation of the world
  // they were made in, plus one for a layout handed over to the ranks that
  // stay (HandOver), newer than its world's and older than the next's.
  static uint64_t VersionOf(uint64_t generation) { return 2 * generation; }
  uint64_t generation_ = 0;       // the version of the layout shards_ is of
  std::vector<int> node_of_rank_;  // of the world Gather agreed on
  uint64_t gathered_for_ = 0;      // the version of the world Gather ran for
  uint64_t times_sharded_ = 0;
  std::vector<torch::Tensor> gradient_vectors_;  // UseGradientVectors
  // Set while this rank holds the whole state as of the layout of
  // generation whole_of_ (a regather or Whole completed on it) and has not
  // stepped since: should the world break in another rank's regather, the
  // next Gather takes from it the ranges whose holders are gone
  // (kHoldsWholeState).
  std::optional<ShardLayout> whole_;
  uint64_t whole_of_ = 0;
  std::optional<PendingLoad> pending_;  // LoadAtGather
};

}  // namespace muster

#endif  // MUSTER_TRAINER_ELASTIC_SHARDED_OPTIMIZERS_H_
