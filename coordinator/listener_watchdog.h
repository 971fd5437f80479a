// ListenerWatchdog: notices that the coordinator's TCP listener stopped
// accepting connections, and asks for a new one.
//
// Why: gRPC 1.51 (Debian 12) stops polling a listening socket for good after
// accept4 fails with anything but EAGAIN, EINTR or ECONNABORTED: EMFILE,
// when the process ran out of file descriptors (a flood of idle
// connections under a hard RLIMIT_NOFILE). Connections then wait in the
// kernel's accept queue forever, even once descriptors are free again, while
// the connections already accepted (members' sessions) go on.
//
// How: every `interval` the watchdog asks the listening sockets on `port`
// how long their accept queues are (coordinator/tcp_table.h). While they
// are empty nothing waits, and that is all it does: the kernel's TCP
// tables, which it reads otherwise, cost milliseconds a read on any host
// (the kernel walks its whole connection hash, sized by memory). When a
// queue holds connections it reads the tables: a connection to `port` that
// no process holds yet waits in the listener's accept queue; a live
// listener takes it within milliseconds, so one seen waiting for
// `stuck_after` means nobody accepts.
// It then calls `rebuild` on its own thread, and again every interval until
// `rebuild` succeeds. A table it cannot read (this process has no free
// descriptor at that moment) is no verdict: it looks again at the next
// interval. It sends nothing and connects nowhere, so it works the same
// with TLS.
//
//   WATCHING --a connection waited stuck_after--> REBUILDING
//   REBUILDING --rebuild failed--> REBUILDING (next interval)
//   REBUILDING --rebuild OK--> WATCHING (ages forgotten)
//
// Thread-safe: Stop() and the destructor may be called from any thread but
// the watchdog's own (i.e. not from `rebuild`).
#ifndef MUSTER_COORDINATOR_LISTENER_WATCHDOG_H_
#define MUSTER_COORDINATOR_LISTENER_WATCHDOG_H_

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/tcp_table.h"

namespace muster {

// How long the connections of successive samples have waited. Pure; not
// thread-safe.
class AcceptQueueAges {
 public:
  // `waiting`: the unaccepted connections seen at `now` (monotonic,
  // Clock::Now()). Returns the longest
  // time any of them has been seen waiting (zero for one seen first now).
  // Connections no longer waiting are forgotten.
  absl::Duration Observe(const std::vector<std::string>& waiting, absl::Time now);
  void Clear() { first_seen_.clear(); }

 private:
  absl::flat_hash_map<std::string, absl::Time> first_seen_;
};

struct ListenerWatchdogOptions {
  int port = 0;
  absl::Duration interval = absl::Milliseconds(500);
  absl::Duration stuck_after = absl::Seconds(1);
  Clock* clock = nullptr;  // required: the connections' ages are its Now()
};

class ListenerWatchdog {
 public:
  // Called with how long a connection waited. OK: a new listener serves
  // the port. An error is retried at the next interval.
  using Rebuild = std::function<absl::Status(absl::Duration waited)>;

  // Starts the watchdog's thread.
  ListenerWatchdog(ListenerWatchdogOptions options, Rebuild rebuild);
  // Stop().
  ~ListenerWatchdog();

  // Stops and joins the thread: once it returns, `rebuild` never runs again.
  // Idempotent.
  void Stop();

 private:
  void Loop();
  // One look: how long the oldest unaccepted connection has waited (zero
  // also when the tables could not be read).
  absl::Duration OldestWait();
  // True when every listener on the port is known and its accept queue is
  // empty; finds the listeners first when they are not known.
  bool QueuesEmpty();

  // Constant after construction.
  const ListenerWatchdogOptions options_;
  const Rebuild rebuild_;

  // Used by the watchdog's thread only.
  AcceptQueueAges ages_;
  // The listening sockets on the port, found once and again after a
  // rebuild or when one is gone.
  std::vector<ListeningSocket> listeners_;

  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace muster

#endif  // MUSTER_COORDINATOR_LISTENER_WATCHDOG_H_
