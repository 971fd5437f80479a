// A mutex and condition variable that clang's thread-safety analysis checks
// and whose timed waits keep to the monotonic clock.
//
// absl::Mutex carries the analysis's attributes, but Debian's Abseil turns
// its timed waits into CLOCK_REALTIME deadlines (common/monotonic_wait.h):
// a wall clock set back during a wait stretches it. std::condition_variable
// waits on CLOCK_MONOTONIC (libstdc++'s wait_for uses steady_clock and
// pthread_cond_clockwait), but std::mutex carries no attributes, so clang
// rejects ABSL_GUARDED_BY on it and nothing checks the members it guards.
// These wrappers give both:
//
//   Mutex mu_;
//   CondVar cv_;
//   int jobs_ ABSL_GUARDED_BY(mu_) = 0;
//
//   MutexLock lock(&mu_);
//   while (jobs_ == 0) cv_.Wait(&mu_);       // a loop, not a predicate lambda:
//                                            // clang checks the loop's reads
//   lock.Unlock();  ... I/O ...  lock.Lock();
//
// Where a component's waits are untimed, or it already uses absl::Mutex
// with AwaitFor, absl::Mutex stays the choice; these are for the code that
// needs timed waits on std's clocks.
//
// Thread-safety: as std::mutex and std::condition_variable.
#ifndef MUSTER_COMMON_MUTEX_H_
#define MUSTER_COMMON_MUTEX_H_

#include <algorithm>
#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"

namespace muster {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds `mu` for its scope. Unlock() and Lock() drop and take it again
// within the scope (for work that must not run under the lock); the
// destructor unlocks only if it is held.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() {
    if (held_) mu_->Unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Unlock() ABSL_UNLOCK_FUNCTION() {
    held_ = false;
    mu_->Unlock();
  }
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    mu_->Lock();
    held_ = true;
  }

 private:
  Mutex* const mu_;
  bool held_ = true;
};

class CondVar {
 public:
  // Releases `mu` while it sleeps and holds it again on return. Wakes on a
  // notify or spuriously: callers wait in a loop on their condition.
  void Wait(Mutex* mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  // As Wait, for at most `timeout` on the monotonic clock: false when the
  // timeout passed, true when woken before it.
  bool WaitFor(Mutex* mu, absl::Duration timeout) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (timeout == absl::InfiniteDuration()) {
      Wait(mu);
      return true;
    }
    // A day at most: steady_clock's now() plus a saturated duration would
    // overflow. Callers wait in a loop, so an early return is only a wake-up.
    timeout = std::min(timeout, absl::Hours(24));
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    const std::cv_status woke = cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout));
    lock.release();
    return woke == std::cv_status::no_timeout;
  }
  void NotifyAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace muster

#endif  // MUSTER_COMMON_MUTEX_H_
