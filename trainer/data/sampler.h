// DistributedSampler: which examples each rank trains on, as a pure function
// of the sampler's position: the global sample offset (the number of
// permutation positions every previous step of every generation consumed)
// and the examples handed back by salvaged steps.
//
// Epoch e visits a permutation of the data set seeded by (seed, e). A step
// takes its global batch of up to world * batch examples as
//   1. the returned examples first (see below), oldest first, then
//   2. the next positions of the permutation at the offset, up to the end of
//      the epoch; none while the returned examples are of an earlier epoch,
// and splits it into `world` contiguous shares (sizes differing by at most
// one; the last, short global batch of an epoch included), share r for
// rank r. So every example is seen exactly once per epoch, the global batch
// does not depend on how it is split, and a change of world size re-shards
// exactly: continue from the same position.
//
// Returned examples: when a step is salvaged after a peer failed, the shares
// of the ranks that did not contribute a gradient were not trained on. They
// go back to the sampler (Advance) and lead the next global batch, before
// the permutation goes on. A salvaged step whose last share was lost is
// therefore followed by the same global batches as a run that had the
// smaller world from that step on.
//
// Thread-safe after construction (the permutation cache is guarded).
#ifndef MUSTER_TRAINER_DATA_SAMPLER_H_
#define MUSTER_TRAINER_DATA_SAMPLER_H_

#include <cstdint>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace muster {

// Where the sampler stands; the same on every rank between steps.
struct SamplerPosition {
  int64_t offset = 0;
  int64_t returned_epoch = 0;     // the epoch the returned examples belong to
  std::vector<int64_t> returned;  // examples to train on next, in order

  bool operator==(const SamplerPosition& o) const {
    return offset == o.offset && returned_epoch == o.returned_epoch && returned == o.returned;
  }
};

struct SampledBatch {
  int64_t epoch = 0;
  std::vector<int64_t> indices;  // this rank's share
  int64_t global_batch = 0;      // samples all ranks consume in this step
  int64_t from_returned = 0;     // of them, taken from the returned examples
  int64_t from_permutation = 0;  // of them, permutation positions (the offset's advance)
};

class DistributedSampler {
 public:
  DistributedSampler(int64_t dataset_size, uint64_t seed)
      : size_(dataset_size), seed_(seed) {}

  SampledBatch Next(const SamplerPosition& at, int world, int rank, int batch_per_rank);
  SampledBatch Next(int64_t offset, int world, int rank, int batch_per_rank) {
    return Next(SamplerPosition{offset, 0, {}}, world, rank, batch_per_rank);
  }

  // The position after a step at `at` that took `batch` (any rank's
  // SampledBatch of it), and whose shares `lost` (rank indices of that
  // step's world of `world`) were not trained on: they are returned.
  SamplerPosition Advance(const SamplerPosition& at, const SampledBatch& batch, int world,
                          int batch_per_rank, const std::vector<int>& lost);

  // The epoch the next global batch at `at` belongs to: the returned
  // examples' while there are any, else the offset's.
  int64_t Epoch(const SamplerPosition& at) const {
    if (!at.returned.empty()) return at.returned_epoch;
    return size_ > 0 ? at.offset / size_ : 0;
  }
  // True when `epochs` epochs are consumed: the offset is past them and
  // nothing is returned.
  bool Done(const SamplerPosition& at, int64_t epochs) const {
    return at.offset >= epochs * size_ && at.returned.empty();
  }
  // Examples left to train on before `epochs` epochs are consumed.
  int64_t Remaining(const SamplerPosition& at, int64_t epochs) const;

  // The permutation of epoch `epoch` (identical on every rank).
  std::vector<int64_t> Permutation(int64_t epoch);
  int64_t size() const { return size_; }

 private:
  // Positions [from, from + count) of epoch `epoch`'s permutation.
  std::vector<int64_t> Slice(int64_t epoch, int64_t from, int64_t count);

  const int64_t size_;
  const uint64_t seed_;
  absl::Mutex mu_;
  int64_t cached_epoch_ ABSL_GUARDED_BY(mu_) = -1;
  std::vector<int64_t> cached_ ABSL_GUARDED_BY(mu_);
};

}  // namespace muster

#endif  // MUSTER_TRAINER_DATA_SAMPLER_H_
