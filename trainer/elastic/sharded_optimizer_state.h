// ShardedOptimizerState: the optimizer state kept sharded
// (Options::shard_optimizer_state), as OptimizerState asks: the state
// through steps and worlds is ShardedOptimizers', and the pass over every
// parameter the shards train reduces through a sync of its own whose
// buckets follow the shards (ShardedBucket): all-reduced into the shards'
// gradient vectors, or reduce-scattered so that each rank gets the average
// of what it keeps (OptimizerStateOptions::reduce_scatter).
//
// Not thread-safe: the training thread's.
#ifndef MUSTER_TRAINER_ELASTIC_SHARDED_OPTIMIZER_STATE_H_
#define MUSTER_TRAINER_ELASTIC_SHARDED_OPTIMIZER_STATE_H_

#include <memory>
#include <optional>
#include <vector>

#include "trainer/elastic/optimizer_state.h"
#include "trainer/elastic/sharded_optimizers.h"

namespace muster {

class ShardedOptimizerState : public OptimizerState {
 public:
  ShardedOptimizerState(const TrainingState& state, OptimizerStateOptions options);
  ~ShardedOptimizerState() override;

  bool sharding() const override { return true; }
  bool sharded() const override { return sharded_.sharded(); }
  absl::Status Check() const override;

  absl::Status ForStep(Communicator* comm) override { return sharded_.Reshard(comm); }
  absl::Status BetweenPasses(Communicator* comm, absl::Time deadline) override {
    return sharded_.BetweenPasses(comm, deadline);
  }
  absl::Status AtBoundary(Communicator* comm, absl::Time deadline) override;
  absl::Status MakeWhole(Communicator* comm, absl::Time deadline) override {
    return sharded_.Whole(comm, deadline);
  }

  // The sync of a pass over exactly the parameters the shards train, while
  // sharded; null for other passes (a GAN's), and without shards (their
  // sync and gradient vectors then go).
  GradientSync* PassSync(const std::vector<torch::Tensor>& params) override;
  GradientSync* ResyncSync(const std::vector<torch::Tensor>& params) override;
  GradientSync* sync() const override { return sync_.get(); }
  absl::Status AllowsTrainedChange(const std::string& change) const override;
  bool Reduced(const GradientSync* by) override;
  double KeptGradientSquares() const override { return sharded_.OwnGradientSquares(); }
  void ScaleKeptGradients(double factor) override { sharded_.ScaleKeptGradients(factor); }

  void UseCommunicator(Communicator* comm) override;
  absl::Status Enter(Communicator* comm, const WorldInfo& world, int64_t step,
                     const std::optional<FailedStepMark>& failed, absl::Time deadline) override;
  TrainingState Transferred() const override;
  void StateTransferred() override;
  absl::Status CatchUp(Communicator* comm, bool stepped, absl::Time deadline) override {
    return sharded_.CatchUp(comm, stepped, deadline);
  }
  // Where none leaves, or one does and each of its ranges has a second
  // holder. A rank missing from the next world for another reason (a
  // death) loses what a death loses (with one copy: its ranges, read again
  // from the checkpoint).
  bool GoesAlong(int leaving) const override;
  bool CanHandOver(int leaving) const override;
  absl::Status HandOver(Communicator* comm, bool leaves, absl::Time deadline) override {
    return sharded_.HandOver(comm, leaves, deadline);
  }
  void Release() override { sharded_.Release(); }
  void Close() override;

  void LoadAtEntry(int64_t step, std::vector<ShardFileRef> files, FileSystem* fs) override;
  absl::StatusOr<OwnShardState> OwnShard() const override;
  absl::Status CheckAgrees(const std::vector<int64_t>& counters, Communicator* comm,
                           absl::Time deadline) const override;
  int64_t StateElements() const override;

 private:
  // A sync for the shards of now, over `trained` (the shards' parameters,
  // `first_of_group` the index of each group's first), reduce-scattering
  // with `scatter`.
  void MakeSync(std::vector<torch::Tensor> trained, const std::vector<size_t>& first_of_group,
                const std::vector<std::vector<int64_t>>& elements, bool scatter);
  // `plan`'s buffers (over `params` parameters): views of one gradient
  // vector per group of `shards`, in the group's flat order, which the
  // sharded optimizers' ShareGradients then use as they are. The
  // gradients then cost the buckets' memory once, as unsharded they cost
  // the buckets' and the .grad's.
  void GiveGradientVectors(const OptimizerShards& shards, size_t params,
                           std::vector<GradientSync::BucketPlan>* plan);

  const TrainingState state_;
  const OptimizerStateOptions options_;
  ShardedOptimizers sharded_;
  Communicator* comm_ = nullptr;
  // The sync of a pass over every parameter the shards train (PassSync),
  // made for the shards of ShardedOptimizers::times_sharded() `sync_of_`,
  // and its buckets.
  std::unique_ptr<GradientSync> sync_;
  std::vector<ShardedBucket> plan_;
  uint64_t sync_of_ = 0;
  int64_t held_elements_ = -1;  // the shards' state at the last boundary
};

}  // namespace muster

#endif  // MUSTER_TRAINER_ELASTIC_SHARDED_OPTIMIZER_STATE_H_
