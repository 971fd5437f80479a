// WorldStatistics: a trainer's StatisticsReducer (muster/sync_batch_norm.h),
// through which every SyncBatchNorm of the program sums its statistics over
// the current world.
//
// A sum made while a pass's gradient reduction is in flight runs in order
// with its buckets (GradientSync::RunInOrder); between passes it runs on
// the calling thread. Ranks that run the same graph thereby meet the sums
// and the buckets in the same order. A sum that fails (a peer died or hung
// past the step's deadline) leaves the values local, and so do the sums
// after it until the pass ends: the pass goes on to its AfterBackward,
// where EndPass fails it and the world regroups. A pass that summed
// statistics over more than one rank is not salvaged (EndPass says
// whether it did): its survivors' gradients hold the lost ranks'
// examples through the statistics.
//
// Thread-safety: SetWorld, SetPass and EndPass on the training thread,
// between passes or at a pass's ends; SumOverWorld and world_size from a
// forward (the training thread) or a backward (an autograd thread while
// the training thread waits in backward()).
#ifndef MUSTER_TRAINER_DDP_WORLD_STATISTICS_H_
#define MUSTER_TRAINER_DDP_WORLD_STATISTICS_H_

#include <torch/types.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "muster/sync_batch_norm.h"
#include "trainer/comm/communicator.h"
#include "trainer/ddp/gradient_sync.h"

namespace muster {

class WorldStatistics final : public StatisticsReducer {
 public:
  explicit WorldStatistics(Clock* clock) : clock_(clock) {}

  // The world's communicator; null: local sums from now on (no world, or
  // the trainer is done with it).
  void SetWorld(Communicator* comm);
  // The sync of the pass begun, and the deadline of a sum from when it
  // starts: the step's (kept after the pass).
  void SetPass(GradientSync* sync, absl::Duration timeout);
  struct PassAccount {
    bool reduced = false;  // a sum ran over more than one rank
    absl::Status status;   // the first sum's failure
  };
  // The pass ended (no sync in flight: sums run on the calling thread):
  // what happened since the last EndPass; starts the next account.
  PassAccount EndPass();

  int world_size() const override;
  void SumOverWorld(torch::Tensor& values) override;

 private:
  Clock* const clock_;
  mutable Mutex mu_;
  Communicator* comm_ ABSL_GUARDED_BY(mu_) = nullptr;
  GradientSync* pass_ ABSL_GUARDED_BY(mu_) = nullptr;
  absl::Duration timeout_ ABSL_GUARDED_BY(mu_) = absl::Seconds(120);
  PassAccount account_ ABSL_GUARDED_BY(mu_);
};

}  // namespace muster

#endif  // MUSTER_TRAINER_DDP_WORLD_STATISTICS_H_
