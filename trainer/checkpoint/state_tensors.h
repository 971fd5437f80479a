// The named tensors that make up a trainer's state: model parameters and
// buffers, and the optimizer's per-parameter state. Shared by checkpoints
// and by the state transfer after a regroup.
#ifndef MUSTER_TRAINER_CHECKPOINT_STATE_TENSORS_H_
#define MUSTER_TRAINER_CHECKPOINT_STATE_TENSORS_H_

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "absl/status/statusor.h"

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace muster {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// "param.<name>" for parameters, "buffer.<name>" for buffers.
NamedTensors ModelTensors(torch::nn::Module& model);
// "<param>.<field>": SGD momentum_buffer; Adam/AdamW step (int64 scalar), exp_avg,
// exp_avg_sq, max_exp_avg_sq.
NamedTensors OptimizerTensors(torch::nn::Module& model, torch::optim::Optimizer& optimizer);
// Gives every parameter optimizer state equal to what a first step would
// start from (zero momentum; Adam/AdamW step 0 and zero moments), where it has
// none, so that every rank holds the same set of state tensors.
void EnsureOptimizerState(torch::nn::Module& model, torch::optim::Optimizer& optimizer);
// Installs `state` as the optimizer state of `param` (LibTorch keys it by
// the parameter's TensorImpl, as a pointer in 2.x and as a string in 1.13).
void PutOptimizerState(torch::optim::Optimizer& optimizer, const torch::Tensor& param,
                       std::unique_ptr<torch::optim::OptimizerParamState> state);
// OptimizerTensors hands out Adam/AdamW's integer step as a fresh tensor; this
// writes such "<param>.step" tensors back into the optimizer's state.
void ApplyOptimizerSteps(torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                         const NamedTensors& tensors);

// The safetensors name of a LibTorch dtype ("F32", "BF16", "I64", ...).
// Errors: INVALID_ARGUMENT for a dtype safetensors files here do not hold.
absl::StatusOr<std::string> DtypeName(torch::ScalarType t);

// `tensors` (copied to the CPU as needed) as one safetensors file in memory.
// Errors: as DtypeName.
absl::StatusOr<std::string> EncodeSafetensors(const NamedTensors& tensors,
                                              const std::map<std::string, std::string>& metadata);

}  // namespace muster

#endif  // MUSTER_TRAINER_CHECKPOINT_STATE_TENSORS_H_
