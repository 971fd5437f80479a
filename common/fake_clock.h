// FakeClock: a Clock whose time moves only when a test moves it.
//
// Both readings start at `start`. Advance() moves both, as time passing
// does; StepWall() moves only the wall reading, as an NTP step or a VM
// resume does. Thread-safe.
#ifndef MUSTER_COMMON_FAKE_CLOCK_H_
#define MUSTER_COMMON_FAKE_CLOCK_H_

#include "absl/synchronization/mutex.h"
#include "common/clock.h"

namespace muster {

class FakeClock : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'700'000'000))
      : now_(start), wall_(start) {}

  absl::Time Now() override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  absl::Time WallNow() override {
    absl::MutexLock lock(&mu_);
    return wall_;
  }
  // Time passes: both readings move forward by `d` (which must not be
  // negative).
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
    wall_ += d;
  }
  // The wall clock steps by `d` (either sign); Now() does not move.
  void StepWall(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    wall_ += d;
  }

 private:
  absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
  absl::Time wall_ ABSL_GUARDED_BY(mu_);
};

}  // namespace muster

#endif  // MUSTER_COMMON_FAKE_CLOCK_H_
