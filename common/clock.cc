#include "common/clock.h"

#include "absl/time/clock.h"

namespace muster {

absl::Time RealClock::Now() { return absl::Now(); }

RealClock* RealClock::Get() {
  static RealClock* clock = new RealClock();
  return clock;
}

}  // namespace muster
