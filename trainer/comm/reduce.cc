#include "trainer/comm/reduce.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace muster {

// The conversions, with internal linkage so that the loops below inline
// them (a function libmuster exports may be interposed, so calls to it from
// position-independent code are not inlined).
namespace {

float HalfBitsToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ff;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000 | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t FloatToHalfBits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000;
  const uint32_t abs = x & 0x7fffffff;
  if (abs >= 0x7f800000) return static_cast<uint16_t>(sign | 0x7c00 | (abs > 0x7f800000 ? 0x200 : 0));
  if (abs >= 0x477ff000) return static_cast<uint16_t>(sign | 0x7c00);  // overflow to inf
  if (abs < 0x38800000) {  // subnormal or zero in half
    const float af = std::fabs(f);
    const uint32_t m = static_cast<uint32_t>(std::nearbyint(af * 16777216.0f));  // 2^24
    return static_cast<uint16_t>(sign | m);
  }
  // Round to nearest even on the 13 dropped bits.
  const uint32_t rounded = abs + 0x0fff + ((abs >> 13) & 1);
  return static_cast<uint16_t>(sign | ((rounded - 0x38000000) >> 13));
}

float Bf16BitsToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Without a branch (both results made, one chosen), so that the loops over
// buffers that call it vectorize.
uint16_t FloatToBf16Bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t nan = (x >> 16) | 0x40;
  const uint32_t rounded = (x + 0x7fff + ((x >> 16) & 1)) >> 16;
  return static_cast<uint16_t>((x & 0x7fffffff) > 0x7f800000 ? nan : rounded);
}

}  // namespace

float HalfToFloat(uint16_t h) { return HalfBitsToFloat(h); }
uint16_t FloatToHalf(float f) { return FloatToHalfBits(f); }
float BFloat16ToFloat(uint16_t b) { return Bf16BitsToFloat(b); }
uint16_t FloatToBFloat16(float f) { return FloatToBf16Bits(f); }

namespace {

template <typename T>
void SumT(void* out, const void* a, const void* b, size_t n) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = x[i] + y[i];
}

template <float (*ToF)(uint16_t), uint16_t (*FromF)(float)>
void Sum16(void* out, const void* a, const void* b, size_t n) {
  uint16_t* o = static_cast<uint16_t*>(out);
  const uint16_t* x = static_cast<const uint16_t*>(a);
  const uint16_t* y = static_cast<const uint16_t*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = FromF(ToF(x[i]) + ToF(y[i]));
}

// Float32 accumulation, one rounding: a block at a time through a float
// buffer small enough for the L1 cache.
template <float (*ToF)(uint16_t), uint16_t (*FromF)(float)>
void SumAll16(void* out, const void* a, const std::vector<const void*>& others, size_t n,
              int divisor) {
  constexpr size_t kBlock = 512;
  float acc[kBlock];
  uint16_t* o = static_cast<uint16_t*>(out);
  const uint16_t* x = static_cast<const uint16_t*>(a);
  for (size_t lo = 0; lo < n; lo += kBlock) {
    const size_t m = std::min(kBlock, n - lo);
    for (size_t i = 0; i < m; ++i) acc[i] = ToF(x[lo + i]);
    for (const void* other : others) {
      const uint16_t* y = static_cast<const uint16_t*>(other) + lo;
      for (size_t i = 0; i < m; ++i) acc[i] += ToF(y[i]);
    }
    if (divisor != 1) {
      for (size_t i = 0; i < m; ++i) acc[i] /= static_cast<float>(divisor);
    }
    for (size_t i = 0; i < m; ++i) o[lo + i] = FromF(acc[i]);
  }
}

}  // namespace

void SumAll(DataType type, void* out, const void* a, const std::vector<const void*>& others,
            size_t count, int divisor) {
  if (type == DataType::kFloat16) {
    return SumAll16<HalfBitsToFloat, FloatToHalfBits>(out, a, others, count, divisor);
  }
  if (type == DataType::kBFloat16) {
    return SumAll16<Bf16BitsToFloat, FloatToBf16Bits>(out, a, others, count, divisor);
  }
  const void* first = a;
  for (const void* other : others) {
    SumInto(type, out, first, other, count);
    first = out;
  }
  if (others.empty() && out != a) std::memcpy(out, a, count * DataTypeSize(type));
  if (divisor != 1) DivideBy(type, out, count, divisor);
}

void CompressFloats(DataType wire, const float* from, uint16_t* to, size_t count) {
  if (wire == DataType::kBFloat16) {
    for (size_t i = 0; i < count; ++i) to[i] = FloatToBf16Bits(from[i]);
  } else {
    for (size_t i = 0; i < count; ++i) to[i] = FloatToHalfBits(from[i]);
  }
}

void DecompressFloats(DataType wire, const uint16_t* from, float* to, size_t count) {
  if (wire == DataType::kBFloat16) {
    for (size_t i = 0; i < count; ++i) to[i] = Bf16BitsToFloat(from[i]);
  } else {
    for (size_t i = 0; i < count; ++i) to[i] = HalfBitsToFloat(from[i]);
  }
}

void SumInto(DataType type, void* out, const void* a, const void* b, size_t count) {
  switch (type) {
    case DataType::kFloat32: return SumT<float>(out, a, b, count);
    case DataType::kFloat64: return SumT<double>(out, a, b, count);
    case DataType::kInt64: return SumT<int64_t>(out, a, b, count);
    case DataType::kFloat16: return Sum16<HalfBitsToFloat, FloatToHalfBits>(out, a, b, count);
    case DataType::kBFloat16: return Sum16<Bf16BitsToFloat, FloatToBf16Bits>(out, a, b, count);
  }
}

void DivideBy(DataType type, void* data, size_t count, int divisor) {
  switch (type) {
    case DataType::kFloat32: {
      float* p = static_cast<float*>(data);
      const float inv = 1.0f / divisor;
      for (size_t i = 0; i < count; ++i) p[i] *= inv;
      return;
    }
    case DataType::kFloat64: {
      double* p = static_cast<double*>(data);
      for (size_t i = 0; i < count; ++i) p[i] /= divisor;
      return;
    }
    case DataType::kInt64: {
      int64_t* p = static_cast<int64_t*>(data);
      for (size_t i = 0; i < count; ++i) p[i] /= divisor;
      return;
    }
    case DataType::kFloat16: {
      uint16_t* p = static_cast<uint16_t*>(data);
      for (size_t i = 0; i < count; ++i) p[i] = FloatToHalfBits(HalfBitsToFloat(p[i]) / divisor);
      return;
    }
    case DataType::kBFloat16: {
      uint16_t* p = static_cast<uint16_t*>(data);
      for (size_t i = 0; i < count; ++i) p[i] = FloatToBf16Bits(Bf16BitsToFloat(p[i]) / divisor);
      return;
    }
  }
}

}  // namespace muster
