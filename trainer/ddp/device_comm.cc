#include "trainer/ddp/device_comm.h"

#include <torch/torch.h>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#ifdef MUSTER_TORCH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace muster {
namespace {

absl::StatusOr<DataType> DataTypeOf(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat: return DataType::kFloat32;
    case torch::kHalf: return DataType::kFloat16;
    case torch::kBFloat16: return DataType::kBFloat16;
    case torch::kDouble: return DataType::kFloat64;
    case torch::kLong: return DataType::kInt64;
    default: break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("no collective reduces tensors of type ", c10::toString(t)));
}

}  // namespace

torch::Device CommDevice(const Communicator& comm) {
  const MemorySpace m = comm.memory();
  if (m.is_host()) return torch::Device(torch::kCPU);
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(m.device));
}

namespace {

// `reduce` over the data of `tensor` in `comm`'s memory: the tensor itself
// when it lies there, else a copy there, copied back on success.
absl::Status OnCommMemory(Communicator* comm, const torch::Tensor& tensor,
                          const std::function<absl::Status(void*, size_t)>& reduce) {
  if (!tensor.is_contiguous()) {
    return absl::InvalidArgumentError("all-reduce of a tensor that is not contiguous");
  }
  const torch::Device device = CommDevice(*comm);
  if (tensor.device() == device) {
    return reduce(tensor.data_ptr(), static_cast<size_t>(tensor.numel()));
  }
  torch::NoGradGuard no_grad;
  torch::Tensor staged = tensor.to(device);
  absl::Status s = reduce(staged.data_ptr(), static_cast<size_t>(staged.numel()));
  if (s.ok()) tensor.copy_(staged);
  return s;
}

}  // namespace

absl::Status AllReduceTensor(Communicator* comm, const torch::Tensor& tensor, ReduceOp op,
                             absl::Time deadline) {
  auto type = DataTypeOf(tensor.scalar_type());
  if (!type.ok()) return type.status();
  return OnCommMemory(comm, tensor, [&](void* data, size_t count) {
    return comm->AllReduce(data, count, *type, op, deadline);
  });
}

absl::Status AllReduceGradientTensor(Communicator* comm, const torch::Tensor& tensor,
                                     ReduceOp op, absl::Time deadline) {
  if (tensor.scalar_type() != torch::kFloat) {
    return absl::InvalidArgumentError(absl::StrCat("gradients are float32 here, not ",
                                                   c10::toString(tensor.scalar_type())));
  }
  return OnCommMemory(comm, tensor, [&](void* data, size_t count) {
    return comm->AllReduceGradients(data, count, op, deadline);
  });
}

absl::Status ReduceScatterGradientTensor(Communicator* comm, const torch::Tensor& tensor,
                                         const std::vector<size_t>& counts, ReduceOp op,
                                         absl::Time deadline, bool columns) {
  if (tensor.scalar_type() != torch::kFloat) {
    return absl::InvalidArgumentError(absl::StrCat("gradients are float32 here, not ",
                                                   c10::toString(tensor.scalar_type())));
  }
  if (counts.size() != static_cast<size_t>(comm->size())) {
    return absl::InvalidArgumentError(absl::StrCat("reduce-scatter in ", counts.size(),
                                                   " segments over ", comm->size(), " ranks"));
  }
  size_t total = 0;
  for (size_t n : counts) total += n;
  if (total != static_cast<size_t>(tensor.numel())) {
    return absl::InvalidArgumentError(absl::StrCat("reduce-scatter of ", tensor.numel(),
                                                   " gradients in segments of ", total));
  }
  return OnCommMemory(comm, tensor, [&](void* data, size_t) {
    return columns ? comm->ReduceColumnsGradients(data, counts, op, deadline)
                   : comm->ReduceScatterGradients(data, counts, op, deadline);
  });
}

absl::Status BroadcastTensors(const std::vector<torch::Tensor>& tensors, Communicator* comm,
                              int root, absl::Time deadline, bool keep_equal, int64_t chunk) {
  // A world of one: the tensors already hold the root's bytes. Calling the
  // communicator would still cost a launch, and on the GPU a host wait for
  // every kernel queued before it (an NCCL communicator of one rank).
  if (comm->size() == 1 && root == 0) return absl::OkStatus();
  torch::NoGradGuard no_grad;
  // Any dtype: the tensors' bytes back to back, each padded to 8, travel as
  // 64-bit words (a broadcast copies; it never does arithmetic on them), in
  // rounds of at most `chunk` bytes through one buffer, so that a transfer
  // of the model costs a round's memory rather than the model's.
  const torch::Device device = CommDevice(*comm);
  std::vector<torch::Tensor> raw;  // each tensor's bytes (its own memory where it can)
  std::vector<int64_t> offsets;
  int64_t bytes = 0;
  for (const torch::Tensor& t : tensors) {
    raw.push_back(t.detach().contiguous().reshape({-1}).view(torch::kUInt8).to(device));
    offsets.push_back(bytes);
    bytes += raw.back().numel() + (8 - raw.back().numel() % 8) % 8;
  }
  if (bytes == 0) return absl::OkStatus();
  chunk = std::max<int64_t>(8, chunk / 8 * 8);
  torch::Tensor round = torch::empty({std::min(chunk, bytes)},
                                     torch::TensorOptions().dtype(torch::kUInt8).device(device));
  std::vector<char> written(tensors.size(), 0);
  for (int64_t lo = 0; lo < bytes; lo += chunk) {
    const int64_t hi = std::min(bytes, lo + chunk);
    torch::Tensor buffer = round.narrow(0, 0, hi - lo);
    buffer.zero_();
    // The part of tensor i in this round: its bytes [a, b), at buffer[a + offsets[i] - lo].
    auto part = [&](size_t i, int64_t* a, int64_t* b) {
      *a = std::max<int64_t>(0, lo - offsets[i]);
      *b = std::min<int64_t>(raw[i].numel(), hi - offsets[i]);
      return *a < *b;
    };
    int64_t a = 0, b = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (part(i, &a, &b)) {
        buffer.narrow(0, offsets[i] + a - lo, b - a).copy_(raw[i].narrow(0, a, b - a));
      }
    }
    MUSTER_RETURN_IF_ERROR(comm->Broadcast(buffer.data_ptr(), static_cast<size_t>((hi - lo) / 8),
                                           DataType::kInt64, root, deadline));
    std::vector<size_t> in_round;
    std::vector<torch::Tensor> got, own, ne;
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (!part(i, &a, &b)) continue;
      in_round.push_back(i);
      got.push_back(buffer.narrow(0, offsets[i] + a - lo, b - a));
      own.push_back(raw[i].narrow(0, a, b - a));
      if (keep_equal) ne.push_back(got.back().ne(own.back()).any());
    }
    // A rank that holds the source's bytes keeps its tensor untouched
    // (keep_equal): a graph built on it stays usable. One read back a round.
    const torch::Tensor differs =
        keep_equal && !ne.empty() ? torch::stack(ne).to(torch::kCPU) : torch::Tensor();
    for (size_t k = 0; k < in_round.size(); ++k) {
      if (differs.defined() && !differs[static_cast<int64_t>(k)].item<bool>()) continue;
      own[k].copy_(got[k]);
      written[in_round[k]] = 1;
    }
  }
  // Where the bytes were a copy (another device, not contiguous), the
  // tensor takes them whole.
  for (size_t i = 0; i < tensors.size(); ++i) {
    const torch::Tensor& t = tensors[i];
    if (!written[i] || t.numel() == 0) continue;
    if (raw[i].device() == t.device() && raw[i].data_ptr() == t.data_ptr()) continue;
    t.detach().copy_(raw[i].view(t.scalar_type()).view(t.sizes()));
  }
  return absl::OkStatus();
}

std::function<void*()> CurrentCudaStream(int device) {
#ifdef MUSTER_TORCH_CUDA
  return [device]() -> void* {
    return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
  };
#else
  (void)device;
  return nullptr;
#endif
}

int CudaDeviceForLocalRank(int local_rank) {
#ifdef MUSTER_TORCH_CUDA
  const int n = static_cast<int>(c10::cuda::device_count());
  if (n <= 0) return -1;
  return local_rank % n;
#else
  (void)local_rank;
  return -1;
#endif
}

StreamMark StreamMark::Record(const torch::Device& device) {
  StreamMark mark;
#ifdef MUSTER_TORCH_CUDA
  if (device.is_cuda()) {
    auto event = std::make_shared<at::cuda::CUDAEvent>();
    event->record(c10::cuda::getCurrentCUDAStream(device.index()));
    mark.event_ = event;
    mark.device_ = device.index();
  }
#else
  (void)device;
#endif
  return mark;
}

void StreamMark::WaitOnCurrentStream() const {
#ifdef MUSTER_TORCH_CUDA
  if (event_ == nullptr) return;
  static_cast<at::cuda::CUDAEvent*>(event_.get())
      ->block(c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_)));
#endif
}

}  // namespace muster
