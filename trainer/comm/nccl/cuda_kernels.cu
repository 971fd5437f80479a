#include "trainer/comm/nccl/cuda_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace muster {
namespace {

template <typename T>
__device__ T Divided(T v, int d) {
  return v / static_cast<T>(d);
}
template <>
__device__ __half Divided(__half v, int d) {
  return __float2half(__half2float(v) / static_cast<float>(d));
}
template <>
__device__ __nv_bfloat16 Divided(__nv_bfloat16 v, int d) {
  return __float2bfloat16(__bfloat162float(v) / static_cast<float>(d));
}

template <typename T>
__global__ void DivideKernel(T* data, size_t count, int divisor) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    data[i] = Divided(data[i], divisor);
  }
}

template <typename T>
cudaError_t Launch(void* data, size_t count, int divisor, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  const int threads = 256;
  const size_t wanted = (count + threads - 1) / threads;
  const int blocks = static_cast<int>(wanted < 4096 ? wanted : 4096);
  DivideKernel<T><<<blocks, threads, 0, stream>>>(static_cast<T*>(data), count, divisor);
  return cudaGetLastError();
}

}  // namespace

cudaError_t CudaDivideBy(int type, void* data, size_t count, int divisor, cudaStream_t stream) {
  switch (type) {
    case 0: return Launch<float>(data, count, divisor, stream);
    case 1: return Launch<__half>(data, count, divisor, stream);
    case 2: return Launch<__nv_bfloat16>(data, count, divisor, stream);
    case 3: return Launch<double>(data, count, divisor, stream);
    case 4: return Launch<int64_t>(data, count, divisor, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace muster
