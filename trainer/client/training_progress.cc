#include "trainer/client/training_progress.h"

#include <pthread.h>

#include <algorithm>

namespace muster {

void TrainingProgress::NoteThread() {
  const pthread_t self = pthread_self();
  if (thread_known_.load(std::memory_order_acquire) && pthread_equal(thread_, self)) return;
  clockid_t clock;
  if (pthread_getcpuclockid(self, &clock) != 0) return;
  thread_ = self;
  thread_clock_.store(clock);
  thread_known_.store(true, std::memory_order_release);
}

bool TrainingProgress::Working() const {
  if (!thread_known_.load(std::memory_order_acquire)) return false;
  const clockid_t thread_clock = thread_clock_.load();
  timespec ts;
  if (clock_gettime(thread_clock, &ts) != 0) return false;  // the thread ended
  const absl::Duration cpu = absl::DurationFromTimespec(ts);
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&sample_mu_);
  const bool working = sampled_ && sampled_clock_ == thread_clock &&
                       cpu - cpu_ > std::max((now - at_) / 100, absl::ZeroDuration());
  sampled_ = true;
  sampled_clock_ = thread_clock;
  cpu_ = cpu;
  at_ = now;
  return working;
}

}  // namespace muster
