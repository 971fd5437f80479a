#include "trainer/ddp/buffer_sync.h"

#include <torch/torch.h>

#include "common/status_macros.h"
#include "trainer/comm/values.h"
#include "trainer/ddp/device_comm.h"

namespace muster {

BufferSync::BufferSync(std::vector<Holder> holders) : holders_(std::move(holders)) { Settle(); }

std::vector<BufferSync::Holder> BufferSync::HoldersOf(
    const std::vector<torch::nn::Module*>& modules) {
  std::vector<Holder> out;
  const auto add = [&out](const torch::nn::Module& m) {
    Holder h{&m, {}};
    for (const auto& b : m.named_buffers(/*recurse=*/false)) h.buffers.push_back(b.value());
    if (!h.buffers.empty()) out.push_back(std::move(h));
  };
  for (torch::nn::Module* m : modules) {
    add(*m);
    for (const auto& child : m->named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
      add(*child.value());
    }
  }
  return out;
}

void BufferSync::Settle() {
  versions_.assign(holders_.size(), {});
  for (size_t i = 0; i < holders_.size(); ++i) {
    for (const torch::Tensor& b : holders_[i].buffers) versions_[i].push_back(b._version());
  }
}

absl::Status BufferSync::Sync(Communicator* comm, int root, absl::Time deadline) {
  if (holders_.empty() || comm->size() == 1) {
    owed_root_ = -1;
    Settle();
    return absl::OkStatus();
  }
  std::vector<int64_t> changed(holders_.size(), 1);
  if (owed_root_ >= 0) {
    root = owed_root_;  // every rank owes them all, from the same root
  } else {
    for (size_t i = 0; i < holders_.size(); ++i) {
      bool moved = holders_[i].module->is_training();
      for (size_t j = 0; j < holders_[i].buffers.size() && !moved; ++j) {
        moved = holders_[i].buffers[j]._version() != versions_[i][j];
      }
      changed[i] = moved ? 1 : 0;
    }
    MUSTER_RETURN_IF_ERROR(AllReduceValues(comm, changed.data(), changed.size(),
                                           DataType::kInt64, ReduceOp::kSum, deadline));
  }
  std::vector<torch::Tensor> send;
  for (size_t i = 0; i < holders_.size(); ++i) {
    if (changed[i] == 0) continue;
    for (const torch::Tensor& b : holders_[i].buffers) send.push_back(b);
  }
  if (!send.empty()) {
    torch::NoGradGuard no_grad;
    MUSTER_RETURN_IF_ERROR(BroadcastTensors(send, comm, root, deadline));
  }
  owed_root_ = -1;
  Settle();
  return absl::OkStatus();
}

}  // namespace muster
