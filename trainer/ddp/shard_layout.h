// ShardLayout: who owns and who keeps which range of the optimizer state
// when it is sharded (docs/sharding.md). Pure arithmetic, no LibTorch.
//
// Each parameter group's elements form one flat vector of N_g elements.
// Shard s of a world of W ranks is the element range
//   [s*N_g/W + min(s, N_g%W), ...) of length N_g/W, plus one for the first
//   N_g%W shards,
// so that every shard is within one element of every other. Rank s owns
// shard s. With two copies, shard s is also kept by its buddy: the rank
// W/2 places after s in node order (ranks sorted by node, then rank), which
// is on another node wherever the world has more than one node with ranks
// spread evenly.
//
// PlanReshard says, for a new world, where each range a new rank keeps
// comes from: for every shard it keeps in the new layout, pieces of
// (group, element range, the surviving old rank that holds them).
//
// Thread-safety: immutable once made.
#ifndef MUSTER_TRAINER_DDP_SHARD_LAYOUT_H_
#define MUSTER_TRAINER_DDP_SHARD_LAYOUT_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace muster {

struct ElementRange {
  int64_t begin = 0;  // first element
  int64_t end = 0;    // one past the last
  int64_t size() const { return end - begin; }
  // The elements in both; empty (size() <= 0) when they do not meet.
  ElementRange Overlap(const ElementRange& o) const {
    return ElementRange{begin > o.begin ? begin : o.begin, end < o.end ? end : o.end};
  }
  bool operator==(const ElementRange& o) const { return begin == o.begin && end == o.end; }
};

class ShardLayout {
 public:
  // `group_elements`: N_g for each parameter group (each >= 0);
  // `node_of_rank`: the node of each rank (its size is W >= 1); `copies`:
  // 1, or 2 (a buddy copy; a world of one keeps one copy whatever is
  // asked). INVALID_ARGUMENT for anything else, naming what was wrong.
  static absl::StatusOr<ShardLayout> Make(std::vector<int64_t> group_elements,
                                          std::vector<int> node_of_rank, int copies);

  int world() const { return static_cast<int>(node_of_rank_.size()); }
  const std::vector<int>& node_of_rank() const { return node_of_rank_; }
  int groups() const { return static_cast<int>(group_elements_.size()); }
  // The copies each shard has in this world: min(asked, world()).
  int copies() const { return copies_; }
  int64_t group_elements(int group) const { return group_elements_[group]; }

  // Shard `shard`'s range of group `group`'s elements.
  ElementRange Range(int group, int shard) const;
  // The ranks that keep shard `shard`: its owner first, then its buddy.
  std::vector<int> Holders(int shard) const;
  // The shards rank `rank` keeps: its own first, then the one it backs up.
  std::vector<int> KeptBy(int rank) const;

 private:
  ShardLayout(std::vector<int64_t> group_elements, std::vector<int> node_of_rank, int copies);

  std::vector<int64_t> group_elements_;
  std::vector<int> node_of_rank_;
  int copies_ = 1;
  std::vector<int> order_;     // ranks in node order
  std::vector<int> position_;  // rank -> its index in order_
};

// A bucket of a reduce-scattering gradient sync
// (Options::reduce_scatter_gradients): the whole trained parameters
// [first, last) of group `group`, by their index in the group, which lie in
// the group's flat elements `range`. Shard ranges are contiguous and in
// rank order, so the bucket is already laid out as the world's segments:
// `counts[r]` elements of rank r's shard, in rank order
// (Communicator::ReduceScatter's layout; many are 0 when the bucket is
// smaller than a shard).
struct ShardedBucket {
  int group = 0;
  size_t first = 0, last = 0;  // parameters of the group
  ElementRange range;
  std::vector<size_t> counts;  // one per rank; they sum to range.size()
};

// The buckets of `layout`'s groups, whose trained parameters have
// `param_elements[g]` elements each (summing to the group's elements), in
// the order backward fills them: the last group first, and within a group
// from its last parameter toward its first. A bucket takes parameters
// until the next would take it past `cap` elements (the first bucket
// `first_cap`: communication starts early), and always at least one.
// Every parameter of every group is in exactly one bucket (an empty one
// rides in a neighbour's; a bucket of empty parameters alone has no
// elements); a group without parameters has none.
std::vector<ShardedBucket> PlanBuckets(const ShardLayout& layout,
                                       const std::vector<std::vector<int64_t>>& param_elements,
                                       int64_t first_cap, int64_t cap);

// A round of the parameters' all-gather (OptimizerShards::GatherParameters)
// over one group: the next piece of every rank's shard, `pieces[r]` rank
// r's (empty once its shard is used up), gathered in rank order. A
// contiguous chunk of the group would mostly lie in one shard, so that one
// rank would send the whole chunk and the others nothing; a round takes
// about as much from each rank, so every rank and link works in every
// round.
struct GatherRound {
  int group = 0;
  std::vector<ElementRange> pieces;  // one per rank, inside its shard
  // Communicator::AllGather's counts: the pieces' sizes.
  std::vector<size_t> counts() const;
};

// The rounds of `layout`'s groups, in group order, each piece at most
// max(1, cap / world) elements (so a round about `cap` in all): every
// element of every group is in exactly one piece; an empty group has none.
std::vector<GatherRound> PlanGatherRounds(const ShardLayout& layout, int64_t cap);

// Where the parameters' all-gather can stay inside the nodes. With nodes of
// `node_size` ranks numbered node by node (node k holds ranks
// [k*node_size, (k+1)*node_size)), a node whose ranks together keep every
// shard can gather the parameters among themselves, and nothing need cross
// nodes: with two copies on two nodes of equal size each shard's owner is
// on one node and its buddy on the other. The plan, when every node can:
// for each node k and each shard s, `[k][s]` is the node-local rank that
// provides s there (its owner when the owner is on node k, else its buddy).
// Empty when some node lacks a keeper of some shard, when `node_size` does
// not divide the world into more than one node, or is not positive.
std::vector<std::vector<int>> PlanNodeGather(const ShardLayout& layout, int node_size);

// Whether every rank keeps only shards of its column: with nodes of
// `node_size` ranks numbered node by node, shard s (owned by rank s) is in
// the column of rank r when s % node_size == r % node_size. Then a
// reduction that leaves each rank its column's segments
// (Communicator::ReduceColumnsGradients) gives it every shard it steps: two
// copies on two nodes of equal size. False when `node_size` is not positive
// or does not divide the world into more than one node.
bool KeptInColumns(const ShardLayout& layout, int node_size);

// One piece of a reshard: elements [range) of group `group`, which the new
// rank `to` keeps, come from the survivor whose rank in the new world is
// `from` (to == from: the rank has them already), or, with `from` ==
// kLost, from no survivor: they must come from a checkpoint.
struct ReshardPiece {
  static constexpr int kLost = -1;
  int to = 0;
  int from = 0;
  int group = 0;
  ElementRange range;
};

// How to go from `before` to `after` in memory: `new_rank_of_old[r]` is old
// rank r's rank in the new world, or -1 if it is gone (new ranks that no
// old rank maps to are joiners, who hold nothing). Every element of every
// shard a new rank keeps is covered by exactly one piece: taken from the
// new rank itself where it held it (nothing moves), else from the old
// owner, else from the buddy, else marked kLost. INVALID_ARGUMENT when the
// layouts do not fit together (other groups, a mapping of the wrong size
// or to ranks that do not exist).
absl::StatusOr<std::vector<ReshardPiece>> PlanReshard(const ShardLayout& before,
                                                      const ShardLayout& after,
                                                      const std::vector<int>& new_rank_of_old);

// The first piece of `plan` that no survivor holds, as a NOT_FOUND that
// names it (the group, the range, the new rank that needs it); OK when
// every piece comes from a survivor.
absl::Status CheckNothingLost(const std::vector<ReshardPiece>& plan);

}  // namespace muster

#endif  // MUSTER_TRAINER_DDP_SHARD_LAYOUT_H_
