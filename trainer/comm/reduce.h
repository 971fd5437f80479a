// Element-wise reduction kernels on host memory for every DataType
// (float16 and bfloat16 are accumulated in float32 per element), and the
// float32 <-> float16/bfloat16 conversions of gradient compression.
// Stateless; thread-safe.
#ifndef MUSTER_TRAINER_COMM_REDUCE_H_
#define MUSTER_TRAINER_COMM_REDUCE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "trainer/comm/communicator.h"

namespace muster {

// out[i] = a[i] + b[i] for `count` elements; `out` may alias `a` or `b`.
void SumInto(DataType type, void* out, const void* a, const void* b, size_t count);

// data[i] /= divisor (integer division for kInt64).
void DivideBy(DataType type, void* data, size_t count, int divisor);

// out[i] = (a[i] + others[0][i] + others[1][i] + ...) / divisor for `count`
// elements (divisor 1: no division); `out` may alias `a`, not `others`.
// float16 and bfloat16 are accumulated in float32, divided there, and
// rounded to their type once. The other types add in that order and then
// divide, exactly as SumInto once per input and then DivideBy would.
void SumAll(DataType type, void* out, const void* a, const std::vector<const void*>& others,
            size_t count, int divisor);

// Gradient compression: to[i] = from[i] rounded to nearest (ties to even)
// in `wire`, kFloat16 or kBFloat16 (overflow gives infinity, NaN stays
// NaN); and back, to[i] = from[i] widened to float32, which is exact.
void CompressFloats(DataType wire, const float* from, uint16_t* to, size_t count);
void DecompressFloats(DataType wire, const uint16_t* from, float* to, size_t count);

// Conversions used by tests and kernels.
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
float BFloat16ToFloat(uint16_t b);
uint16_t FloatToBFloat16(float f);

}  // namespace muster

#endif  // MUSTER_TRAINER_COMM_REDUCE_H_
