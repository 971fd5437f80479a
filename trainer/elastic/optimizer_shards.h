// OptimizerShards: the optimizers' side of sharded optimizer state
// (docs/sharding.md). Each parameter group of each optimizer becomes one
// flat vector of float32 elements (its parameters in order), split by a
// ShardLayout. For each shard this rank keeps, a flat leaf tensor, its
// master copy, takes the place of the group's parameters in the group's
// parameter list, and carries the optimizer state of its range; the
// parameters' own state is dropped. The program's optimizer.step() then
// updates only the masters, element for element as it would have updated
// the parameters (the optimizers muster shards compute each element from
// that element alone, and one step count per group).
//
// Parameters that do not require grad stay in their group's list as they
// are (the optimizer skips them); a group with nothing to train is left
// alone. An optimizer that has no state yet leaves the masters without
// any, so that its first step makes it as it would have.
//
// A step, for group g (the communication is the caller's):
//   FlatGradients(g) -> reduced over the world -> SetGradients(g, averaged)
//   optimizer.step()
//   WriteOwn(g, &flat) -> all-gathered in the layout's ranges -> Install(g, flat)
//
// The optimizers must not be used without this object once it is made,
// and must outlive it. Not thread-safe: the training thread's.
#ifndef MUSTER_TRAINER_ELASTIC_OPTIMIZER_SHARDS_H_
#define MUSTER_TRAINER_ELASTIC_OPTIMIZER_SHARDS_H_

#include <torch/optim/optimizer.h>

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/ddp/shard_layout.h"

namespace muster {

class OptimizerCodec;  // include/muster/optimizer_codec.h

class OptimizerShards {
 public:
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

  const ShardLayout& layout() const { return layout_; }
  int rank() const { return rank_; }
  // The layout's groups: every group of the first optimizer, then of the
  // next, in order.
  int groups() const { return static_cast<int>(groups_.size()); }

  // Group `g`'s parameters' gradients, flat (zeros for a parameter without
  // one): what the world reduces.
  torch::Tensor FlatGradients(int g) const;
  // Group `g`'s parameters, flat.
  torch::Tensor FlatParameters(int g) const;
  // The kept masters' gradients from `averaged`, group `g`'s whole flat
  // averaged gradient (only the ranges this rank keeps are read).
  void SetGradients(int g, const torch::Tensor& averaged);
  // This rank's own range of group `g`, from its master, into `flat` (the
  // group's flat vector; the other ranges are left as they are).
  void WriteOwn(int g, torch::Tensor* flat) const;
  // Group `g`'s whole flat vector, gathered from every owner, into its
  // parameters and into the masters this rank keeps.
  void Install(int g, const torch::Tensor& flat);
  // The elements of optimizer state tensors this rank holds (for the
  // memory figures): the masters' per-element state.
  int64_t StateElements() const;

 private:
  struct Group {
    torch::optim::Optimizer* optimizer;
    const OptimizerCodec* codec;
    size_t index;                        // in optimizer->param_groups()
    std::vector<torch::Tensor> params;   // the group's that require grad, in order
    std::vector<torch::Tensor> masters;  // one per shard kept (KeptBy); none: nothing to shard
    std::vector<torch::Tensor> frozen;   // the group's that do not: listed after the masters
  };

  OptimizerShards(ShardLayout layout, int rank, std::vector<Group> groups);
  // The groups of `optimizers` and their trained elements, checked.
  static absl::Status Collect(const std::vector<torch::optim::Optimizer*>& optimizers,
                              std::vector<Group>* groups, std::vector<int64_t>* elements);

  ShardLayout layout_;
  int rank_;
  std::vector<Group> groups_;
};

}  // namespace muster

#endif  // MUSTER_TRAINER_ELASTIC_OPTIMIZER_SHARDS_H_
