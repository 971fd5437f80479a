#include "trainer/elastic/state_sync.h"

#include <torch/torch.h>

#include "common/status_macros.h"
#include "trainer/checkpoint/state_tensors.h"
#include "trainer/ddp/gradient_sync.h"

namespace muster {

absl::Status CheckSameState(Communicator* comm, torch::nn::Module& model, absl::Time deadline) {
  std::vector<torch::Tensor> state;
  for (auto& [name, t] : ModelTensors(model)) state.push_back(t);
  // Equal on every rank exactly when the variance of the checksums is zero.
  double c[2] = {TensorChecksum(state), 0};
  c[1] = c[0] * c[0];
  MUSTER_RETURN_IF_ERROR(comm->AllReduce(c, 2, DataType::kFloat64, ReduceOp::kAverage, deadline));
  if (c[1] - c[0] * c[0] > 1e-9 * std::max(1.0, c[1])) {
    return absl::DataLossError("the ranks' parameters differ after the state transfer");
  }
  return absl::OkStatus();
}

absl::Status SyncStateFrom(int source, Communicator* comm, torch::nn::Module& model,
                           torch::optim::Optimizer& optimizer, std::vector<int64_t>* counters,
                           absl::Time deadline) {
  MUSTER_RETURN_IF_ERROR(comm->Broadcast(counters->data(), counters->size(), DataType::kInt64,
                                         source, deadline));
  // Every rank must hold the same set of optimizer tensors before the
  // broadcast (a newcomer has none yet).
  EnsureOptimizerState(model, optimizer);
  std::vector<torch::Tensor> state;
  for (auto& [name, t] : ModelTensors(model)) state.push_back(t);
  const NamedTensors optimizer_tensors = OptimizerTensors(model, optimizer);
  for (auto& [name, t] : optimizer_tensors) state.push_back(t);
  MUSTER_RETURN_IF_ERROR(BroadcastTensors(state, comm, source, deadline));
  ApplyOptimizerSteps(model, optimizer, optimizer_tensors);
  return CheckSameState(comm, model, deadline);
}

}  // namespace muster
