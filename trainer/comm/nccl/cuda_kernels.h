// The one element-wise kernel the GPU compositions need (plain C++ API; the
// kernel is compiled by nvcc in cuda_kernels.cu).
#ifndef MUSTER_TRAINER_COMM_NCCL_CUDA_KERNELS_H_
#define MUSTER_TRAINER_COMM_NCCL_CUDA_KERNELS_H_

#include <cuda_runtime.h>

#include <cstddef>

namespace muster {

// data[i] /= divisor for `count` elements of `type` (the DataType's value:
// 0 float32, 1 float16, 2 bfloat16, 3 float64, 4 int64), queued on `stream`.
// Half types divide in float32 and round once, as the host path does.
cudaError_t CudaDivideBy(int type, void* data, size_t count, int divisor, cudaStream_t stream);

}  // namespace muster

#endif  // MUSTER_TRAINER_COMM_NCCL_CUDA_KERNELS_H_
