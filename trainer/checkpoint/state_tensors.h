// The named tensors that make up a trainer's state: model parameters and
// buffers, and the optimizer's per-parameter state. Shared by checkpoints
// and by the state transfer after a regroup.
#ifndef MUSTER_TRAINER_CHECKPOINT_STATE_TENSORS_H_
#define MUSTER_TRAINER_CHECKPOINT_STATE_TENSORS_H_

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "absl/status/statusor.h"
#include "muster/optimizer_codec.h"

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace muster {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// "param.<prefix><name>" for parameters, "buffer.<prefix><name>" for
// buffers. A tensor registered under several names (a tied weight: the
// output projection registering the token embedding's) comes once, under
// the name LibTorch lists first.
NamedTensors ModelTensors(torch::nn::Module& model, const std::string& prefix = "");
// The model's parameters by name, each tensor once (as above).
NamedTensors NamedParameters(torch::nn::Module& model);
// `tensors` with each tensor (by TensorImpl) kept at its first name only.
NamedTensors EachTensorOnce(NamedTensors tensors);
// "<param>.<field>": the fields `codec` saves of the state of each of
// `params` (by name) that `optimizer` holds (optimizer_codecs.h names
// LibTorch's).
NamedTensors OptimizerTensors(const NamedTensors& params, torch::optim::Optimizer& optimizer,
                              const OptimizerCodec& codec);
// Gives every parameter without optimizer state the codec's Initial, so
// that every rank holds the same set of state tensors.
void EnsureOptimizerState(torch::optim::Optimizer& optimizer, const OptimizerCodec& codec);
// Installs `state` as the optimizer state of `param` (LibTorch keys it by
// the parameter's TensorImpl, as a pointer in 2.x and as a string in 1.13).
void PutOptimizerState(torch::optim::Optimizer& optimizer, const torch::Tensor& param,
                       std::unique_ptr<torch::optim::OptimizerParamState> state);
// The optimizer state of `param`, or null when it has none.
torch::optim::OptimizerParamState* FindOptimizerState(torch::optim::Optimizer& optimizer,
                                                      const torch::Tensor& param);
// Drops the optimizer state of `param` (none: nothing happens).
void EraseOptimizerState(torch::optim::Optimizer& optimizer, const torch::Tensor& param);
// The options of the group that holds `param` (null: none does).
const torch::optim::OptimizerOptions* GroupOptionsOf(const torch::optim::Optimizer& optimizer,
                                                      const torch::Tensor& param);
// Loads tensors named as OptimizerTensors names them into each parameter's
// existing state (after a transfer: scalars such as step counts come as
// fresh tensors). Errors: the codec's.
absl::Status LoadOptimizerTensors(const NamedTensors& params, torch::optim::Optimizer& optimizer,
                                  const OptimizerCodec& codec, const NamedTensors& tensors);

// The safetensors name of a LibTorch dtype ("F32", "BF16", "I64", ...).
// Errors: INVALID_ARGUMENT for a dtype safetensors files here do not hold.
absl::StatusOr<std::string> DtypeName(torch::ScalarType t);

// DtypeName's inverse. INVALID_ARGUMENT naming a dtype it does not give.
absl::StatusOr<torch::ScalarType> DtypeFromName(const std::string& name);

// `tensors` (copied to the CPU as needed) as one safetensors file in memory.
// Errors: as DtypeName.
absl::StatusOr<std::string> EncodeSafetensors(const NamedTensors& tensors,
                                              const std::map<std::string, std::string>& metadata);

}  // namespace muster

#endif  // MUSTER_TRAINER_CHECKPOINT_STATE_TENSORS_H_
