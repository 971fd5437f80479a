// DistributedSampler: which examples each rank trains on, as a pure function
// of the global sample offset (the number of samples every previous step of
// every generation consumed).
//
// Epoch e visits a permutation of the data set seeded by (seed, e). A step at
// offset o takes the next min(world * batch, rest of epoch) positions of that
// permutation as its global batch and splits them into `world` contiguous
// shares (sizes differing by at most one; the last, short global batch of an
// epoch included), share r for rank r. So every example is seen exactly once
// per epoch, the global batch does not depend on how it is split, and a
// change of world size re-shards exactly: continue from the same offset.
//
// Thread-safe after construction (the permutation cache is guarded).
#ifndef MUSTER_TRAINER_DATA_SAMPLER_H_
#define MUSTER_TRAINER_DATA_SAMPLER_H_

#include <cstdint>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace muster {

struct SampledBatch {
  int64_t epoch = 0;
  std::vector<int64_t> indices;  // this rank's share
  int64_t global_batch = 0;      // samples all ranks consume in this step
};

class DistributedSampler {
 public:
  DistributedSampler(int64_t dataset_size, uint64_t seed)
      : size_(dataset_size), seed_(seed) {}

  SampledBatch Next(int64_t offset, int world, int rank, int batch_per_rank);

  // The permutation of epoch `epoch` (identical on every rank).
  std::vector<int64_t> Permutation(int64_t epoch);
  // Steps in the epoch containing `offset` from that offset on.
  int64_t size() const { return size_; }

 private:
  const int64_t size_;
  const uint64_t seed_;
  absl::Mutex mu_;
  int64_t cached_epoch_ ABSL_GUARDED_BY(mu_) = -1;
  std::vector<int64_t> cached_ ABSL_GUARDED_BY(mu_);
};

}  // namespace muster

#endif  // MUSTER_TRAINER_DATA_SAMPLER_H_
