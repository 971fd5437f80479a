// How long a trainer's training thread has made no progress, for its
// heartbeat (Heartbeat.stalled_ms), and whether it is working meanwhile
// (Heartbeat.working). The thread makes progress when it enters or leaves
// one of muster's calls and at every turn of the wait for its step's
// all-reduce. The program's own computing between calls shows as a stall;
// a stall during which the thread still runs on a CPU is working (the
// program's own work, an evaluation on one rank), one during which it does
// not run is stuck (a thread frozen, blocked in a driver call, a
// deadlock). The coordinator leaves a member that is stalled and not
// working out of the regroup at once when its peers' collective deadline
// passes, and waits for one that works (docs/elastic.md). A call that
// blocks without turns (an RPC, a collective on this thread) or does
// muster's own long work (a checkpoint's copy) holds a Busy scope, which is
// not a stall.
//
// Thread-safety: Mark and Busy on the training thread; stalled_ms and
// Working on any.
#ifndef MUSTER_TRAINER_CLIENT_TRAINING_PROGRESS_H_
#define MUSTER_TRAINER_CLIENT_TRAINING_PROGRESS_H_

#include <pthread.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace muster {

class TrainingProgress {
 public:
  // `clock`: times the stalls; required, not owned, must outlive this.
  explicit TrainingProgress(Clock* clock) : clock_(clock) {}

  // The thread made progress now (the first Mark starts the count). The
  // thread that marks last is the one whose CPU time Working reads.
  void Mark() {
    mark_ms_ = absl::ToUnixMillis(clock_->Now());
    NoteThread();
  }
  // Milliseconds since the last Mark; 0 before the first and while Busy.
  uint32_t stalled_ms() const {
    const int64_t mark = mark_ms_.load();
    if (mark == 0 || busy_.load() > 0) return 0;
    return static_cast<uint32_t>(std::clamp<int64_t>(absl::ToUnixMillis(clock_->Now()) - mark,
                                                     0, std::numeric_limits<uint32_t>::max()));
  }

  // Whether the marked thread ran on a CPU for at least a hundredth of the
  // time since the previous call. False at the first call (nothing to
  // compare with), before the first Mark, and where its CPU clock cannot be
  // read.
  bool Working() const;

  class Busy {
   public:
    explicit Busy(TrainingProgress* p) : p_(p) { ++p_->busy_; }
    ~Busy() {
      p_->Mark();
      --p_->busy_;
    }
    Busy(const Busy&) = delete;
    Busy& operator=(const Busy&) = delete;

   private:
    TrainingProgress* const p_;
  };

 private:
  Clock* const clock_;
  // clock_->Now() (monotonic: a wall step is no stall) in ms since the
  // Unix epoch, kept in one atomic; 0: never marked.
  std::atomic<int64_t> mark_ms_{0};
  std::atomic<int> busy_{0};

  void NoteThread();
  // The marking thread (Mark's only) and its CPU clock; thread_known_ is
  // set once the clock is.
  pthread_t thread_{};
  std::atomic<clockid_t> thread_clock_{0};
  std::atomic<bool> thread_known_{false};
  mutable absl::Mutex sample_mu_;
  // The clock of the last sample (a sample of another thread's is none).
  mutable clockid_t sampled_clock_ ABSL_GUARDED_BY(sample_mu_) = 0;
  mutable bool sampled_ ABSL_GUARDED_BY(sample_mu_) = false;
  mutable absl::Duration cpu_ ABSL_GUARDED_BY(sample_mu_);
  mutable absl::Time at_ ABSL_GUARDED_BY(sample_mu_);
};

}  // namespace muster

#endif  // MUSTER_TRAINER_CLIENT_TRAINING_PROGRESS_H_
