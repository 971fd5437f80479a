#include "common/monotonic_wait.h"

#include <algorithm>

#include "absl/time/clock.h"

namespace muster {

bool SleepUnlessNotified(const absl::Notification& stop, absl::Duration period,
                         absl::Duration poll) {
  for (absl::Duration left = period; left > absl::ZeroDuration(); left -= poll) {
    if (stop.HasBeenNotified()) return true;
    absl::SleepFor(std::min(left, poll));
  }
  return stop.HasBeenNotified();
}

MutexPoker::MutexPoker(absl::Mutex* mu, absl::Duration period)
    : thread_([this, mu, period] {
        while (!done_.load()) {
          absl::SleepFor(period);
          mu->Lock();
          mu->Unlock();
        }
      }) {}

MutexPoker::~MutexPoker() {
  done_ = true;
  thread_.join();
}

namespace {

struct Wait {
  const absl::Condition* cond;
  Clock* clock;
  absl::Time deadline;
};

bool Over(Wait* w) { return w->cond->Eval() || w->clock->Now() >= w->deadline; }

}  // namespace

bool AwaitFor(absl::Mutex* mu, const absl::Condition& cond, absl::Duration timeout, Clock* clock,
              absl::Duration poll) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  if (cond.Eval()) return true;
  Wait wait{&cond, clock, clock->Now() + timeout};
  {
    MutexPoker poker(mu, poll);
    mu->Await(absl::Condition(&Over, &wait));
    mu->Unlock();  // the poker may be waiting for `mu`
  }
  mu->Lock();
  return cond.Eval();
}

}  // namespace muster
