// Raises an atomic watermark to `value` if that is higher, in one
// compare-and-swap loop (a load and a store would let a lower value that
// races a higher one win).
#ifndef MUSTER_COMMON_ATOMIC_MAX_H_
#define MUSTER_COMMON_ATOMIC_MAX_H_

#include <atomic>

namespace muster {

// Returns the watermark as it was before (so `value` >= it means raised or
// equal).
template <typename T>
T RaiseTo(std::atomic<T>& watermark, typename std::atomic<T>::value_type value) {
  T seen = watermark.load();
  while (value > seen && !watermark.compare_exchange_weak(seen, value)) {
  }
  return seen;
}

}  // namespace muster

#endif  // MUSTER_COMMON_ATOMIC_MAX_H_
