#include "trainer/data/sampler.h"

#include <algorithm>
#include <numeric>
#include <random>

namespace muster {
namespace {

// The share [start, start + count) of a global batch of `global` for `rank`.
std::pair<int64_t, int64_t> Share(int64_t global, int world, int rank) {
  const int64_t base = global / world, extra = global % world;
  return {rank * base + std::min<int64_t>(rank, extra), base + (rank < extra ? 1 : 0)};
}

}  // namespace

std::vector<int64_t> DistributedSampler::Slice(int64_t epoch, int64_t from, int64_t count) {
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
  return std::vector<int64_t>(cached_.begin() + from, cached_.begin() + from + count);
}

std::vector<int64_t> DistributedSampler::Permutation(int64_t epoch) {
  return Slice(epoch, 0, size_);
}

SampledBatch DistributedSampler::Next(const SamplerPosition& at, int world, int rank,
                                      int batch_per_rank) {
  SampledBatch b;
  if (size_ <= 0 || world <= 0 || batch_per_rank <= 0) return b;
  const int64_t capacity = int64_t{world} * batch_per_rank;
  const int64_t epoch = at.offset / size_, pos = at.offset % size_;
  b.from_returned = std::min<int64_t>(capacity, static_cast<int64_t>(at.returned.size()));
  // Returned examples of an earlier epoch finish that epoch on their own.
  const bool earlier = !at.returned.empty() && at.returned_epoch < epoch;
  b.from_permutation = earlier ? 0 : std::min<int64_t>(capacity - b.from_returned, size_ - pos);
  b.epoch = Epoch(at);
  b.global_batch = b.from_returned + b.from_permutation;
  const auto [start, count] = Share(b.global_batch, world, rank);
  // The share, split between the returned examples and the permutation.
  const int64_t returned_end = std::min(start + count, b.from_returned);
  for (int64_t i = start; i < returned_end; ++i) b.indices.push_back(at.returned[i]);
  const int64_t perm_from = std::max(start, b.from_returned) - b.from_returned;
  const int64_t perm_count = start + count - std::max(start, b.from_returned);
  if (perm_count > 0) {
    std::vector<int64_t> more = Slice(epoch, pos + perm_from, perm_count);
    b.indices.insert(b.indices.end(), more.begin(), more.end());
  }
  return b;
}

SamplerPosition DistributedSampler::Advance(const SamplerPosition& at, const SampledBatch& batch,
                                            int world, int batch_per_rank,
                                            const std::vector<int>& lost) {
  SamplerPosition next;
  next.offset = at.offset + batch.from_permutation;
  next.returned.assign(at.returned.begin() + batch.from_returned, at.returned.end());
  for (int r : lost) {
    const SampledBatch share = Next(at, world, r, batch_per_rank);
    next.returned.insert(next.returned.end(), share.indices.begin(), share.indices.end());
  }
  next.returned_epoch = next.returned.empty() ? 0 : batch.epoch;
  return next;
}

int64_t DistributedSampler::Remaining(const SamplerPosition& at, int64_t epochs) const {
  return std::max<int64_t>(0, epochs * size_ - at.offset) +
         static_cast<int64_t>(at.returned.size());
}

}  // namespace muster
