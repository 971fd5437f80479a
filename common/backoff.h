// Backoff: exponential delays with full jitter for retrying UNAVAILABLE calls.
//
// Not thread-safe: one Backoff per retry loop.
#ifndef MUSTER_COMMON_BACKOFF_H_
#define MUSTER_COMMON_BACKOFF_H_

#include <cstdint>

#include "absl/random/random.h"
#include "absl/time/time.h"

namespace muster {

struct BackoffOptions {
  absl::Duration initial = absl::Milliseconds(50);
  absl::Duration max = absl::Seconds(5);
  double multiplier = 2.0;
};

class Backoff {
 public:
  explicit Backoff(BackoffOptions options = {}, uint64_t seed = 0);
  // The delay before the next attempt: uniform in [ceiling/2, ceiling], where
  // the ceiling grows by `multiplier` per call up to `max`.
  absl::Duration Next();
  // Starts again from `initial` (after a success).
  void Reset();
  int attempts() const { return attempts_; }

 private:
  BackoffOptions options_;
  absl::Duration ceiling_;
  int attempts_ = 0;
  absl::BitGen gen_;
};

}  // namespace muster

#endif  // MUSTER_COMMON_BACKOFF_H_
