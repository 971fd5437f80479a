// Waits that keep to the monotonic clock.
//
// Debian's Abseil (20220623) turns every timed wait (Mutex::AwaitWithTimeout,
// Notification::WaitForNotificationWithTimeout, CondVar::WaitWithTimeout)
// into an absolute CLOCK_REALTIME deadline for the kernel: a wall clock set
// back by a minute during such a wait makes it last a minute longer, which
// would stall the coordinator's ticker (heartbeat expiry) or a node's
// heartbeats for that minute. The waits here sleep for relative durations
// instead (nanosleep, which the kernel measures on CLOCK_MONOTONIC), and
// leave absl's untimed waits to do the waking.
//
// Thread-safety: each function is safe to call from any thread; a
// MutexPoker is used by the thread that created it.
#ifndef MUSTER_COMMON_MONOTONIC_WAIT_H_
#define MUSTER_COMMON_MONOTONIC_WAIT_H_

#include <atomic>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace muster {

// Sleeps for `period`, or until `stop` is notified (noticed within `poll`).
// True when `stop` was notified.
bool SleepUnlessNotified(const absl::Notification& stop, absl::Duration period,
                         absl::Duration poll = absl::Milliseconds(10));

// While it lives, a thread locks and unlocks `mu` every `period`, so that
// absl evaluates the conditions of `mu`'s waiters at least that often: an
// untimed mu->Await() whose condition includes `clock->Now() >= deadline`
// then returns within `period` of that deadline on the monotonic clock.
// Destroy it without holding `mu` (the destructor joins the thread, which
// may be waiting for `mu`).
class MutexPoker {
 public:
  MutexPoker(absl::Mutex* mu, absl::Duration period);
  ~MutexPoker();
  MutexPoker(const MutexPoker&) = delete;
  MutexPoker& operator=(const MutexPoker&) = delete;

 private:
  std::atomic<bool> done_{false};
  std::thread thread_;
};

// With `mu` held (exclusively): waits until `cond` holds, true, or until
// `timeout` has passed on `clock` (noticed within `poll`), false; `mu` is
// released while waiting and held again on return. For waits that are
// rare (each starts a thread); `cond` is evaluated under `mu`. `clock`:
// the caller's.
bool AwaitFor(absl::Mutex* mu, const absl::Condition& cond, absl::Duration timeout,
              Clock* clock, absl::Duration poll = absl::Milliseconds(10))
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

}  // namespace muster

#endif  // MUSTER_COMMON_MONOTONIC_WAIT_H_
