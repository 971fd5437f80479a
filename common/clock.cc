#include "common/clock.h"

#include <algorithm>

#include "absl/time/clock.h"

namespace muster {
namespace {

// The wall time and the steady clock's reading at the anchor, taken once.
struct Anchor {
  absl::Time wall;
  std::chrono::steady_clock::time_point steady;
};

const Anchor& ProcessAnchor() {
  static const Anchor anchor{absl::Now(), std::chrono::steady_clock::now()};
  return anchor;
}

}  // namespace

absl::Time RealClock::Now() {
  const Anchor& anchor = ProcessAnchor();
  return anchor.wall + absl::FromChrono(std::chrono::steady_clock::now() - anchor.steady);
}

absl::Time RealClock::WallNow() { return absl::Now(); }

RealClock* RealClock::Get() {
  static RealClock* clock = new RealClock();
  return clock;
}

absl::Duration Remaining(absl::Time deadline, Clock* clock) {
  if (deadline == absl::InfiniteFuture()) return absl::InfiniteDuration();
  return std::max(deadline - clock->Now(), absl::ZeroDuration());
}

std::chrono::system_clock::time_point SystemDeadline(absl::Time deadline, Clock* clock) {
  const absl::Duration left = Remaining(deadline, clock);
  const auto now = std::chrono::system_clock::now();
  // Beyond what a time_point holds: as good as never.
  if (left >= absl::Hours(24 * 365 * 100)) return std::chrono::system_clock::time_point::max();
  return now + std::chrono::duration_cast<std::chrono::system_clock::duration>(
                   absl::ToChronoNanoseconds(left));
}

}  // namespace muster
