// The host kernels of trainer/comm/reduce.h against references computed
// independently: values decoded from their bits and rounded once, in double,
// by the rounding of tests/rounding.h (round to nearest, ties to even).
#include "trainer/comm/reduce.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "tests/rounding.h"

namespace muster {
namespace {

struct Format {
  DataType type;
  int bits;
  int min_exp;
  double max;
  float (*decode)(uint16_t);
  uint16_t (*encode)(float);
  double Round(double x) const { return RoundTo(x, bits, min_exp, max); }
};
const Format kBf16{DataType::kBFloat16, 8, -126, std::ldexp(255.0, 120), BFloat16ToFloat,
                   FloatToBFloat16};
const Format kFp16{DataType::kFloat16, 11, -14, std::ldexp(2047.0, 5), HalfToFloat, FloatToHalf};

// IEEE binary16 from its fields, without the kernels' code.
double HalfValue(uint16_t h) {
  const int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  const double sign = (h & 0x8000) ? -1 : 1;
  if (exp == 0x1f) return mant == 0 ? sign * INFINITY : NAN;
  if (exp == 0) return sign * std::ldexp(mant, -24);
  return sign * std::ldexp(1024 + mant, exp - 25);
}

float FromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

TEST(ReduceKernelTest, EverySixteenBitValueDecodesExactlyAndRoundTrips) {
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const uint16_t h = static_cast<uint16_t>(b);
    const double half = HalfValue(h);
    if (std::isnan(half)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(h)));
    } else {
      ASSERT_EQ(HalfToFloat(h), half) << std::hex << b;
      ASSERT_EQ(FloatToHalf(HalfToFloat(h)), h) << std::hex << b;
    }
    const float bf = FromBits(b << 16);
    if (std::isnan(bf)) continue;
    ASSERT_EQ(BFloat16ToFloat(h), bf) << std::hex << b;
    ASSERT_EQ(FloatToBFloat16(bf), h) << std::hex << b;
  }
}

// Floats of every kind (random bits over the whole range, and exact ties
// halfway between two 16-bit values) compress as the reference rounds them,
// and widen back exactly.
TEST(ReduceKernelTest, CompressRoundsToNearestEvenAsTheReference) {
  std::mt19937 gen(7);
  std::vector<float> values = {65504.0f, 65519.0f, 65520.0f, 1e-8f, -3e-8f, 6.1e-5f, 0.0f,
                               -0.0f,    INFINITY, -INFINITY, 3.4e38f};
  for (int i = 0; i < 200000; ++i) values.push_back(FromBits(static_cast<uint32_t>(gen())));
  for (int i = 0; i < 2000; ++i) {
    values.push_back(FromBits((static_cast<uint32_t>(gen()) & 0xffff0000u) | 0x8000u));  // bf16 ties
    values.push_back(std::ldexp(static_cast<float>(2 * (gen() % 2048) + 1), -12));  // fp16 ties
  }
  values.erase(std::remove_if(values.begin(), values.end(), [](float v) { return std::isnan(v); }),
               values.end());
  for (const Format& f : {kBf16, kFp16}) {
    std::vector<uint16_t> packed(values.size());
    std::vector<float> back(values.size());
    CompressFloats(f.type, values.data(), packed.data(), values.size());
    DecompressFloats(f.type, packed.data(), back.data(), values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      ASSERT_EQ(back[i], static_cast<float>(f.Round(values[i])))
          << DataTypeName(f.type) << " of " << values[i];
      ASSERT_EQ(std::signbit(back[i]), std::signbit(values[i]));
    }
  }
}

// Inputs whose exact sums fit float32's 24 bits (16-bit values of
// magnitudes 2^-4..2^4, up to 8 of them): float32 accumulation is then
// exact, and one rounding of it is the reference rounding of the sum.
std::vector<std::vector<uint16_t>> Inputs(const Format& f, int k, size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(-4, 3);
  std::vector<std::vector<uint16_t>> in(k, std::vector<uint16_t>(n));
  for (auto& buffer : in) {
    for (uint16_t& h : buffer) {
      const float v = std::ldexp(mantissa(gen), exponent(gen));
      h = f.encode((gen() & 1) ? v : -v);
    }
  }
  return in;
}

TEST(ReduceKernelTest, HalfTypesAccumulateInFloat32AndRoundOnce) {
  const size_t n = 1500;  // blocks of 512 and a remainder
  for (const Format& f : {kBf16, kFp16}) {
    for (int k = 2; k <= 8; ++k) {
      // Divisions by 2, 4, 8 are exact in float32, so the quotient too is
      // rounded once; other divisors round the float32 quotient again.
      for (int divisor : {1, k & -k}) {
        const auto in = Inputs(f, k, n, 100 * k + divisor);
        std::vector<const void*> others;
        for (int j = 1; j < k; ++j) others.push_back(in[j].data());
        std::vector<uint16_t> out(n), chained = in[0];
        SumAll(f.type, out.data(), in[0].data(), others, n, divisor);
        for (const void* other : others) SumInto(f.type, chained.data(), chained.data(), other, n);
        size_t chained_differs = 0;
        for (size_t i = 0; i < n; ++i) {
          double sum = 0;
          for (int j = 0; j < k; ++j) sum += f.decode(in[j][i]);
          ASSERT_EQ(static_cast<double>(static_cast<float>(sum)), sum) << "inputs must fit";
          const double want = f.Round(sum / divisor);
          ASSERT_EQ(f.decode(out[i]), want) << DataTypeName(f.type) << " k=" << k << " i=" << i;
          chained_differs += divisor == 1 && f.decode(chained[i]) != want;
        }
        // Rounding after every add (what SumInto chained does) misses: the
        // test tells the two apart.
        if (divisor == 1 && k >= 3) {
          EXPECT_GT(chained_differs, 0u) << DataTypeName(f.type) << " k=" << k;
        }
      }
    }
  }
}

// float32, float64 and int64 add in order and divide as SumInto and DivideBy
// do, bit for bit; the output may be the first input.
TEST(ReduceKernelTest, WideTypesAddInOrderAsSumIntoDoes) {
  std::mt19937 gen(3);
  std::uniform_real_distribution<float> value(-100.0f, 100.0f);
  const size_t n = 777;
  std::vector<std::vector<float>> in(5, std::vector<float>(n));
  for (auto& b : in) {
    for (float& v : b) v = value(gen);
  }
  std::vector<const void*> others = {in[1].data(), in[2].data(), in[3].data(), in[4].data()};
  std::vector<float> want = in[0];
  for (const void* o : others) SumInto(DataType::kFloat32, want.data(), want.data(), o, n);
  DivideBy(DataType::kFloat32, want.data(), n, 5);
  std::vector<float> got = in[0];
  SumAll(DataType::kFloat32, got.data(), got.data(), others, n, 5);
  EXPECT_EQ(std::memcmp(got.data(), want.data(), n * 4), 0);

  std::vector<int64_t> a = {7, -3, 10}, b = {5, 6, -20}, out(3);
  SumAll(DataType::kInt64, out.data(), a.data(), {b.data()}, 3, 2);
  EXPECT_EQ(out, (std::vector<int64_t>{6, 1, -5}));
  SumAll(DataType::kInt64, out.data(), a.data(), {}, 3, 1);
  EXPECT_EQ(out, a);
}

}  // namespace
}  // namespace muster
