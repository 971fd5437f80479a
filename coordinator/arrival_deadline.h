// ArrivalDeadline: when the members of a world formed after a broken-world
// report must have come to its rendezvous. A member that reports that the
// world broke under it names how long its peers may take (or the
// coordinator's default); the world formed from that report is Set() with
// that window. Tick asks Due(now) while the world is still forming, and
// fences as hung the members that have not arrived; a world that completes,
// pauses, or forms again for any other reason Clear()s it. A world formed
// for any other reason has no arrival deadline: its members are waited for
// until their own rendezvous timeouts.
//
// Time is passed in (the coordinator's monotonic clock_->Now()); nothing
// here reads a clock.
//
// Thread-safety: not thread-safe. Owned by Coordinator and used under its
// mutex.
#ifndef MUSTER_COORDINATOR_ARRIVAL_DEADLINE_H_
#define MUSTER_COORDINATOR_ARRIVAL_DEADLINE_H_

#include "absl/time/time.h"

namespace muster {

class ArrivalDeadline {
 public:
  // Clear: never Due().
  ArrivalDeadline() = default;

  // The members of the world formed at `formed_at` must arrive within
  // `window`: Due() from formed_at + window on. Replaces any deadline set
  // before.
  void Set(absl::Time formed_at, absl::Duration window);

  // No deadline: Due() is false until the next Set(). window() keeps the
  // last Set()'s window, so that whoever clears it once Due() can still
  // name the window in what it reports.
  void Clear();

  // Whether `now` is at or past deadline(): never while clear (for any
  // finite `now`).
  bool Due(absl::Time now) const;

  // The deadline; InfiniteFuture while clear.
  absl::Time deadline() const { return arrive_by_; }

  // The window of the last Set() (kept by Clear()); zero before any.
  absl::Duration window() const { return window_; }

 private:
  absl::Time arrive_by_ = absl::InfiniteFuture();
  absl::Duration window_;
};

}  // namespace muster

#endif  // MUSTER_COORDINATOR_ARRIVAL_DEADLINE_H_
