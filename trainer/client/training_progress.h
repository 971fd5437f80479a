// How long a trainer's training thread has made no progress, for its
// heartbeat (Heartbeat.stalled_ms). The thread makes progress when it
// enters or leaves one of muster's calls and at every turn of the wait for
// its step's all-reduce. The program's own computing between calls shows as
// a stall, which is why a member still stalled when its peers' collective
// deadline passes is stuck (a rank frozen in a kernel, a driver call, a
// deadlock) and is left out of the regroup at once (docs/elastic.md). A
// call that blocks without turns (an RPC, a collective on this thread) or
// does muster's own long work (a checkpoint's copy) holds a Busy scope,
// which is not a stall.
//
// Thread-safety: Mark and Busy on the training thread; stalled_ms on any.
#ifndef MUSTER_TRAINER_CLIENT_TRAINING_PROGRESS_H_
#define MUSTER_TRAINER_CLIENT_TRAINING_PROGRESS_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>

#include "absl/time/time.h"
#include "common/clock.h"

namespace muster {

class TrainingProgress {
 public:
  // `clock`: times the stalls; required, not owned, must outlive this.
  explicit TrainingProgress(Clock* clock) : clock_(clock) {}

  // The thread made progress now (the first Mark starts the count).
  void Mark() { mark_ms_ = absl::ToUnixMillis(clock_->Now()); }
  // Milliseconds since the last Mark; 0 before the first and while Busy.
  uint32_t stalled_ms() const {
    const int64_t mark = mark_ms_.load();
    if (mark == 0 || busy_.load() > 0) return 0;
    return static_cast<uint32_t>(std::clamp<int64_t>(absl::ToUnixMillis(clock_->Now()) - mark,
                                                     0, std::numeric_limits<uint32_t>::max()));
  }

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
};

}  // namespace muster

#endif  // MUSTER_TRAINER_CLIENT_TRAINING_PROGRESS_H_
