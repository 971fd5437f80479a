// The GPU side of the hierarchical composition: a host communicator behind
// pinned staging buffers, and the memory operations on device buffers.
#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "trainer/comm/hierarchical.h"
#include "trainer/comm/nccl/cuda_kernels.h"
#include "trainer/comm/nccl/nccl_communicator.h"
#include "trainer/comm/staged.h"

namespace muster {
namespace {

absl::Status CudaFailure(const char* what, cudaError_t e) {
  return absl::UnavailableError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

cudaStream_t CallerStream(const CallerStreamFn& fn) {
  return fn ? static_cast<cudaStream_t>(fn()) : cudaStream_t{nullptr};
}

// A pinned host buffer, kept and grown (to at least twice its size) when a
// collective needs more; never shrunk.
class PinnedBuffer {
 public:
  ~PinnedBuffer() {
    if (data_ != nullptr) cudaFreeHost(data_);
  }
  void* data() const { return data_; }
  absl::Status Reserve(size_t bytes) {
    if (bytes <= capacity_) return absl::OkStatus();
    const size_t want = std::max(bytes, capacity_ * 2);
    if (data_ != nullptr) cudaFreeHost(data_);
    data_ = nullptr;
    capacity_ = 0;
    if (cudaError_t e = cudaHostAlloc(&data_, want, cudaHostAllocDefault); e != cudaSuccess) {
      return CudaFailure("cudaHostAlloc", e);
    }
    capacity_ = want;
    return absl::OkStatus();
  }
  size_t capacity() const { return capacity_; }

 private:
  void* data_ = nullptr;
  size_t capacity_ = 0;
};

class CudaStaged : public Communicator {
 public:
  CudaStaged(std::unique_ptr<Communicator> host, int device, CallerStreamFn caller_stream)
      : host_(std::move(host)), device_(device), caller_stream_(std::move(caller_stream)) {}

  ~CudaStaged() override {
    cudaSetDevice(device_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (ready_ != nullptr) cudaEventDestroy(ready_);
    if (done_ != nullptr) cudaEventDestroy(done_);
  }

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  std::string name() const override { return host_->name(); }
  MemorySpace memory() const override { return MemorySpace::Cuda(device_); }

  absl::Status AllReduce(void* data, size_t count, DataType type, ReduceOp op,
                         absl::Time deadline) override {
    return Staged(data, count * DataTypeSize(type), [&](void* host) {
      return host_->AllReduce(host, count, type, op, deadline);
    });
  }

  absl::Status ReduceScatter(void* data, const std::vector<size_t>& counts, DataType type,
                             ReduceOp op, absl::Time deadline) override {
    if (absl::Status s = CheckCounts(counts, size()); !s.ok()) return s;
    return Staged(data, TotalCount(counts) * DataTypeSize(type), [&](void* host) {
      return host_->ReduceScatter(host, counts, type, op, deadline);
    });
  }

  absl::Status AllGather(void* data, const std::vector<size_t>& counts, DataType type,
                         absl::Time deadline) override {
    if (absl::Status s = CheckCounts(counts, size()); !s.ok()) return s;
    return Staged(data, TotalCount(counts) * DataTypeSize(type), [&](void* host) {
      return host_->AllGather(host, counts, type, deadline);
    });
  }

  absl::Status Broadcast(void* data, size_t count, DataType type, int root,
                         absl::Time deadline) override {
    return Staged(data, count * DataTypeSize(type), [&](void* host) {
      return host_->Broadcast(host, count, type, root, deadline);
    });
  }

  absl::Status Barrier(absl::Time deadline) override { return host_->Barrier(deadline); }
  std::vector<int> Unreachable() override { return host_->Unreachable(); }
  void Abort(const absl::Status& why) override { host_->Abort(why); }

 private:
  absl::Status Prepare(size_t bytes) {
    if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) {
      return CudaFailure("cudaSetDevice", e);
    }
    if (stream_ == nullptr) {
      if (cudaError_t e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
          e != cudaSuccess) {
        return CudaFailure("cudaStreamCreate", e);
      }
      cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming);
      cudaEventCreateWithFlags(&done_, cudaEventDisableTiming);
    }
    return pinned_.Reserve(bytes);
  }

  // Device -> pinned host after the caller's stream, `op` on the host copy,
  // pinned host -> device; the caller's stream then follows the copy back.
  absl::Status Staged(void* data, size_t bytes, const std::function<absl::Status(void*)>& op) {
    if (absl::Status s = Prepare(bytes); !s.ok()) {
      host_->Abort(s);
      return s;
    }
    const cudaStream_t caller = CallerStream(caller_stream_);
    cudaEventRecord(ready_, caller);
    cudaStreamWaitEvent(stream_, ready_, 0);
    cudaMemcpyAsync(pinned_.data(), data, bytes, cudaMemcpyDeviceToHost, stream_);
    if (cudaError_t e = cudaStreamSynchronize(stream_); e != cudaSuccess) {
      const absl::Status s = CudaFailure("copy to the staging buffer", e);
      host_->Abort(s);
      return s;
    }
    if (absl::Status s = op(pinned_.data()); !s.ok()) return s;
    cudaMemcpyAsync(data, pinned_.data(), bytes, cudaMemcpyHostToDevice, stream_);
    cudaEventRecord(done_, stream_);
    cudaStreamWaitEvent(caller, done_, 0);
    if (cudaError_t e = cudaStreamSynchronize(stream_); e != cudaSuccess) {
      const absl::Status s = CudaFailure("copy from the staging buffer", e);
      host_->Abort(s);
      return s;
    }
    return absl::OkStatus();
  }

  std::unique_ptr<Communicator> host_;
  const int device_;
  const CallerStreamFn caller_stream_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  cudaEvent_t done_ = nullptr;
  PinnedBuffer pinned_;
};

// Copies for the pipelined staging (staged.h): device -> pinned host on
// one stream, pinned host -> device on another, so the two directions
// overlap; an event per chunk tells the host when its chunk is in. The
// copies in follow the caller's stream; the caller's stream follows the
// copies back. The pinned buffer is reused: the next collective's copies in
// follow the caller's stream, which follows this one's copies back.
class CudaStagingCopies : public StagingCopies {
 public:
  CudaStagingCopies(int device, CallerStreamFn caller_stream)
      : device_(device), caller_stream_(std::move(caller_stream)) {}

  ~CudaStagingCopies() override {
    cudaSetDevice(device_);
    if (to_device_ != nullptr) cudaStreamSynchronize(to_device_);
    for (cudaEvent_t e : in_) cudaEventDestroy(e);
    if (ready_ != nullptr) cudaEventDestroy(ready_);
    if (done_ != nullptr) cudaEventDestroy(done_);
    if (to_host_ != nullptr) cudaStreamDestroy(to_host_);
    if (to_device_ != nullptr) cudaStreamDestroy(to_device_);
  }

  absl::StatusOr<void*> Begin(void* data, size_t bytes, size_t chunks) override {
    if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) {
      return CudaFailure("cudaSetDevice", e);
    }
    if (to_host_ == nullptr) {
      for (cudaStream_t* s : {&to_host_, &to_device_}) {
        if (cudaError_t e = cudaStreamCreateWithFlags(s, cudaStreamNonBlocking); e != cudaSuccess) {
          return CudaFailure("cudaStreamCreate", e);
        }
      }
      cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming);
      cudaEventCreateWithFlags(&done_, cudaEventDisableTiming);
    }
    while (in_.size() < chunks) {
      cudaEvent_t e = nullptr;
      if (cudaError_t r = cudaEventCreateWithFlags(&e, cudaEventDisableTiming); r != cudaSuccess) {
        return CudaFailure("cudaEventCreate", r);
      }
      in_.push_back(e);
    }
    if (bytes > pinned_.capacity()) {
      // The last collective's copies back may still read the old buffer.
      cudaStreamSynchronize(to_device_);
      MUSTER_RETURN_IF_ERROR(pinned_.Reserve(bytes));
    }
    data_ = static_cast<char*>(data);
    cudaEventRecord(ready_, CallerStream(caller_stream_));
    if (cudaError_t e = cudaStreamWaitEvent(to_host_, ready_, 0); e != cudaSuccess) {
      return CudaFailure("cudaStreamWaitEvent", e);
    }
    return pinned_.data();
  }

  absl::Status QueueToHost(size_t index, const StagedChunk& c) override {
    char* host = static_cast<char*>(pinned_.data());
    if (cudaError_t e = cudaMemcpyAsync(host + c.offset, data_ + c.offset, c.bytes,
                                        cudaMemcpyDeviceToHost, to_host_);
        e != cudaSuccess) {
      return CudaFailure("copy to the staging buffer", e);
    }
    if (cudaError_t e = cudaEventRecord(in_[index], to_host_); e != cudaSuccess) {
      return CudaFailure("cudaEventRecord", e);
    }
    return absl::OkStatus();
  }

  absl::Status WaitToHost(size_t index) override {
    if (cudaError_t e = cudaEventSynchronize(in_[index]); e != cudaSuccess) {
      return CudaFailure("copy to the staging buffer", e);
    }
    return absl::OkStatus();
  }

  absl::Status QueueToBuffer(size_t, const StagedChunk& c) override {
    const char* host = static_cast<const char*>(pinned_.data());
    if (cudaError_t e = cudaMemcpyAsync(data_ + c.offset, host + c.offset, c.bytes,
                                        cudaMemcpyHostToDevice, to_device_);
        e != cudaSuccess) {
      return CudaFailure("copy from the staging buffer", e);
    }
    return absl::OkStatus();
  }

  absl::Status Finish() override {
    cudaEventRecord(done_, to_device_);
    if (cudaError_t e = cudaStreamWaitEvent(CallerStream(caller_stream_), done_, 0);
        e != cudaSuccess) {
      return CudaFailure("cudaStreamWaitEvent", e);
    }
    return absl::OkStatus();
  }

 private:
  const int device_;
  const CallerStreamFn caller_stream_;
  cudaStream_t to_host_ = nullptr;
  cudaStream_t to_device_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  cudaEvent_t done_ = nullptr;
  std::vector<cudaEvent_t> in_;  // one per chunk
  PinnedBuffer pinned_;
  char* data_ = nullptr;
};

// Zero, divide, compress and widen on device memory, queued on the
// caller's stream, which every collective of the composition follows.
class CudaBufferOps : public BufferOps {
 public:
  CudaBufferOps(int device, CallerStreamFn caller_stream)
      : device_(device), caller_stream_(std::move(caller_stream)) {}
  ~CudaBufferOps() override {
    if (scratch_ == nullptr) return;
    cudaSetDevice(device_);
    cudaFree(scratch_);
  }

  absl::Status Zero(void* data, size_t bytes) override {
    if (bytes == 0) return absl::OkStatus();
    cudaSetDevice(device_);
    if (cudaError_t e = cudaMemsetAsync(data, 0, bytes, CallerStream(caller_stream_));
        e != cudaSuccess) {
      return CudaFailure("cudaMemsetAsync", e);
    }
    return absl::OkStatus();
  }

  absl::Status Divide(DataType type, void* data, size_t count, int divisor) override {
    cudaSetDevice(device_);
    if (cudaError_t e = CudaDivideBy(static_cast<int>(type), data, count, divisor,
                                     CallerStream(caller_stream_));
        e != cudaSuccess) {
      return CudaFailure("divide kernel", e);
    }
    return absl::OkStatus();
  }

  absl::Status Compress(DataType wire, const void* from, void* to, size_t count) override {
    cudaSetDevice(device_);
    if (cudaError_t e = CudaCompress(static_cast<int>(wire), static_cast<const float*>(from), to,
                                     count, CallerStream(caller_stream_));
        e != cudaSuccess) {
      return CudaFailure("compress kernel", e);
    }
    return absl::OkStatus();
  }

  absl::Status Decompress(DataType wire, const void* from, void* to, size_t count) override {
    cudaSetDevice(device_);
    if (cudaError_t e = CudaDecompress(static_cast<int>(wire), from, static_cast<float*>(to),
                                       count, CallerStream(caller_stream_));
        e != cudaSuccess) {
      return CudaFailure("decompress kernel", e);
    }
    return absl::OkStatus();
  }

  // Grown, never shrunk; cudaFree of the smaller one waits for the work
  // queued on it.
  absl::StatusOr<void*> Scratch(size_t bytes) override {
    if (bytes <= scratch_bytes_ && scratch_ != nullptr) return scratch_;
    if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) {
      return CudaFailure("cudaSetDevice", e);
    }
    if (scratch_ != nullptr) cudaFree(scratch_);
    scratch_ = nullptr;
    scratch_bytes_ = 0;
    if (cudaError_t e = cudaMalloc(&scratch_, std::max<size_t>(bytes, 256)); e != cudaSuccess) {
      scratch_ = nullptr;
      return CudaFailure("cudaMalloc of the compression buffer", e);
    }
    scratch_bytes_ = std::max<size_t>(bytes, 256);
    return scratch_;
  }

 private:
  const int device_;
  const CallerStreamFn caller_stream_;
  void* scratch_ = nullptr;  // compressed gradients
  size_t scratch_bytes_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> NewCudaStagedCommunicator(std::unique_ptr<Communicator> host,
                                                        int device,
                                                        CallerStreamFn caller_stream,
                                                        size_t chunk_bytes) {
  if (chunk_bytes > 0) {
    return NewPipelinedStagedCommunicator(
        std::move(host), std::make_unique<CudaStagingCopies>(device, caller_stream),
        MemorySpace::Cuda(device), chunk_bytes);
  }
  return std::make_unique<CudaStaged>(std::move(host), device, std::move(caller_stream));
}

absl::Status WithCudaCopy(int device, void* host, size_t bytes,
                          const std::function<absl::Status(void*)>& op) {
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    return CudaFailure("cudaSetDevice", e);
  }
  void* buffer = nullptr;
  if (cudaError_t e = cudaMalloc(&buffer, bytes); e != cudaSuccess) {
    return CudaFailure("cudaMalloc", e);
  }
  absl::Status s;
  if (cudaError_t e = cudaMemcpy(buffer, host, bytes, cudaMemcpyHostToDevice); e != cudaSuccess) {
    s = CudaFailure("cudaMemcpy", e);
  }
  if (s.ok()) s = op(buffer);
  if (s.ok()) {
    if (cudaError_t e = cudaMemcpy(host, buffer, bytes, cudaMemcpyDeviceToHost); e != cudaSuccess) {
      s = CudaFailure("cudaMemcpy", e);
    }
  }
  cudaFree(buffer);
  return s;
}

std::unique_ptr<BufferOps> NewCudaBufferOps(int device, CallerStreamFn caller_stream) {
  return std::make_unique<CudaBufferOps>(device, std::move(caller_stream));
}

}  // namespace muster
