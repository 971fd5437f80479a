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

__device__ void Narrow(float v, __half* out) { *out = __float2half_rn(v); }
__device__ void Narrow(float v, __nv_bfloat16* out) { *out = __float2bfloat16_rn(v); }
__device__ float Widen(__half v) { return __half2float(v); }
__device__ float Widen(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__global__ void CompressKernel(const float* from, T* to, size_t count) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    Narrow(from[i], &to[i]);
  }
}

template <typename T>
__global__ void DecompressKernel(const T* from, float* to, size_t count) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    to[i] = Widen(from[i]);
  }
}

int Blocks(size_t count, int threads) {
  const size_t wanted = (count + threads - 1) / threads;
  return static_cast<int>(wanted < 4096 ? wanted : 4096);
}

}  // namespace

cudaError_t CudaCompress(int wire, const float* from, void* to, size_t count,
                         cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  const int threads = 256;
  switch (wire) {
    case 1:
      CompressKernel<<<Blocks(count, threads), threads, 0, stream>>>(
          from, static_cast<__half*>(to), count);
      return cudaGetLastError();
    case 2:
      CompressKernel<<<Blocks(count, threads), threads, 0, stream>>>(
          from, static_cast<__nv_bfloat16*>(to), count);
      return cudaGetLastError();
  }
  return cudaErrorInvalidValue;
}

cudaError_t CudaDecompress(int wire, const void* from, float* to, size_t count,
                           cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  const int threads = 256;
  switch (wire) {
    case 1:
      DecompressKernel<<<Blocks(count, threads), threads, 0, stream>>>(
          static_cast<const __half*>(from), to, count);
      return cudaGetLastError();
    case 2:
      DecompressKernel<<<Blocks(count, threads), threads, 0, stream>>>(
          static_cast<const __nv_bfloat16*>(from), to, count);
      return cudaGetLastError();
  }
  return cudaErrorInvalidValue;
}

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
