#include "trainer/client/training_progress.h"

#include <pthread.h>

#include <algorithm>

namespace muster {

void TrainingProgress::KnowThread() {
  clockid_t clock;
  if (pthread_getcpuclockid(pthread_self(), &clock) != 0) return;
  thread_clock_ = clock;
  thread_known_.store(true, std::memory_order_release);
}

bool TrainingProgress::Working() const {
  if (!thread_known_.load(std::memory_order_acquire)) return false;
  timespec ts;
  if (clock_gettime(thread_clock_, &ts) != 0) return false;  // the thread ended
  const absl::Duration cpu = absl::DurationFromTimespec(ts);
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&sample_mu_);
  const bool working = sampled_ && cpu - cpu_ > std::max((now - at_) / 100, absl::ZeroDuration());
  sampled_ = true;
  cpu_ = cpu;
  at_ = now;
  return working;
}

}  // namespace muster
