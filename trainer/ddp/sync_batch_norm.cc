// muster::SyncBatchNorm (muster/sync_batch_norm.h).
//
// The world's statistics come from one sum over the world of each rank's
// (sum, sum of squares, count) per channel, in float64, through a
// differentiable sum: its backward sums the gradients of those three over
// the world again, which is the whole of the cross-rank term of the input
// gradient (the adjoint of a sum over ranks is a sum over ranks). Autograd
// does the rest, so the input gradient of rank r is the gradient of the
// sum of every rank's loss with respect to r's input, as in PyTorch's
// SyncBatchNorm; the gradient all-reduce then averages it as any other.
#include "muster/sync_batch_norm.h"

#include <torch/nn/functional/batchnorm.h>
#include <torch/torch.h>

#include <vector>

namespace muster {
namespace {

// Carries the reducer of a sum into its backward.
struct ReducerCapsule : torch::CustomClassHolder {
  explicit ReducerCapsule(std::shared_ptr<StatisticsReducer> r) : reducer(std::move(r)) {}
  std::shared_ptr<StatisticsReducer> reducer;
};

// A float64 vector summed over the world; its gradient likewise.
struct WorldSum : public torch::autograd::Function<WorldSum> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& local,
                               const std::shared_ptr<StatisticsReducer>& reducer) {
    ctx->saved_data["reducer"] =
        c10::IValue::make_capsule(c10::make_intrusive<ReducerCapsule>(reducer));
    torch::Tensor total = local.clone();
    reducer->SumOverWorld(total);
    return total;
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const auto capsule = c10::static_intrusive_pointer_cast<ReducerCapsule>(
        ctx->saved_data["reducer"].toCapsule());
    torch::Tensor total = grads[0].to(torch::kDouble).contiguous().clone();
    capsule->reducer->SumOverWorld(total);
    return {total, torch::Tensor()};
  }
};

}  // namespace

SyncBatchNormImpl::SyncBatchNormImpl(const torch::nn::BatchNormOptions& options)
    : options(options) {
  reset();
}

void SyncBatchNormImpl::reset() {
  const int64_t c = options.num_features();
  if (options.affine()) {
    weight = register_parameter("weight", torch::empty({c}));
    bias = register_parameter("bias", torch::empty({c}));
  }
  if (options.track_running_stats()) {
    running_mean = register_buffer("running_mean", torch::zeros({c}));
    running_var = register_buffer("running_var", torch::ones({c}));
    num_batches_tracked = register_buffer("num_batches_tracked", torch::tensor(0, torch::kLong));
  }
  reset_parameters();
}

void SyncBatchNormImpl::reset_running_stats() {
  if (!options.track_running_stats()) return;
  torch::NoGradGuard no_grad;
  running_mean.zero_();
  running_var.fill_(1);
  num_batches_tracked.zero_();
}

void SyncBatchNormImpl::reset_parameters() {
  reset_running_stats();
  if (!options.affine()) return;
  torch::NoGradGuard no_grad;
  weight.fill_(1);
  bias.zero_();
}

void SyncBatchNormImpl::pretty_print(std::ostream& stream) const {
  stream << "muster::SyncBatchNorm(" << options.num_features() << ", eps=" << options.eps()
         << ", momentum=";
  if (options.momentum().has_value()) {
    stream << *options.momentum();
  } else {
    stream << "None";
  }
  stream << ", affine=" << std::boolalpha << options.affine()
         << ", track_running_stats=" << options.track_running_stats() << ")";
}

torch::Tensor SyncBatchNormImpl::WorldStatistics(const torch::Tensor& input, double* count) {
  const int64_t c = options.num_features();
  std::vector<int64_t> dims = {0};
  for (int64_t d = 2; d < input.dim(); ++d) dims.push_back(d);
  const double local_count = input.numel() == 0 ? 0.0 : static_cast<double>(input.numel() / c);
  const torch::Tensor local =
      torch::cat({input.sum(dims, /*keepdim=*/false, torch::kDouble),
                  input.square().sum(dims, /*keepdim=*/false, torch::kDouble),
                  torch::full({1}, local_count, torch::dtype(torch::kDouble).device(input.device()))})
          .to(torch::kCPU)
          .contiguous();
  const torch::Tensor total = WorldSum::apply(local, reducer_);
  *count = total[2 * c].item<double>();
  TORCH_CHECK(*count > 1, "SyncBatchNorm: expected more than 1 value per channel over the world's "
              "batch when training, got ", *count, " (input size ", input.sizes(), " on this rank)");
  const torch::Tensor mean = total.narrow(0, 0, c) / *count;
  const torch::Tensor var = (total.narrow(0, c, c) / *count - mean.square()).clamp_min(0);
  return torch::stack({mean, var});
}

double SyncBatchNormImpl::TrackBatch() {
  torch::NoGradGuard no_grad;
  num_batches_tracked += 1;
  return options.momentum().has_value() ? *options.momentum()
                                        : 1.0 / num_batches_tracked.item<double>();
}

void SyncBatchNormImpl::UpdateRunningStats(const torch::Tensor& mean, const torch::Tensor& var,
                                           double count) {
  if (!options.track_running_stats()) return;
  const double factor = TrackBatch();
  torch::NoGradGuard no_grad;
  const auto like = torch::TensorOptions().dtype(running_mean.scalar_type())
                        .device(running_mean.device());
  running_mean.mul_(1 - factor).add_(mean.to(like), factor);
  running_var.mul_(1 - factor).add_((var * (count / (count - 1))).to(like), factor);
}

torch::Tensor SyncBatchNormImpl::forward(const torch::Tensor& input) {
  TORCH_CHECK(input.dim() >= 2, "SyncBatchNorm: expected an input of 2 or more dimensions "
              "(N, C, ...), got ", input.dim());
  TORCH_CHECK(input.size(1) == options.num_features(), "SyncBatchNorm: expected ",
              options.num_features(), " channels (input.size(1)), got ", input.size(1));
  const bool sync = is_training() && reducer_ != nullptr && reducer_->world_size() > 1;
  if (!sync) {  // BatchNorm, as LibTorch's computes it
    const double factor = is_training() && options.track_running_stats()
                              ? TrackBatch()
                              : options.momentum().value_or(0.0);
    return torch::nn::functional::detail::batch_norm(
        input, running_mean, running_var, weight, bias,
        is_training() || !options.track_running_stats(), factor, options.eps());
  }
  // Reduced precision (autocast) takes its statistics and normalises in
  // float32, and gives back its own type.
  const bool low = input.scalar_type() == torch::kHalf || input.scalar_type() == torch::kBFloat16;
  const torch::Tensor x = low ? input.to(torch::kFloat) : input;
  double count = 0;
  const torch::Tensor stats = WorldStatistics(x, &count);
  UpdateRunningStats(stats[0].detach(), stats[1].detach(), count);
  std::vector<int64_t> shape(input.dim(), 1);
  shape[1] = options.num_features();
  const auto like = torch::TensorOptions().dtype(x.scalar_type()).device(x.device());
  const torch::Tensor mean = stats[0].to(like).view(shape);
  const torch::Tensor invstd = (stats[1] + options.eps()).rsqrt().to(like).view(shape);
  torch::Tensor out = (x - mean) * invstd;
  if (options.affine()) out = out * weight.view(shape) + bias.view(shape);
  return low ? out.to(input.scalar_type()) : out;
}

}  // namespace muster
