// The element-wise kernels the GPU compositions need (plain C++ API; the
// kernels are compiled by nvcc in cuda_kernels.cu).
#ifndef MUSTER_TRAINER_COMM_NCCL_CUDA_KERNELS_H_
#define MUSTER_TRAINER_COMM_NCCL_CUDA_KERNELS_H_

#include <cuda_runtime.h>

#include <cstddef>

namespace muster {

// data[i] /= divisor for `count` elements of `type` (the DataType's value:
// 0 float32, 1 float16, 2 bfloat16, 3 float64, 4 int64), queued on `stream`.
// Half types divide in float32 and round once, as the host path does.
cudaError_t CudaDivideBy(int type, void* data, size_t count, int divisor, cudaStream_t stream);

// Gradient compression, queued on `stream`: to[i] = from[i] rounded to
// nearest even in `wire` (1 float16, 2 bfloat16: the DataType's value), as
// the host's CompressFloats does; and back, widened to float32 (exact).
// `from` and `to` do not overlap. cudaErrorInvalidValue for another wire.
cudaError_t CudaCompress(int wire, const float* from, void* to, size_t count,
                         cudaStream_t stream);
cudaError_t CudaDecompress(int wire, const void* from, float* to, size_t count,
                           cudaStream_t stream);

}  // namespace muster

#endif  // MUSTER_TRAINER_COMM_NCCL_CUDA_KERNELS_H_
