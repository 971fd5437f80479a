// Schedule: where training stands in its data and its steps, and what that
// says. It holds the counters every rank holds alike between steps
// (training_counters.h) over the sampler of the data set, and answers from
// them: the progress, whether training is done (Options::steps, else
// Options::epochs), this rank's batch of the next step, the step's end
// (the sampler advances over the world the step began in, the examples of
// shares a salvaged step lost go back), the record a checkpoint keeps, and
// the counters a checkpoint restores.
//
// Every rank follows the same schedule: all ranks leave the loop after the
// same step, whatever world sizes they went through. A plain value; the
// training thread's.
#ifndef MUSTER_TRAINER_LIB_SCHEDULE_H_
#define MUSTER_TRAINER_LIB_SCHEDULE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "common/checkpoint_manifest.h"
#include "muster/options.h"
#include "trainer/comm/world_info.h"
#include "trainer/data/sampler.h"
#include "trainer/elastic/training_counters.h"

namespace muster {

class Schedule {
 public:
  explicit Schedule(const Options& o)
      : steps_(o.steps),
        epochs_(o.epochs),
        batch_per_rank_(o.batch_per_rank),
        sampler_(o.dataset_size, o.seed) {}

  TrainingCounters* mutable_counters() { return &counters_; }
  const TrainingCounters& counters() const { return counters_; }
  DistributedSampler* sampler() { return &sampler_; }

  // The progress in `world` (null: before the first).
  Progress ProgressIn(const WorldInfo* world) const;
  bool Done() const;
  // This rank's batch of the next step, in `world`.
  SampledBatch Next(const WorldInfo& world);
  // This rank's examples of the step `ahead` (>= 1) steps after the one
  // that takes `current` (this rank's batch of it), if `world` stays and no
  // share is lost; empty when that step would be past the end.
  std::vector<int64_t> Upcoming(const WorldInfo& world, const SampledBatch& current, int ahead);
  // The step that took `batch` (any rank's of it) in a world of
  // `world_size` ranks ends; the examples of the shares `lost` (ranks of
  // that world) go back to the sampler.
  void EndStep(const SampledBatch& batch, int world_size, const std::vector<int>& lost);
  // What a checkpoint after the last step records, taken in `world`;
  // `epoch`: the last batch's.
  CheckpointMeta Meta(const WorldInfo& world, int64_t epoch) const;
  // The counters `meta` recorded. DATA_LOSS when it returns an example
  // outside the data set; the counters are then unchanged.
  absl::Status Restore(const CheckpointMeta& meta);

 private:
  const int64_t steps_;
  const int64_t epochs_;
  const int batch_per_rank_;
  DistributedSampler sampler_;
  TrainingCounters counters_;
};

}  // namespace muster

#endif  // MUSTER_TRAINER_LIB_SCHEDULE_H_
