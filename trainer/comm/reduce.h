// Element-wise reduction kernels on host memory for every DataType
// (float16 and bfloat16 are accumulated in float32 per element).
// Stateless; thread-safe.
#ifndef MUSTER_TRAINER_COMM_REDUCE_H_
#define MUSTER_TRAINER_COMM_REDUCE_H_

#include <cstddef>

#include "trainer/comm/communicator.h"

namespace muster {

// out[i] = a[i] + b[i] for `count` elements; `out` may alias `a` or `b`.
void SumInto(DataType type, void* out, const void* a, const void* b, size_t count);

// data[i] /= divisor (integer division for kInt64).
void DivideBy(DataType type, void* data, size_t count, int divisor);

// Conversions used by tests and kernels.
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
float BFloat16ToFloat(uint16_t b);
uint16_t FloatToBFloat16(float f);

}  // namespace muster

#endif  // MUSTER_TRAINER_COMM_REDUCE_H_
