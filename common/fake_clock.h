// FakeClock: a Clock whose time moves only when a test advances it.
// Thread-safe.
#ifndef MUSTER_COMMON_FAKE_CLOCK_H_
#define MUSTER_COMMON_FAKE_CLOCK_H_

#include "absl/synchronization/mutex.h"
#include "common/clock.h"

namespace muster {

class FakeClock : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'700'000'000))
      : now_(start) {}

  absl::Time Now() override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  // Moves time forward by `d` (which must not be negative).
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace muster

#endif  // MUSTER_COMMON_FAKE_CLOCK_H_
