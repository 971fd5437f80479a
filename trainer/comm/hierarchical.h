// Hierarchical all-reduce: reduce-scatter inside the node, all-reduce of
// each shard across nodes among the ranks that own it, all-gather inside the
// node (the two-level scheme of Horovod and NCCL).
//
// The buffer is split into S = (largest local world size) segments. On a
// node with L ranks, local rank l owns the contiguous segments
// [l*S/L, (l+1)*S/L). Segment s is all-reduced across nodes among its owners
// (one rank per node); consecutive segments with the same owners share one
// inter-node communicator. With equal nodes this is the classic scheme (one
// inter-node group per local rank); nodes with fewer ranks simply own more
// segments. One rank per node degenerates to the flat inter-node all-reduce.
//
// The composition works on whatever memory its communicators take (they
// all take the same: host memory, or one GPU's memory, with the inter-node
// communicators staged through pinned host buffers); the few element-wise
// operations it does itself go through BufferOps for that memory.
//
// Gradient compression (Communicator::AllReduceGradients): with a
// `gradient_wire` of kBFloat16 or kFloat16 the node-local legs stay
// float32 and only the shard that crosses nodes is compressed: each owner
// rounds its float32 shard (the node's exact float32 sum) to the wire type,
// all-reduces it across nodes in that type (Gloo adds in float32 and
// rounds after every hop of its ring: one rounding for two nodes, N-1 for
// N), widens the result back to float32 and divides there for an average;
// the all-gather inside the node is float32 again. Every other collective,
// and AllReduce itself, is never compressed.
#ifndef MUSTER_TRAINER_COMM_HIERARCHICAL_H_
#define MUSTER_TRAINER_COMM_HIERARCHICAL_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "trainer/comm/communicator.h"

namespace muster {

// One inter-node group: segments [first_segment, last_segment), reduced
// across nodes among their owners, one per node. Every node has an owner of
// every segment, so a group has one member per node, at the node's rank.
struct InterGroup {
  int first_segment = 0;
  int last_segment = 0;
};

struct HierarchyPlan {
  int segments = 0;
  // On a node of L members, local rank l owns the segments
  // [owned_begin.at(L)[l], owned_begin.at(L)[l + 1]).
  std::map<int, std::vector<int>> owned_begin;
  std::vector<InterGroup> groups;  // all groups, by first segment

  // Local rank that owns `segment` on a node of `node_size` members.
  int Owner(int node_size, int segment) const;
};

// Pure: the plan for a world whose nodes hold `node_sizes` members (any
// order, repeats allowed: only the distinct sizes matter, so every member
// can plan from the world's summary without knowing every node).
HierarchyPlan PlanHierarchy(const std::vector<int>& node_sizes);

// Element-wise work the composition does on its buffers.
class BufferOps {
 public:
  virtual ~BufferOps() = default;
  virtual absl::Status Zero(void* data, size_t bytes) = 0;
  // data[i] /= divisor (integer division for kInt64).
  virtual absl::Status Divide(DataType type, void* data, size_t count, int divisor) = 0;
  // `count` float32 elements at `from` rounded to nearest (ties to even) in
  // `wire` (kFloat16 or kBFloat16) at `to`; the two do not overlap.
  virtual absl::Status Compress(DataType wire, const void* from, void* to, size_t count) = 0;
  // `count` elements of `wire` at `from` widened to float32 at `to`.
  virtual absl::Status Decompress(DataType wire, const void* from, void* to, size_t count) = 0;
  // At least `bytes` of this memory, owned by the ops and reused: valid
  // until the next call of Scratch or the ops' end. Errors: UNAVAILABLE
  // (the allocation failed).
  virtual absl::StatusOr<void*> Scratch(size_t bytes) = 0;
};

// BufferOps on host memory.
std::unique_ptr<BufferOps> NewHostBufferOps();

// Composes `intra` (this node's `local_size` ranks) and the inter-node
// communicators of the groups this rank belongs to (`inter[i]` for
// `my_groups[i]`, ordered by first segment; nullptr for a group of one).
// Takes ownership. A failure or Abort breaks the composition and its
// inter-node communicators, and `intra` too where it has peers to wake;
// an `intra` of one rank, or one no failure reached, is handed on by
// ReleaseNodeCommunicator for the next world to keep, and one that failed
// is handed on when it can shrink (node_comm.h). `gradient_wire`: the type
// AllReduceGradients' shards cross nodes in (kFloat32: no compression);
// without inter-node communicators (one node) nothing crosses nodes and
// gradient_wire() is kFloat32 whatever is asked.
std::unique_ptr<Communicator> NewHierarchicalCommunicator(
    int rank, int size, HierarchyPlan plan, int local_size, std::unique_ptr<Communicator> intra,
    std::vector<InterGroup> my_groups, std::vector<std::unique_ptr<Communicator>> inter,
    std::unique_ptr<BufferOps> ops = NewHostBufferOps(),
    DataType gradient_wire = DataType::kFloat32);

}  // namespace muster

#endif  // MUSTER_TRAINER_COMM_HIERARCHICAL_H_
