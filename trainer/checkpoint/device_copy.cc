#include "trainer/checkpoint/device_copy.h"

#include <torch/torch.h>

#include <cstring>

#ifdef MUSTER_TORCH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#endif

namespace muster {

#ifdef MUSTER_TORCH_CUDA
struct DeviceCopier::Cuda {
  int device = -1;
  cudaStream_t side = nullptr;
  cudaEvent_t start = nullptr;   // the training stream reached the snapshot
  cudaEvent_t early = nullptr;   // buffers and extras copied
  cudaEvent_t copied = nullptr;  // everything copied
  void* pinned = nullptr;
  bool pending = false;  // a snapshot whose copies the training stream has not waited for
  bool any = false;      // this snapshot copied device memory

  ~Cuda() {
    if (pinned != nullptr) cudaHostUnregister(pinned);
    if (device < 0) return;
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    cudaEventDestroy(start);
    cudaEventDestroy(early);
    cudaEventDestroy(copied);
    cudaStreamDestroy(side);
  }

  void Init(int d) {
    if (device >= 0) return;
    device = d;
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(d));
    cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
    cudaEventCreate(&start);
    cudaEventCreateWithFlags(&early, cudaEventDisableTiming);
    cudaEventCreate(&copied);
  }

  cudaStream_t Training() const {
    return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
  }
};
#else
struct DeviceCopier::Cuda {};
#endif

DeviceCopier::DeviceCopier() : cuda_(std::make_unique<Cuda>()) {}
DeviceCopier::~DeviceCopier() = default;

void DeviceCopier::Pin(void* data, size_t bytes) {
#ifdef MUSTER_TORCH_CUDA
  Unpin();
  if (!torch::cuda::is_available()) return;
  if (cudaHostRegister(data, bytes, cudaHostRegisterDefault) == cudaSuccess) {
    cuda_->pinned = data;
  } else {
    cudaGetLastError();  // unpinned copies still work, only slower
  }
#else
  (void)data;
  (void)bytes;
#endif
}

void DeviceCopier::Unpin() {
#ifdef MUSTER_TORCH_CUDA
  if (cuda_->pinned != nullptr) cudaHostUnregister(cuda_->pinned);
  cuda_->pinned = nullptr;
#endif
}

void DeviceCopier::Begin(const torch::Device& device) {
  device_bytes_ = 0;
  keep_.clear();
#ifdef MUSTER_TORCH_CUDA
  cuda_->any = false;
  if (!device.is_cuda()) return;
  cuda_->Init(device.index());
  c10::cuda::CUDAGuard guard(device.index());
  cudaEventRecord(cuda_->start, cuda_->Training());
  cudaStreamWaitEvent(cuda_->side, cuda_->start, 0);
  cudaEventRecord(cuda_->start, cuda_->side);  // the copies' clock starts here
  cuda_->any = true;
#else
  (void)device;
#endif
}

void DeviceCopier::Copy(void* dst, const torch::Tensor& t) {
  const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
  if (bytes == 0) return;
#ifdef MUSTER_TORCH_CUDA
  if (t.is_cuda() && cuda_->any && t.device().index() == cuda_->device) {
    keep_.push_back(t);
    cudaMemcpyAsync(dst, t.data_ptr(), bytes, cudaMemcpyDeviceToHost, cuda_->side);
    device_bytes_ += bytes;
    return;
  }
#endif
  torch::Tensor c = t.is_cpu() ? t : t.cpu();
  std::memcpy(dst, c.data_ptr(), bytes);
}

void DeviceCopier::MarkEarly() {
#ifdef MUSTER_TORCH_CUDA
  if (!cuda_->any) return;
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(cuda_->device));
  cudaEventRecord(cuda_->early, cuda_->side);
  cudaStreamWaitEvent(cuda_->Training(), cuda_->early, 0);
#endif
}

void DeviceCopier::End() {
#ifdef MUSTER_TORCH_CUDA
  if (!cuda_->any) return;
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(cuda_->device));
  cudaEventRecord(cuda_->copied, cuda_->side);
  cuda_->pending = true;
#endif
}

void DeviceCopier::BeforeUpdate() {
#ifdef MUSTER_TORCH_CUDA
  if (!cuda_->pending) return;
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(cuda_->device));
  cudaStreamWaitEvent(cuda_->Training(), cuda_->copied, 0);
  cuda_->pending = false;
#endif
}

double DeviceCopier::WaitCopied() {
#ifdef MUSTER_TORCH_CUDA
  if (!cuda_->any) return 0;
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(cuda_->device));
  cudaEventSynchronize(cuda_->copied);
  float ms = 0;
  cudaEventElapsedTime(&ms, cuda_->start, cuda_->copied);
  return ms / 1e3;
#else
  return 0;
#endif
}

}  // namespace muster
