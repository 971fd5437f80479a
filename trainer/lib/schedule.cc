#include "trainer/lib/schedule.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace muster {

Progress Schedule::ProgressIn(const WorldInfo* world) const {
  Progress p;
  p.step = counters_.step;
  p.sample_offset = counters_.position.offset;
  p.epoch = sampler_.Epoch(counters_.position);
  if (world != nullptr) {
    p.rank = world->rank;
    p.world_size = world->world_size;
    p.generation = world->generation;
  }
  p.global_batch = int64_t{batch_per_rank_} * std::max(1, p.world_size);
  p.lr_world_size = counters_.lr_world_size;
  if (steps_ > 0) {
    p.total_steps = steps_;
  } else {
    const int64_t left = sampler_.Remaining(counters_.position, epochs_);
    p.total_steps = counters_.step + (left + p.global_batch - 1) / p.global_batch;
  }
  return p;
}

bool Schedule::Done() const {
  if (steps_ > 0) return counters_.step >= steps_;
  return sampler_.Done(counters_.position, epochs_);
}

SampledBatch Schedule::Next(const WorldInfo& world) {
  return sampler_.Next(counters_.position, world.world_size, world.rank, batch_per_rank_);
}

std::vector<int64_t> Schedule::Upcoming(const WorldInfo& world, const SampledBatch& current,
                                        int ahead) {
  SamplerPosition at = counters_.position;
  SampledBatch batch = current;
  for (int k = 1; k <= ahead; ++k) {
    if (steps_ > 0 && counters_.step + k >= steps_) return {};
    at = sampler_.Advance(at, batch, world.world_size, batch_per_rank_, {});
    if (steps_ <= 0 && sampler_.Done(at, epochs_)) return {};
    batch = sampler_.Next(at, world.world_size, world.rank, batch_per_rank_);
  }
  return batch.indices;
}

void Schedule::EndStep(const SampledBatch& batch, int world_size, const std::vector<int>& lost) {
  counters_.position =
      sampler_.Advance(counters_.position, batch, world_size, batch_per_rank_, lost);
  ++counters_.step;
  counters_.pass = 0;
}

CheckpointMeta Schedule::Meta(const WorldInfo& world, int64_t epoch) const {
  CheckpointMeta meta;
  meta.generation = world.generation;
  meta.world_size = world.world_size;
  meta.lr_world_size = counters_.lr_world_size;
  meta.step = counters_.step;
  meta.epoch = epoch;
  meta.sample_offset = counters_.position.offset;
  meta.returned_epoch = counters_.position.returned_epoch;
  meta.returned_examples = counters_.position.returned;
  return meta;
}

absl::Status Schedule::Restore(const CheckpointMeta& meta) {
  for (int64_t i : meta.returned_examples) {
    if (i >= sampler_.size()) {
      return absl::DataLossError(absl::StrCat("the checkpoint of step ", meta.step,
                                              " returns example ", i, " of a data set of ",
                                              sampler_.size()));
    }
  }
  counters_.step = meta.step;
  counters_.position = {meta.sample_offset, meta.returned_epoch, meta.returned_examples};
  counters_.lr_world_size = meta.lr_world_size;
  return absl::OkStatus();
}

}  // namespace muster
