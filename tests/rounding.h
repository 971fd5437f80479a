// A reference for the 16-bit gradient formats, computed in double without
// the kernels' code: what the tests of the casts, the reduction kernels and
// compressed all-reduces compare against.
#ifndef MUSTER_TESTS_ROUNDING_H_
#define MUSTER_TESTS_ROUNDING_H_

#include <algorithm>
#include <cmath>

namespace muster {

// `x` rounded to nearest, ties to even, to a binary format of `bits`
// significant bits, smallest normal exponent `min_exp` (below it subnormal
// steps) and largest finite value `max` (beyond it infinity).
inline double RoundTo(double x, int bits, int min_exp, double max) {
  if (x == 0 || !std::isfinite(x)) return x;
  int e = 0;
  std::frexp(x, &e);  // |x| = m 2^e, 1/2 <= m < 1: the leading bit is 2^(e-1)
  const double quantum = std::ldexp(1.0, std::max(e - 1, min_exp) - (bits - 1));
  const double r = std::nearbyint(x / quantum) * quantum;  // ties to even
  return std::fabs(r) > max ? std::copysign(INFINITY, x) : r;
}

}  // namespace muster

#endif  // MUSTER_TESTS_ROUNDING_H_
