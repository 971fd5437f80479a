// OptimizerShards: the optimizers' side of sharded optimizer state
// (docs/sharding.md). Each parameter group of each optimizer becomes one
// flat vector of float32 elements (its parameters in order), split by a
// ShardLayout. For each shard this rank keeps, a flat leaf tensor, its
// master, takes the place of the group's parameters in the group's
// parameter list, and carries the optimizer state of its range; the
// parameters' own state is dropped. The program's optimizer.step() then
// updates only the masters, element for element as it would have updated
// the parameters (the optimizers muster shards compute each element from
// that element alone, and one step count per group).
//
// Where a group's parameters are contiguous, Make makes them views of one
// flat vector of the group (set_data: the same tensors, their values
// unchanged, in the vector's storage) and each master a view of its range
// in it: a master costs no memory of its own, and the step writes the
// kept ranges of the parameters themselves; the gather then writes only
// the ranges this rank does not keep. A group with a parameter that is not
// contiguous (channels-last, say: its layout is the program's to choose)
// keeps its parameters as they are, and its masters copy their ranges.
//
// Parameters that do not require grad stay in their group's list as they
// are (the optimizer skips them); a group with nothing to train is left
// alone. An optimizer that has no state yet leaves the masters without
// any, so that its first step makes it as it would have.
//
// A step, for group g:
//   FlatGradients(g) -> reduced over the world -> SetGradients(g, averaged)
//   optimizer.step()
//   GatherParameters, a round at a time (a piece of every shard):
//   WriteKept(g, kept piece) -> all-gathered -> Install(g, each piece)
//   (inside each node alone where the node's ranks keep every shard)
// Where the whole state is needed again (a change of world, a checkpoint),
// Unshard gathers it into every parameter's own state on every rank of a
// communicator, from the ranks that hold each range, and Make shards it
// anew.
//
// The optimizers must not be used without this object once it is made,
// and must outlive it. Not thread-safe: the training thread's.
#ifndef MUSTER_TRAINER_ELASTIC_OPTIMIZER_SHARDS_H_
#define MUSTER_TRAINER_ELASTIC_OPTIMIZER_SHARDS_H_

#include <torch/optim/optimizer.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "trainer/checkpoint/optimizer_shard_files.h"
#include "trainer/checkpoint/state_tensors.h"
#include "trainer/comm/communicator.h"
#include "trainer/ddp/shard_layout.h"

namespace muster {

class OptimizerCodec;  // include/muster/optimizer_codec.h
struct FlatState;      // optimizer_shards.cc

// The state of the shard a rank owns, as its checkpoint file holds it
// (trainer/checkpoint/optimizer_shard_files.h): `groups` point into `keep`.
struct OwnShardState {
  int shard = 0, world = 0;
  std::vector<ShardFileGroup> groups;
  std::vector<torch::Tensor> keep;  // contiguous, on the CPU
};

// What the ranks of a new world must agree on before sharded state moves
// (collective over the world's communicator, AgreeOnShards): the node of
// every rank, for the buddies of the new layout, and which ranks of the
// layout the shards were last laid out in live on into this world.
struct ShardWorld {
  std::vector<int> node_of_rank;  // by rank of the world
  // The newest layout any rank of the world holds shards of (its world
  // generation; 0: none), and by its ranks whether each is in this world.
  uint64_t generation = 0;
  std::vector<bool> alive;
  // By rank of the world: its rank in that layout, or -1 (a joiner, a rank
  // whose shards are of an older layout and count for nothing, or a rank
  // that holds the whole state).
  std::vector<int> layout_rank;
  // The first rank of the world that holds the whole state of that layout
  // (kHoldsWholeState), or -1: it sends the ranges no holder lives to send.
  int whole_source = -1;
  // Whether every rank of the world is in the same failed step (its number
  // and generation), or none is: no rank takes a step or state another
  // does not, so the state can move straight into the new world's shards.
  bool one_step = true;
  // Where not one_step: by rank, whether it is outside the failed step
  // that every other rank is in, holding no state of any layout (a joiner
  // meeting the survivors of that step, as a hot spare taking a dead
  // rank's place), or holding state as of the step before it (a survivor
  // whose previous step's boundary broke while the others were in the
  // failed step). Empty where the ranks are in different steps, or a rank
  // outside the step holds state of another step.
  std::vector<bool> outside_step;
};

// AgreeOnShards' `rank` for a rank that holds the whole state as of the
// layout `generation` of `world` ranks: its regather (or Whole) completed
// while another rank's failed and the world broke, so that it holds no
// shards, but every range.
constexpr int kHoldsWholeState = -2;

// This rank's part: its node's index in the world, and the layout its
// shards are of (`generation` 0 and `rank` -1 when it holds none; `world`
// that layout's size; `rank` kHoldsWholeState for the whole state of that
// layout). The newest layout is the newest of which some rank holds
// shards; ranks holding the whole state of another count for nothing.
// Errors: the communicator's; INVALID_ARGUMENT when two ranks claim one
// rank of the newest layout or disagree on its size.
// `failed_step` (-1 for none) and `failed_generation`: the step that failed
// under this rank, for ShardWorld::one_step; `step`: the steps this rank
// has taken (-1: not said), for ShardWorld::outside_step.
absl::StatusOr<ShardWorld> AgreeOnShards(Communicator* comm, int node, uint64_t generation,
                                         int rank, int world, absl::Time deadline,
                                         int64_t failed_step = -1,
                                         uint64_t failed_generation = 0, int64_t step = -1);

class OptimizerShards {
 public:
  // GatherParameters' chunk, in elements (16 MiB of float32).
  static constexpr int64_t kGatherChunk = int64_t{4} << 20;

  // Shards `optimizers` (not owned) for rank `rank` of a world whose ranks
  // are on `node_of_rank`, keeping `copies` of each shard. State the
  // optimizers already hold (a restored checkpoint, earlier steps) is
  // sliced into the masters. INVALID_ARGUMENT, naming the optimizer or the
  // group, and with nothing changed: LBFGS (its step reads every gradient
  // at once), an optimizer muster has no codec for, a group whose
  // parameters are not float32 on one device, whose trained parameters
  // have taken different numbers of steps or not all have state, or whose
  // state has a field that is neither per element nor a scalar.
  static absl::StatusOr<std::unique_ptr<OptimizerShards>> Make(
      const std::vector<torch::optim::Optimizer*>& optimizers, int rank,
      const std::vector<int>& node_of_rank, int copies);

  // Make for state in a checkpoint's shard files (`files`, of any world)
  // rather than in the optimizers: each shard this rank keeps gets its
  // state from the files' ranges that cover it, read a file at a time
  // (VisitShardFiles), so no rank holds the whole state. `named_params`
  // names the parameters as the files do. The optimizers' own state is
  // dropped. Errors, with nothing changed: Make's INVALID_ARGUMENT;
  // DATA_LOSS naming the file where its groups are not the optimizers'
  // (count, parameter names or shapes) or a field's dtype is not the
  // state's; VisitShardFiles' errors.
  static absl::StatusOr<std::unique_ptr<OptimizerShards>> Load(
      const std::vector<torch::optim::Optimizer*>& optimizers, const NamedTensors& named_params,
      int rank, const std::vector<int>& node_of_rank, int copies, FileSystem* fs,
      const std::vector<ShardFileRef>& files);

  // Whether Make would take `optimizers` (its INVALID_ARGUMENT), changing
  // nothing.
  static absl::Status Check(const std::vector<torch::optim::Optimizer*>& optimizers);

  const ShardLayout& layout() const { return layout_; }
  int rank() const { return rank_; }
  // The layout's groups: every group of the first optimizer, then of the
  // next, in order.
  int groups() const { return static_cast<int>(groups_.size()); }

  // Group `g`'s trained parameters (those that require grad), in order:
  // its flat elements.
  const std::vector<torch::Tensor>& params(int g) const { return groups_[g].params; }
  // Elements `range` of group `g`'s averaged gradient, inside shard `shard`,
  // which this rank keeps, into that shard's master's .grad (made,
  // uninitialised, where it has none): a reduce-scattering sync's segment
  // (Options::reduce_scatter_gradients).
  void SetKeptGradient(int g, int shard, ElementRange range, const torch::Tensor& averaged);
  // The sum over every group of the squares of shard `shard`'s master's
  // gradient, which this rank keeps (0 where it has none), in float64 from
  // each master's float32 norm: what the world sums for the total norm of
  // the reduce-scattered gradients (each part counted by its owner).
  double KeptGradientSquares(int shard) const;
  // Every kept master's .grad times `factor` (the clipping of
  // Options::clip_grad_norm), in place.
  void ScaleKeptGradients(double factor);
  // Group `g`'s parameters' gradients, flat (zeros for a parameter without
  // one): what the world reduces.
  torch::Tensor FlatGradients(int g) const;
  // Group `g`'s parameters, flat.
  torch::Tensor FlatParameters(int g) const;
  // The kept masters' gradients from `averaged`, group `g`'s whole flat
  // averaged gradient (only the ranges this rank keeps are read).
  void SetGradients(int g, const torch::Tensor& averaged);
  // Group `g`'s gradients, flat and shared: each parameter's .grad becomes
  // a view of the group's flat gradient vector and each kept master's .grad
  // a view of its range in it, so that what the program does to the
  // parameters' .grad in place before its optimizer.step()
  // (clip_grad_norm_) is what the masters step with, as an unsharded
  // optimizer would. The flat vector lives as long as the layout: the
  // .grad backward made anew are copied into it (memory faulted in once),
  // and where they are those views already (no boundary since the last
  // call), nothing is copied.
  void ShareGradients(int g);
  // Group `g`'s flat gradient vector (ShareGradients) is `flat`, storage
  // the caller keeps: the group's elements, contiguous float32, on its
  // parameters' device.
  void UseGradientVector(int g, torch::Tensor flat);
  // The part of shard `shard` of group `g`, which this rank keeps, that
  // falls in `range` (of the group's flat elements), from its master, into
  // `chunk`, which holds `range`; the rest of `chunk` is left as it is.
  void WriteKept(int g, int shard, ElementRange range, torch::Tensor* chunk) const;
  // Every parameter's .grad set to none (the optimizers, which hold the
  // masters, no longer clear them), as an unsharded optimizer's zero_grad
  // does: the next backward makes them anew, as unsharded, and
  // ShareGradients copies them into the flat vector. (Views of the vector
  // filled with -0.0, which backward accumulated into in place, cost more:
  // the gradient sync's hooks and autograd then each read and wrote the
  // whole vector once more per step.)
  void ResetParameterGradients();
  // Elements `range` of group `g`'s flat vector, gathered from their
  // keepers into `chunk`, into its parameters. The masters are not
  // written, nor the parameters where they are the masters' storage (a
  // gather skips the pieces this rank keeps there): where this rank keeps
  // a range its master holds those bits already (every keeper of a shard
  // steps it alike; CheckCopiesAgree compares them), and a copy would hide
  // a drift from that check.
  void Install(int g, ElementRange range, const torch::Tensor& chunk);
  // The parameters were written from outside (a state transfer after
  // Redistribute): masters that copy their ranges take them again, and
  // every master's gather marks are taken anew (nothing was stepped).
  void TakeParameterValues();
  // Whether group `g`'s masters are views of its parameters' storage
  // (Make), as the parameters still are (a program that gave a parameter
  // storage of its own since, to() say, is gathered in full).
  bool MastersShareParameters(int g) const;
  // The elements of optimizer state tensors this rank holds (for the
  // memory figures): the masters' per-element state.
  int64_t StateElements() const;
  // The same for `optimizers` unsharded (every parameter's state). Errors:
  // Make's INVALID_ARGUMENT.
  static absl::StatusOr<int64_t> WholeStateElements(
      const std::vector<torch::optim::Optimizer*>& optimizers);

  // Collective over `comm`, whose ranks are the layout's: every owner's
  // range of every group into every rank's parameters (WriteKept,
  // AllGather, Install; the masters hold their ranges already), in
  // PlanGatherRounds' rounds of about `chunk` elements (a piece of every
  // rank's shard) through one buffer, so
  // that the gather costs a round's memory rather than the model's and
  // every rank sends in every round. Where the ranks of every node keep
  // every shard between them (two copies on two nodes of equal size:
  // PlanNodeGather, over the communicator's NodeRanks), each round is
  // gathered inside each node (AllGatherInNode), from the node's keeper of
  // each piece, and nothing crosses nodes: a buddy's copy is its owner's
  // bit for bit. Errors: the communicator's.
  absl::Status GatherParameters(Communicator* comm, absl::Time deadline,
                                int64_t chunk = kGatherChunk);
  // Collective over `comm`, between two passes of a step (a GAN's): only
  // the groups whose masters some rank stepped since the last gather (their
  // version counters; one all-reduce of a word per group)
  // are gathered as GatherParameters gathers them. The other groups'
  // parameters are not written, so a graph the program built on them
  // before (a GAN's generated images) keeps the versions its backward
  // checks. Errors: the communicator's.
  absl::Status GatherStepped(Communicator* comm, absl::Time deadline,
                             int64_t chunk = kGatherChunk);

  // The state of the shard this rank owns (not its buddy copy), every
  // group's, each parameter named as `named_params` names it (the
  // checkpoint's "<param>"). INTERNAL when a trained parameter is not in
  // `named_params`; the codecs' dtype errors.
  absl::StatusOr<OwnShardState> OwnShard(const NamedTensors& named_params) const;

  // Collective over `comm`, whose ranks are the layout's, after
  // GatherParameters: whether this rank's masters hold what its parameters
  // hold, and, with two copies, whether the owner and the buddy of each
  // shard hold the same values and state, bit for bit (one all-reduce of
  // 3 W words). The state stays sharded. OK, or DATA_LOSS on every rank
  // naming the first rank or shard that differs. Errors: the
  // communicator's.
  absl::Status CheckCopiesAgree(Communicator* comm, absl::Time deadline) const;

  // Collective over `comm` (a world after a change, or the layout's own):
  // every trained parameter of these optimizers gets its whole state back
  // on every rank of `comm`, and every group its parameter list as it was
  // before Make. Each range comes from the first of its holders (owner,
  // then buddy) that `alive` (by rank of the layout) says lives on, its
  // parameters' values with it (the masters'); bits are moved, not added,
  // so the state is exact. A group of which no rank
  // holds sharded state (no step yet) keeps on each rank what its own
  // optimizer holds. Ranks of `comm` that held
  // nothing (joiners) take part with ReceiveUnsharded. After it this
  // object holds nothing (destroy it; Make shards again). NOT_FOUND on
  // every rank, and nothing changed, when a range with state, or with
  // values stepped since the last gather (an optimizer without state), has
  // no living holder (one copy, its rank gone: it must come from a
  // checkpoint); the communicator's errors (the state is then unspecified).
  // `whole_source`: ShardWorld's; a range with no living holder comes from
  // that rank instead, and is not lost.
  absl::Status Unshard(const std::vector<bool>& alive, Communicator* comm, absl::Time deadline,
                       int whole_source = -1);
  // Collective over `comm`, a new world's, on every rank, where each rank
  // either holds shards of the world's newest layout (`held`, whose ranks
  // `agreed` says live on) or none of it (`held` null: a joiner, whose
  // `optimizers` are the program's, not sharded; with `whole`, the world's
  // whole source, whose optimizers hold every range as of that layout and
  // send those no holder lives to send): this world's shards (the
  // layout of `agreed.node_of_rank` and `copies`), without the whole state
  // on any rank. Each shard of the new layout is moved in rounds of at most
  // `chunk` elements, from the first living holder of each of its ranges to
  // its keepers (a zeroed buffer summed as int64 words, each with one
  // writer: the bits arrive exactly); every other rank adds zeros and keeps
  // nothing. Where a master was stepped since the last gather, the
  // parameters' values come from the holders as in Unshard. On success
  // `held` holds nothing (destroy it) and the new shards are returned; on
  // any error nothing has changed: NOT_FOUND on every rank when a range
  // with state (or stepped values) has no living holder, the
  // communicator's errors, Make's INVALID_ARGUMENT.
  static absl::StatusOr<std::unique_ptr<OptimizerShards>> Redistribute(
      OptimizerShards* held, const ShardLayout* whole,
      const std::vector<torch::optim::Optimizer*>& optimizers, const ShardWorld& agreed, int copies,
      Communicator* comm, absl::Time deadline, int64_t chunk = kGatherChunk);
  // Collective over `comm`, the world of `held`'s layout, at a step
  // boundary after which the ranks `leaving` says (by rank) leave it: the
  // shards move straight to a layout of the ranks that stay (in their
  // order, `copies` of each), so that nothing goes with a leaver and no
  // rank holds the whole state. A leaver sends and keeps nothing: its
  // groups get their parameter lists back without state, and it gets
  // null. Each rank that stays gets its shards of that layout (rank i of
  // it the i-th rank that stays). Errors as Redistribute's, with nothing
  // changed; FAILED_PRECONDITION where `comm` is not the layout's world.
  static absl::StatusOr<std::unique_ptr<OptimizerShards>> HandOver(
      OptimizerShards* held, const std::vector<torch::optim::Optimizer*>& optimizers,
      const std::vector<bool>& leaving, int copies, Communicator* comm, absl::Time deadline,
      int64_t chunk = kGatherChunk);
  // The groups get their parameter lists back and the masters' state is
  // dropped, nothing gathered (shards of a layout that no longer counts:
  // the state comes to this rank as to a joiner). The object then holds
  // nothing.
  void Release();
  // A joiner's part of Unshard: `optimizers` (the program's, not sharded)
  // receive every parameter's state. Errors: Make's INVALID_ARGUMENT
  // (before any collective), Unshard's.
  static absl::Status ReceiveUnsharded(const std::vector<torch::optim::Optimizer*>& optimizers,
                                       Communicator* comm, absl::Time deadline);
  // The whole source's part of Unshard (ShardWorld::whole_source):
  // `optimizers` (the program's, not sharded, holding the whole state as
  // of `layout`) send the ranges whose holders `alive` says are all gone,
  // and receive every parameter's state as the others do. Errors:
  // ReceiveUnsharded's.
  static absl::Status SendWhole(const std::vector<torch::optim::Optimizer*>& optimizers,
                                const ShardLayout& layout, const std::vector<bool>& alive,
                                Communicator* comm, absl::Time deadline);

 private:
  struct Group {
    torch::optim::Optimizer* optimizer;
    const OptimizerCodec* codec;
    size_t index;                        // in optimizer->param_groups()
    std::vector<torch::Tensor> params;   // the group's that require grad, in order
    std::vector<torch::Tensor> masters;  // one per shard kept (KeptBy); none: nothing to shard
    std::vector<torch::Tensor> frozen;   // the group's that do not: listed after the masters
    std::vector<torch::Tensor> listed;   // the group's parameter list before Make
    // The flat vector the params are views of, in order (Make), or
    // undefined: the masters are then copies.
    torch::Tensor values;
    // Each master's version counter after the last gather of the group (or
    // Make): a master whose counter moved since was stepped. LibTorch's SGD
    // writes through .data(), which moves no counter: where the masters are
    // views, a fingerprint of each (Fingerprint) after the last gather too.
    std::vector<int64_t> gathered_versions;
    std::vector<int64_t> gathered_prints;
    // The flat gradient vector the params' and masters' .grad are views
    // of (ShareGradients); undefined until first needed.
    torch::Tensor grads;

    // The trained elements, padded to whole int64 words (the regather
    // moves float32 bits as int64 words).
    int64_t PaddedElements() const {
      int64_t n = 0;
      for (const torch::Tensor& p : params) n += p.numel();
      return n + n % 2;
    }
  };

  // A kept shard's state: each field by name, per-element ones over the
  // shard's range (1-D), scalars 0-dim; empty for no state.
  using KeptFields = std::map<std::string, torch::Tensor>;

  OptimizerShards(ShardLayout layout, int rank, std::vector<Group> groups);
  // Make's second half: `groups` (Collect's) sharded by `layout` for
  // `rank`, each kept shard's state from `fields` (by group, then in
  // KeptBy's order; a group with none is not sharded).
  static absl::StatusOr<std::unique_ptr<OptimizerShards>> Build(
      std::vector<Group> groups, ShardLayout layout, int rank,
      const std::vector<std::vector<KeptFields>>& fields);
  // Redistribute and HandOver: the shards of `agreed`'s layout (its
  // node_of_rank and `copies`) for rank `rank` of it, -1 for none.
  // `held` and `whole` as Redistribute's.
  static absl::StatusOr<std::unique_ptr<OptimizerShards>> MoveTo(
      OptimizerShards* held, const ShardLayout* whole,
      const std::vector<torch::optim::Optimizer*>& optimizers, const ShardWorld& agreed, int copies,
      int rank, Communicator* comm, absl::Time deadline, int64_t chunk);
  // MoveTo's rounds for group `g` (`groups`, this rank's view of them), the
  // new layout `after`: the fields of each shard this rank keeps there into
  // `kept` (KeptBy's order). `before`: the layout this rank holds state of
  // (null for none), and its rank in it (kHoldsWholeState for the whole
  // source); `source`: ShardSources of that layout.
  static absl::Status MoveGroup(const std::vector<Group>& groups, int g, const ShardLayout* before,
                                int before_rank, const std::vector<int>& source,
                                const ShardLayout& after, int rank, Communicator* comm,
                                absl::Time deadline, int64_t chunk, std::vector<KeptFields>* kept);

  // Where shard `shard`'s master stands in each group's masters (KeptBy's
  // order), or past them when this rank does not keep that shard.
  size_t MasterIndex(int shard) const;
  // Whether a master of `group` (group `g` of `layout`, kept by `rank`)
  // was stepped since its last gather: its version counter moved, or its
  // values differ from the fingerprint taken then (views) or from the
  // parameters' (copies).
  static bool SteppedSinceGathered(const Group& group, int g, const ShardLayout& layout,
                                   int rank);
  // `group.gathered_versions` (and prints) from its masters now.
  static void MarkGathered(Group& group);
  // `group`'s flat gradient vector, made (uninitialised) at first use.
  static torch::Tensor& GradientVector(Group& group);
  // GatherParameters over the groups `gather` marks (non-zero).
  absl::Status GatherGroups(Communicator* comm, absl::Time deadline, int64_t chunk,
                            const std::vector<int64_t>& gather);
  // Make's and Load's start: `optimizers`' groups and their trained
  // elements (Collect), and their layout for rank `rank` of a world whose
  // ranks are on `node_of_rank`. INVALID_ARGUMENT for a rank outside it.
  static absl::StatusOr<ShardLayout> Lay(const std::vector<torch::optim::Optimizer*>& optimizers,
                                         int rank, const std::vector<int>& node_of_rank,
                                         int copies, std::vector<Group>* groups,
                                         std::vector<int64_t>* elements);
  // The groups of `optimizers` and their trained elements, checked.
  static absl::Status Collect(const std::vector<torch::optim::Optimizer*>& optimizers,
                              std::vector<Group>* groups, std::vector<int64_t>* elements);
  // The groups' parameter lists as before Make, the masters and their
  // state gone.
  static void Restore(std::vector<Group>& groups);
  // Unshard's collective, on every rank: `layout` null and `alive` empty
  // for a rank that holds nothing; `rank` kHoldsWholeState for the whole
  // source (SendWhole); `whole_source` ShardWorld's.
  static absl::Status Assemble(std::vector<Group>& groups, const ShardLayout* layout, int rank,
                               const std::vector<bool>& alive, int whole_source,
                               Communicator* comm, absl::Time deadline);
  // Assemble's and Redistribute's first collective: `*header` becomes, summed
  // over the world, whether a range is `lost` (this rank's ShardSources
  // message, or empty), then by group whether it has state, whether it has
  // masters, and whether a master was stepped since the last gather
  // (`layout` null: this rank holds nothing; `rank` kHoldsWholeState: the
  // whole source). NOT_FOUND when a lost range has state or stepped values.
  static absl::Status AgreeOnHeader(const std::vector<Group>& groups, const ShardLayout* layout,
                                    int rank, const std::string& lost, Communicator* comm,
                                    absl::Time deadline, std::vector<int64_t>* header);
  // INVALID_ARGUMENT naming `what` unless `alive` has a word for each rank
  // of this layout and says this rank lives.
  absl::Status CheckAlive(const std::vector<bool>& alive, const char* what) const;
  // Assemble's steps for one group `g` (optimizer_shards.cc).
  static absl::StatusOr<FlatState> StartFlatState(const Group& group, int g,
                                                  const Communicator& comm, int64_t padded);
  static absl::Status WriteHeldState(const Group& group, int g, const ShardLayout& layout,
                                     int rank, const std::vector<int>& source, FlatState* state);
  static absl::Status WriteWholeState(const Group& group, int g, const ShardLayout& layout,
                                      const std::vector<int>& source, FlatState* state);
  static absl::Status InstallFlatState(const Group& group, const FlatState& state);
  static absl::Status AssembleValues(const Group& group, int g, const ShardLayout* layout,
                                     int rank, const std::vector<int>& source,
                                     Communicator* comm, absl::Time deadline,
                                     int64_t chunk = kGatherChunk);

  ShardLayout layout_;
  int rank_;
  std::vector<Group> groups_;
};

}  // namespace muster

#endif  // MUSTER_TRAINER_ELASTIC_OPTIMIZER_SHARDS_H_
