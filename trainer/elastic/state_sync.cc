#include "trainer/elastic/state_sync.h"

#include <torch/torch.h>
#include <xxhash.h>

#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "trainer/comm/values.h"
#include "trainer/ddp/device_comm.h"

namespace muster {
namespace {

std::vector<torch::Tensor> Tensors(const NamedTensors& named) {
  std::vector<torch::Tensor> out;
  for (const auto& [name, t] : named) out.push_back(t);
  return out;
}

// The model, `optimizer` (the state's optimizer tensors) and extra tensors,
// in one order on every rank.
std::vector<torch::Tensor> StateTensors(const TrainingState& state,
                                        const NamedTensors& optimizer) {
  std::vector<torch::Tensor> out = Tensors(state.Model());
  for (const torch::Tensor& t : Tensors(optimizer)) out.push_back(t);
  for (const auto& [name, t] : state.tensors) out.push_back(t);
  return out;
}

}  // namespace

uint64_t StateDigest(const TrainingState& state, const std::vector<int64_t>& counters) {
  torch::NoGradGuard no_grad;
  XXH3_state_t* h = XXH3_createState();
  XXH3_64bits_reset(h);
  XXH3_64bits_update(h, counters.data(), counters.size() * sizeof(int64_t));
  for (const torch::Tensor& t : StateTensors(state, state.Optimizer())) {
    torch::Tensor c = t.detach().contiguous().cpu();
    XXH3_64bits_update(h, c.data_ptr(), static_cast<size_t>(c.numel()) * c.element_size());
  }
  for (const Blob& b : state.blobs) {
    const std::string bytes = b.save();
    XXH3_64bits_update(h, bytes.data(), bytes.size());
  }
  const uint64_t digest = XXH3_64bits_digest(h);
  XXH3_freeState(h);
  return digest;
}

absl::Status CheckSameDigest(uint64_t digest, Communicator* comm, absl::Time deadline) {
  // Eight byte-sized pieces x and their squares, summed exactly in float64:
  // all ranks agree iff n * sum(x^2) == sum(x)^2 for every piece
  // (Cauchy-Schwarz), and every rank computes the same verdict.
  double sums[17];
  for (int i = 0; i < 8; ++i) {
    const double x = static_cast<double>((digest >> (8 * i)) & 0xff);
    sums[i] = x;
    sums[8 + i] = x * x;
  }
  sums[16] = 1;
  MUSTER_RETURN_IF_ERROR(
      AllReduceValues(comm, sums, 17, DataType::kFloat64, ReduceOp::kSum, deadline));
  for (int i = 0; i < 8; ++i) {
    if (sums[16] * sums[8 + i] != sums[i] * sums[i]) {
      return absl::DataLossError("the ranks' training state differs after the state transfer");
    }
  }
  return absl::OkStatus();
}

absl::Status SyncStateFrom(int source, Communicator* comm, const TrainingState& state,
                           std::vector<int64_t>* counters, absl::Time deadline) {
  // The source's counter count first (the counters may differ in length:
  // they end with the sampler's returned examples), then the counters with
  // the source's blob sizes.
  int64_t count = static_cast<int64_t>(counters->size());
  MUSTER_RETURN_IF_ERROR(BroadcastValues(comm, &count, 1, DataType::kInt64, source, deadline));
  if (count < 0 || count > (int64_t{1} << 30)) {
    return absl::DataLossError(absl::StrCat("state source sent ", count, " counters"));
  }
  counters->resize(static_cast<size_t>(count), 0);
  std::vector<std::string> blobs;
  for (const Blob& b : state.blobs) blobs.push_back(b.save());
  std::vector<int64_t> head = *counters;
  for (const std::string& b : blobs) head.push_back(static_cast<int64_t>(b.size()));
  MUSTER_RETURN_IF_ERROR(BroadcastValues(comm, head.data(), head.size(), DataType::kInt64,
                                         source, deadline));
  std::copy(head.begin(), head.begin() + counters->size(), counters->begin());
  // Every rank must hold the same set of optimizer tensors before the
  // broadcast (a newcomer has none yet): TrainingState::Optimizer sees to it.
  const NamedTensors optimizer_tensors = state.Optimizer();  // step tensors: read back below
  std::vector<torch::Tensor> tensors = StateTensors(state, optimizer_tensors);
  std::map<std::string, std::string> received;
  for (size_t i = 0; i < state.blobs.size(); ++i) {
    const size_t size = static_cast<size_t>(head[counters->size() + i]);
    blobs[i].resize(size);  // the source's size; its bytes arrive below
    tensors.push_back(BytesTensor(blobs[i]));
  }
  MUSTER_RETURN_IF_ERROR(BroadcastTensors(tensors, comm, source, deadline));
  for (size_t i = 0; i < state.blobs.size(); ++i) {
    received[state.blobs[i].name] = TensorBytes(tensors[tensors.size() - state.blobs.size() + i]);
  }
  if (state.optimizer != nullptr) {
    ApplyOptimizerSteps(*state.model, *state.optimizer, optimizer_tensors);
  }
  MUSTER_RETURN_IF_ERROR(state.LoadBlobs(received));
  return CheckSameDigest(StateDigest(state, *counters), comm, deadline);
}

}  // namespace muster
