// Clock: the seam through which every piece of muster reads time.
//
// A Clock gives two readings, for two different jobs:
//   * Now(): monotonic. For durations, deadlines, timeouts, backoff and
//     elapsed times. It is an absl::Time on a time line that never steps:
//     anchored to the wall clock once (RealClock: at the first reading in
//     the process), it then moves with the elapsed time only, so an NTP
//     step or a VM resume neither hides a dead peer nor times out a healthy
//     wait. Its values print plausibly but are NOT dates: compare them only
//     with other Now() values of the same process, and never store them,
//     send them to another process or show them as a time of day.
//   * WallNow(): the wall clock, which may step in either direction. For
//     records only: log lines, the event log, manifests, timestamps on the
//     status page and in metrics files, file names.
//
// APIs that take a wall time point (grpc::ClientContext::set_deadline,
// grpc::Server::Shutdown, Channel::WaitForConnected) get one from
// SystemDeadline() right before the call; absl waits take Remaining().
//
// Production code uses RealClock; unit tests use FakeClock (fake_clock.h) to
// drive timeouts and clock steps without sleeping. Clocks are given, not
// fetched: an object takes the Clock* of whoever composes it (an options
// field or a parameter, required and not owned); only the composition roots
// (each program's main, Distributed::Start, CoordinatorServer::Start,
// RunAgent) take the process's RealClock (tests/clock_test.sh).
// Implementations must be thread-safe.
#ifndef MUSTER_COMMON_CLOCK_H_
#define MUSTER_COMMON_CLOCK_H_

#include <chrono>

#include "absl/time/time.h"

namespace muster {

class Clock {
 public:
  virtual ~Clock() = default;
  // Monotonic time: never goes backwards and never steps for one Clock
  // object. Not a date (see above).
  virtual absl::Time Now() = 0;
  // The wall clock, for records only: may jump either way at any time.
  virtual absl::Time WallNow() = 0;
};

// Now(): the wall clock read once, at the first reading of any RealClock
// in the process, plus std::chrono::steady_clock's time elapsed since.
// WallNow(): absl::Now(). Thread-safe.
class RealClock : public Clock {
 public:
  absl::Time Now() override;
  absl::Time WallNow() override;
  // A process-wide instance; never destroyed. For composition roots only.
  static RealClock* Get();
};

// How long until `deadline`, a time of `clock->Now()`; zero once it passed
// (never negative), infinite for absl::InfiniteFuture().
absl::Duration Remaining(absl::Time deadline, Clock* clock);

// `deadline`, a time of `clock->Now()`, as a wall time point for APIs that
// take one: system_clock::now() + Remaining(deadline, clock). Convert right
// before the call (a wall step after it moves the point). An infinite
// deadline gives time_point::max().
std::chrono::system_clock::time_point SystemDeadline(absl::Time deadline, Clock* clock);

}  // namespace muster

#endif  // MUSTER_COMMON_CLOCK_H_
