// SyncBatchNorm for LibTorch: batch normalisation whose batch statistics are
// the whole world's, as Python's torch.nn.SyncBatchNorm computes them. A
// drop-in for torch::nn::BatchNorm1d, 2d and 3d: the same options, the same
// parameter and buffer names (a checkpoint of either loads into the other).
//
//   struct NetImpl : torch::nn::Module {
//     torch::nn::Conv2d conv{torch::nn::Conv2dOptions(3, 16, 3)};
//     muster::SyncBatchNorm bn{16};            // was torch::nn::BatchNorm2d
//     ...
//   };
//
// Distributed::Start finds every SyncBatchNorm in the registered modules
// and connects it to the job's world. In training mode its forward sums
// (count, sum, sum of squares) per channel over the world in one small
// all-reduce, and its backward sums the statistics' gradients in another;
// the running statistics are then the same on every rank. In eval mode it
// normalises with the running statistics, locally, like BatchNorm. Outside
// a job (before Start, after the Distributed is gone) or in a world of one
// it is BatchNorm.
//
// What it asks of the program, as PyTorch's does:
//   * every rank runs each training forward and backward through it (a rank
//     whose share is empty at the end of an epoch runs them on an empty
//     batch, which counts for nothing);
//   * evaluation on one rank alone runs in eval mode (model->eval()).
// A peer that fails inside one of its all-reduces fails the step as a
// failed gradient all-reduce does: the survivors regroup and the step is
// dropped and taken again in the new world (not salvaged: its statistics
// held the lost ranks' examples). docs/library.md, "SyncBatchNorm".
#ifndef MUSTER_SYNC_BATCH_NORM_H_
#define MUSTER_SYNC_BATCH_NORM_H_

#include <torch/nn/cloneable.h>
#include <torch/nn/options/batchnorm.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <memory>
#include <ostream>

namespace muster {

// What a SyncBatchNorm sums its statistics over. Distributed::Start gives
// every SyncBatchNorm of the registered modules the job's; a program never
// implements or calls it.
class StatisticsReducer {
 public:
  virtual ~StatisticsReducer() = default;
  // The ranks the sum runs over now; 1 (or less) means local statistics.
  virtual int world_size() const = 0;
  // Sums `values` (float64, contiguous, on the CPU) over the world in
  // place. After a failure (a peer died or hung) it leaves them as this
  // rank's own, and the step fails at AfterBackward.
  virtual void SumOverWorld(torch::Tensor& values) = 0;
};

class SyncBatchNormImpl : public torch::nn::Cloneable<SyncBatchNormImpl> {
 public:
  explicit SyncBatchNormImpl(int64_t num_features)
      : SyncBatchNormImpl(torch::nn::BatchNormOptions(num_features)) {}
  explicit SyncBatchNormImpl(const torch::nn::BatchNormOptions& options);

  // Input (N, C, ...): C = num_features, any number of trailing dimensions.
  torch::Tensor forward(const torch::Tensor& input);

  void reset() override;
  void reset_running_stats();
  void reset_parameters();
  void pretty_print(std::ostream& stream) const override;

  // Set by Distributed::Start; null: local statistics.
  void set_reducer(std::shared_ptr<StatisticsReducer> reducer) { reducer_ = std::move(reducer); }

  torch::nn::BatchNormOptions options;
  torch::Tensor weight;               // with options.affine()
  torch::Tensor bias;                 // with options.affine()
  torch::Tensor running_mean;         // with options.track_running_stats()
  torch::Tensor running_var;          // with options.track_running_stats()
  torch::Tensor num_batches_tracked;  // with options.track_running_stats()

 private:
  // The world's mean and biased variance of each channel of `input`
  // (float64), differentiable, and the world's count of values per channel.
  torch::Tensor WorldStatistics(const torch::Tensor& input, double* count);
  // One more batch tracked: the weight of its statistics in the running
  // ones (the momentum, or without one the cumulative average's).
  double TrackBatch();
  void UpdateRunningStats(const torch::Tensor& mean, const torch::Tensor& var, double count);

  std::shared_ptr<StatisticsReducer> reducer_;
};
TORCH_MODULE(SyncBatchNorm);

}  // namespace muster

#endif  // MUSTER_SYNC_BATCH_NORM_H_
