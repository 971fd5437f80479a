// Clock: the seam through which every piece of domain logic reads time.
//
// Production code uses RealClock; unit tests use FakeClock (fake_clock.h) to
// drive timeouts without sleeping. Implementations must be thread-safe.
#ifndef MUSTER_COMMON_CLOCK_H_
#define MUSTER_COMMON_CLOCK_H_

#include "absl/time/time.h"

namespace muster {

class Clock {
 public:
  virtual ~Clock() = default;
  // The current time. Never goes backwards for one Clock object.
  virtual absl::Time Now() = 0;
};

// Wall-clock time from absl::Now(). Thread-safe.
class RealClock : public Clock {
 public:
  absl::Time Now() override;
  // A process-wide instance; never destroyed.
  static RealClock* Get();
};

}  // namespace muster

#endif  // MUSTER_COMMON_CLOCK_H_
