#include "agent/supervisor.h"

#include <signal.h>
#include <string.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace muster {
namespace {

// A trainer that stopped as asked, with or without a checkpoint.
bool Stopped(const ProcessEnd& end) {
  return !end.signaled &&
         (end.code == kExitStoppedBySignal || end.code == kExitStoppedWithoutCheckpoint);
}

}  // namespace

std::string ProcessEnd::Describe() const {
  if (signaled) return absl::StrCat("killed by signal ", code, " (", ::strsignal(code), ")");
  return absl::StrCat("exit ", code);
}

Supervisor::Supervisor(SupervisorOptions options)
    : options_(options), slots_(std::max(1, options.slots)) {}

void Supervisor::Started(int slot, absl::Time) { slots_[slot].state = State::kRunning; }

bool Supervisor::Ended(int slot, ProcessEnd end, absl::Time now) {
  Slot& s = slots_[slot];
  s.last = end;
  s.ended = true;
  const bool clean = !end.signaled && (end.code == 0 || Stopped(end));
  // A trainer still starting up when the agent forwarded a stop signal dies
  // of it; it had not joined, so nothing was lost.
  const bool stopped_early = stopping_ && end.signaled &&
                             (end.code == SIGTERM || end.code == SIGINT || end.code == SIGHUP ||
                              end.code == SIGUSR1);
  if (stopped_early) s.last = ProcessEnd{false, 0};
  if (clean || stopping_) {
    s.state = State::kDone;
    return false;
  }
  const bool misconfigured =
      !end.signaled &&
      (end.code == kExitBadFlags || end.code == kExitConfig || end.code == kExitDataLoss);
  if (misconfigured || s.restarts >= options_.max_restarts) {
    s.state = State::kGaveUp;
    return false;
  }
  // Exponential: initial, 2x, 4x, ... capped.
  absl::Duration delay = options_.backoff_initial;
  for (int i = 0; i < s.restarts && delay < options_.backoff_max; ++i) delay *= 2;
  delay = std::min(delay, options_.backoff_max);
  ++s.restarts;
  s.state = State::kPending;
  s.restart_at = now + delay;
  return true;
}

void Supervisor::Stop() {
  stopping_ = true;
  for (Slot& s : slots_) {
    if (s.state == State::kPending && s.ended) s.state = State::kDone;
  }
}

bool Supervisor::Active() const {
  return std::any_of(slots_.begin(), slots_.end(), [](const Slot& s) {
    return s.state == State::kRunning || s.state == State::kPending;
  });
}

absl::Time Supervisor::NextRestart() const {
  absl::Time next = absl::InfiniteFuture();
  for (const Slot& s : slots_) {
    if (s.state == State::kPending) next = std::min(next, s.restart_at);
  }
  return next;
}

int Supervisor::ExitCode() const {
  int first_error = 0;
  bool stopped = false, lost = false;
  for (const Slot& s : slots_) {
    if (s.state == State::kGaveUp) return 1;
    if (!s.ended) continue;
    stopped |= Stopped(s.last);
    lost |= !s.last.signaled && s.last.code == kExitStoppedWithoutCheckpoint;
    if (first_error == 0 && (s.last.signaled || (s.last.code != 0 && !Stopped(s.last)))) {
      first_error = s.last.signaled ? 128 + s.last.code : s.last.code;
    }
  }
  if (lost) return kExitStoppedWithoutCheckpoint;
  if (stopped) return kExitStoppedBySignal;
  return first_error;
}

std::string Supervisor::Summary() const {
  std::string out;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    absl::StrAppend(&out, "trainer ", i, ": ");
    if (s.state == State::kGaveUp) {
      absl::StrAppend(&out, "gave up after ", s.restarts, " restarts, last ", s.last.Describe());
    } else if (s.ended) {
      absl::StrAppend(&out, s.last.Describe(), ", ", s.restarts, " restarts");
    } else {
      absl::StrAppend(&out, "never ended");
    }
    if (i + 1 < slots_.size()) out += "; ";
  }
  return out;
}

}  // namespace muster
