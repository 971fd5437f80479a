#include "trainer/data/sampler.h"

#include <algorithm>
#include <numeric>
#include <random>

namespace muster {

std::vector<int64_t> DistributedSampler::Permutation(int64_t epoch) {
  absl::MutexLock lock(&mu_);
  if (cached_epoch_ != epoch) {
    cached_.resize(size_);
    std::iota(cached_.begin(), cached_.end(), 0);
    // Fisher-Yates with a fixed generator and mapping, so every rank (and
    // every build) gets the same order.
    std::mt19937_64 gen(seed_ * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epoch));
    for (int64_t i = size_ - 1; i > 0; --i) {
      const int64_t j = static_cast<int64_t>(gen() % static_cast<uint64_t>(i + 1));
      std::swap(cached_[i], cached_[j]);
    }
    cached_epoch_ = epoch;
  }
  return cached_;
}

SampledBatch DistributedSampler::Next(int64_t offset, int world, int rank, int batch_per_rank) {
  SampledBatch b;
  if (size_ <= 0 || world <= 0 || batch_per_rank <= 0) return b;
  b.epoch = offset / size_;
  const int64_t pos = offset % size_;
  b.global_batch = std::min<int64_t>(int64_t{world} * batch_per_rank, size_ - pos);
  const int64_t base = b.global_batch / world, extra = b.global_batch % world;
  const int64_t start = pos + rank * base + std::min<int64_t>(rank, extra);
  const int64_t count = base + (rank < extra ? 1 : 0);
  std::vector<int64_t> perm = Permutation(b.epoch);
  b.indices.assign(perm.begin() + start, perm.begin() + start + count);
  return b;
}

}  // namespace muster
