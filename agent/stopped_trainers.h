// Which trainers have been held stopped for too long, from the kernel's own
// word on each thread (/proc/PID/task/TID/stat: 'T', stopped by a signal,
// or 't', stopped by a tracer).
//
// That state is evidence, not a guess: a healthy trainer never sits in it,
// however slow its step, so muster-agent can act on it long before a
// heartbeat or collective timeout would (docs/elastic.md, "Stopped
// trainers"):
//   kWhole  every thread stopped: SIGSTOP, job control, a debugger that
//           stopped the process. Its member is detached at once: the world
//           regroups without it, and the process rejoins as a new
//           incarnation when it runs again, as after a heartbeat timeout.
//   kPartly some threads stopped while the others run (its heartbeats go
//           on): a thread frozen under a tracer. The trainer is hung; the
//           agent ends it and restarts it, as a fence for a hang would.
// A thread blocked in a system call, a deadlock or a long kernel does not
// show here; those stay with the collective deadline (a stall alone cannot
// tell them from a slow step).
//
// Thread-safety: none; the agent's loop owns it.
#ifndef MUSTER_AGENT_STOPPED_TRAINERS_H_
#define MUSTER_AGENT_STOPPED_TRAINERS_H_

#include <sys/types.h>

#include <functional>
#include <map>
#include <vector>

#include "absl/time/time.h"
#include "common/clock.h"

namespace muster {

enum class Stopped { kNo, kWhole, kPartly };

// The state of process `pid`'s threads now; kNo when it is gone.
Stopped ReadStopped(pid_t pid);

class StoppedTrainers {
 public:
  struct Verdict {
    pid_t pid = 0;
    Stopped how = Stopped::kNo;
    absl::Duration stopped_for;
  };

  // `limit` 0: never a verdict.
  StoppedTrainers(absl::Duration limit, Clock* clock,
                  std::function<Stopped(pid_t)> probe = ReadStopped)
      : limit_(limit), clock_(clock), probe_(std::move(probe)) {}

  bool enabled() const { return limit_ > absl::ZeroDuration(); }
  // Looks at `pids` (the running trainers) and returns those stopped the
  // same way for at least the limit, each once per stop; a trainer that
  // runs again, or changes how it is stopped, starts over.
  std::vector<Verdict> Check(const std::vector<pid_t>& pids);

 private:
  struct Seen {
    Stopped how = Stopped::kNo;
    absl::Time since;
    bool told = false;
  };
  const absl::Duration limit_;
  Clock* const clock_;
  const std::function<Stopped(pid_t)> probe_;
  std::map<pid_t, Seen> seen_;
};

}  // namespace muster

#endif  // MUSTER_AGENT_STOPPED_TRAINERS_H_
