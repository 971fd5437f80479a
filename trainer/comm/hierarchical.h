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
#ifndef MUSTER_TRAINER_COMM_HIERARCHICAL_H_
#define MUSTER_TRAINER_COMM_HIERARCHICAL_H_

#include <memory>
#include <string>
#include <vector>

#include "trainer/comm/communicator.h"

namespace muster {

// Where the ranks are: node and local rank of every global rank.
struct Topology {
  std::vector<int> node_of;        // by global rank; nodes numbered 0..N-1
  std::vector<int> local_rank_of;  // by global rank
  int nodes() const;
  int local_size(int node) const;
  // Global ranks of `node`, by local rank.
  std::vector<int> ranks_of(int node) const;
};

// One inter-node group: the owners of segments [first, last).
struct InterGroup {
  int first_segment = 0;
  int last_segment = 0;
  std::vector<int> members;  // global ranks, by node
};

struct HierarchyPlan {
  int segments = 0;
  // Segments owned by local rank l of node k: [owned_begin[k][l], owned_begin[k][l+1]).
  std::vector<std::vector<int>> owned_begin;
  std::vector<InterGroup> groups;  // all groups, by first segment
};

// Pure: the plan for `topology`.
HierarchyPlan PlanHierarchy(const Topology& topology);

// Element-wise work the composition does on its buffers.
class BufferOps {
 public:
  virtual ~BufferOps() = default;
  virtual absl::Status Zero(void* data, size_t bytes) = 0;
  // data[i] /= divisor (integer division for kInt64).
  virtual absl::Status Divide(DataType type, void* data, size_t count, int divisor) = 0;
};

// BufferOps on host memory.
std::unique_ptr<BufferOps> NewHostBufferOps();

// Composes `intra` (this node's ranks) and the inter-node communicators of
// the groups this rank belongs to (`inter[i]` for `my_groups[i]`, ordered by
// first segment; nullptr for a group of one). Takes ownership.
std::unique_ptr<Communicator> NewHierarchicalCommunicator(
    int rank, int size, HierarchyPlan plan, int node, std::unique_ptr<Communicator> intra,
    std::vector<InterGroup> my_groups, std::vector<std::unique_ptr<Communicator>> inter,
    std::unique_ptr<BufferOps> ops = NewHostBufferOps());

}  // namespace muster

#endif  // MUSTER_TRAINER_COMM_HIERARCHICAL_H_
