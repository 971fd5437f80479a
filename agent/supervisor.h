// Supervisor: what muster-agent does when one of its trainers ends. Pure
// policy (no processes, no clock of its own), so it is unit-tested directly.
//
// A slot is one local rank. A trainer that exits 0 (finished), 75 (stopped
// after a checkpoint) or 74 (stopped without one) is done. Exit 2 (bad
// flags) or 78 (bad options: the library's INVALID_ARGUMENT) means its
// configuration is wrong, so restarting cannot help: the slot gives up at
// once. Any other end (a signal, a crash, an
// error) is restarted after an exponential backoff, up to `max_restarts` times
// per slot; after that the slot gives up and the others go on (they are
// elastic). Once the agent is stopping nothing is restarted.
//
// Not thread-safe: the agent's single thread owns it.
#ifndef MUSTER_AGENT_SUPERVISOR_H_
#define MUSTER_AGENT_SUPERVISOR_H_

#include <string>
#include <vector>

#include "absl/time/time.h"

namespace muster {

// Exit codes shared by muster-train and muster-agent.
inline constexpr int kExitBadFlags = 2;
// A trainer that could not be started (fork failed) ends as if with this code
// (the shell's "command not found/not executable" family).
inline constexpr int kExitForkFailed = 127;
inline constexpr int kExitStoppedBySignal = 75;  // sysexits.h EX_TEMPFAIL
// Stopped, but no checkpoint of the last step committed (sysexits EX_IOERR).
inline constexpr int kExitStoppedWithoutCheckpoint = 74;
inline constexpr int kExitConfig = 78;  // sysexits.h EX_CONFIG
// The ranks' state disagreed (Distributed::kExitDataLoss, sysexits.h
// EX_DATAERR): the same program would disagree again, so not restarted.
inline constexpr int kExitDataLoss = 65;

struct SupervisorOptions {
  int slots = 1;
  int max_restarts = 3;
  absl::Duration backoff_initial = absl::Milliseconds(250);
  absl::Duration backoff_max = absl::Seconds(30);
};

// How a process ended, as waitpid reports it.
struct ProcessEnd {
  bool signaled = false;
  int code = 0;  // exit code, or the signal number when `signaled`
  std::string Describe() const;
};

class Supervisor {
 public:
  enum class State { kPending, kRunning, kDone, kGaveUp };

  explicit Supervisor(SupervisorOptions options);

  // Slot `slot` was started (or restarted) at `now`.
  void Started(int slot, absl::Time now);
  // Slot `slot`'s trainer ended at `now`. Returns true when it is to be
  // restarted (at RestartAt(slot)).
  bool Ended(int slot, ProcessEnd end, absl::Time now);
  // From now on nothing is restarted; pending restarts are cancelled.
  void Stop();

  State state(int slot) const { return slots_[slot].state; }
  absl::Time RestartAt(int slot) const { return slots_[slot].restart_at; }
  int restarts(int slot) const { return slots_[slot].restarts; }
  bool stopping() const { return stopping_; }
  // True while any slot runs or waits for a restart.
  bool Active() const;
  // The earliest pending restart (InfiniteFuture when none).
  absl::Time NextRestart() const;

  // The agent's exit code: 1 if a slot gave up, else 74 if any trainer
  // stopped without a checkpoint, else 75 if any stopped after one, else the
  // first non-zero end, else 0.
  int ExitCode() const;
  // One line per slot: how it ended and how often it was restarted.
  std::string Summary() const;

 private:
  struct Slot {
    State state = State::kPending;
    int restarts = 0;
    absl::Time restart_at = absl::InfinitePast();
    ProcessEnd last;
    bool ended = false;
  };
  SupervisorOptions options_;
  std::vector<Slot> slots_;
  bool stopping_ = false;
};

}  // namespace muster

#endif  // MUSTER_AGENT_SUPERVISOR_H_
