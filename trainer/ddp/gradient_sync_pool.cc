// GradientSync's pooled buckets (GradientSyncOptions::take): the pool of
// buffers, the parts a bucket is reduced in (a streamed bucket's pool
// buffer after pool buffer), and a salvage's re-reduction through them.
#include "trainer/ddp/gradient_sync.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>

#include "common/status_macros.h"

namespace muster {

void GradientSync::Acquire(Bucket& b) {
  // Every bucket's slots are written before it is reduced: no zeros.
  const int64_t elements = std::min(b.elements, pool_elements_);
  while (!b.buffer.defined()) {
    if (!pool_.empty()) {
      b.buffer = pool_.back().narrow(0, 0, elements);
      pool_.pop_back();
      return;
    }
    const bool in_flight = std::any_of(buckets_.begin(), buckets_.end(), [](const Bucket& o) {
      return o.launched && !o.done && o.buffer.defined();
    });
    if (!in_flight || pool_waited_ >= kPoolWait) {
      b.buffer = torch::empty({pool_elements_}, params_[0].options().dtype(torch::kFloat32))
                     .narrow(0, 0, elements);
      return;
    }
    // A bucket in flight gives its buffer back (GiveBack). Backward waits
    // for it kPoolWait at most in a pass: a peer that hangs holds that
    // bucket's collective until its deadline, and a backward blocked that
    // long would count as this rank's own stall (training_progress.h).
    const auto start = std::chrono::steady_clock::now();
    cv_.WaitFor(&mu_, kPoolWait - pool_waited_);
    pool_waited_ += absl::FromChrono(std::chrono::steady_clock::now() - start);
  }
}

void GradientSync::GiveBack(Bucket& b) {
  if (!b.buffer.defined()) return;
  constexpr auto kFloat = static_cast<int64_t>(sizeof(float));
  if (pool_.size() < kPooled && b.buffer.storage_offset() == 0 &&
      static_cast<int64_t>(b.buffer.storage().nbytes()) == pool_elements_ * kFloat) {
    pool_.push_back(b.buffer.as_strided({pool_elements_}, {1}, 0));
  }
  b.buffer = torch::Tensor();  // past kPooled: freed
  cv_.NotifyAll();
}

absl::Status GradientSync::WithBuffer(Bucket& b, const std::function<absl::Status()>& use) {
  if (!pooled_) return use();
  {
    MutexLock lock(&mu_);
    Acquire(b);
  }
  const absl::Status s = use();
  MutexLock lock(&mu_);
  GiveBack(b);
  return s;
}

std::vector<std::vector<GradientSync::Piece>> GradientSync::Parts(const Bucket& b,
                                                                   bool by_segments) const {
  const int64_t room = b.buffer.numel();  // the bucket, or a pool buffer
  std::vector<int64_t> counts = {b.elements};
  if (by_segments) counts.assign(b.scatter.begin(), b.scatter.end());
  // A bucket that fits takes each segment whole in one part.
  const int64_t piece =
      b.streamed ? std::max<int64_t>(room / static_cast<int64_t>(counts.size()), 1) : room;
  std::vector<std::vector<Piece>> parts;
  std::vector<int64_t> done(counts.size(), 0);
  do {
    std::vector<Piece>& part = parts.emplace_back();
    int64_t at = 0;
    for (size_t r = 0; r < counts.size(); ++r) {
      const int64_t n = std::min(piece, counts[r] - done[r]);
      part.push_back({at + done[r], n});
      done[r] += n;
      at += counts[r];
    }
  } while (done != counts);
  return parts;
}

absl::Status GradientSync::ForEachPart(
    Bucket& b, bool by_segments, bool fill, bool use_grad,
    const std::function<absl::Status(const std::vector<Piece>&, const torch::Tensor&)>& use) {
  if (b.elements == 0) return absl::OkStatus();
  for (const std::vector<Piece>& pieces : Parts(b, by_segments)) {
    int64_t size = 0;
    for (const Piece& p : pieces) size += p.n;
    const torch::Tensor part = b.buffer.narrow(0, 0, size);
    int64_t at = 0;
    for (const Piece& p : pieces) {
      if (fill) FillPiece(b, p, part.narrow(0, at, p.n), use_grad);
      at += p.n;
    }
    MUSTER_RETURN_IF_ERROR(use(pieces, part));
  }
  return absl::OkStatus();
}

absl::Status GradientSync::ReduceAndTake(Communicator* comm, size_t i, bool fill,
                                         absl::Time deadline) {
  Bucket& b = buckets_[i];
  MUSTER_RETURN_IF_ERROR(ForEachPart(
      b, /*by_segments=*/true, fill, /*use_grad=*/true,
      [&](const std::vector<Piece>& pieces, const torch::Tensor& part) {
        std::vector<size_t> counts;
        for (const Piece& p : pieces) counts.push_back(static_cast<size_t>(p.n));
        MUSTER_RETURN_IF_ERROR(ReduceScatterGradientTensor(comm, part, counts, ReduceOp::kAverage,
                                                           deadline, columns_));
        int64_t at = 0;
        for (const Piece& p : pieces) {
          if (p.n > 0) options_.take(i, p.offset, part.narrow(0, at, p.n));
          at += p.n;
        }
        return absl::OkStatus();
      }));
  if (i + 1 < buckets_.size()) return absl::OkStatus();
  return AllReduceTensor(comm, WordsView(), ReduceOp::kAverage, deadline);
}

std::pair<int64_t, int64_t> GradientSync::SlotInPiece(const Bucket& b, size_t j,
                                                      const Piece& piece) const {
  const int64_t at = b.offsets[j];
  return {std::max(at, piece.offset),
          std::min(at + params_[b.params[j]].numel(), piece.offset + piece.n)};
}

void GradientSync::FillPiece(const Bucket& b, const Piece& piece, const torch::Tensor& values,
                             bool use_grad) {
  for (size_t j = 0; j < b.params.size(); ++j) {
    const auto [lo, hi] = SlotInPiece(b, j, piece);
    if (hi <= lo) continue;
    FillSlot(params_[b.params[j]], lo - b.offsets[j],
             values.narrow(0, lo - piece.offset, hi - lo), use_grad);
  }
}

void GradientSync::InstallPiece(const Bucket& b, const Piece& piece, const torch::Tensor& values,
                                const std::vector<float>& words) {
  torch::NoGradGuard no_grad;
  for (size_t j = 0; j < b.params.size(); ++j) {
    if (words[buckets_.size() + b.params[j]] <= 0) continue;  // as InstallBucket
    const auto [lo, hi] = SlotInPiece(b, j, piece);
    if (hi <= lo) continue;
    torch::Tensor& p = params_[b.params[j]];
    // Pieces still to come are read from it: a .grad of its own, zeros
    // where the rank had none.
    if (!p.grad().defined()) {
      p.mutable_grad() = torch::zeros_like(p, torch::MemoryFormat::Contiguous);
    } else if (!p.grad().is_contiguous()) {
      p.mutable_grad() = p.grad().contiguous();
    }
    p.mutable_grad().view({-1}).narrow(0, lo - b.offsets[j], hi - lo).copy_(
        values.narrow(0, lo - piece.offset, hi - lo));
  }
}

absl::Status GradientSync::ResyncPooled(Communicator* comm, bool contribute, int divide_by,
                                        ReduceOp op, absl::Time deadline) {
  // The words first (which parameters have a gradient anywhere), then each
  // bucket through a pooled buffer, installed as it comes back.
  if (buckets_.empty()) return absl::OkStatus();
  MUSTER_RETURN_IF_ERROR(AllReduceTensor(comm, words_, op, deadline));
  if (divide_by > 0) words_.div_(comm->size());
  const std::vector<float> words = ReadWords();
  Install(words, /*grads=*/false);
  for (size_t i = 0; i < buckets_.size(); ++i) {
    Bucket& b = buckets_[i];
    MUSTER_RETURN_IF_ERROR(WithBuffer(b, [&] {
      return ForEachPart(b, /*by_segments=*/false, /*fill=*/true, contribute,
                         [&](const std::vector<Piece>& pieces, const torch::Tensor& part) {
                           MUSTER_RETURN_IF_ERROR(AllReduceGradientTensor(comm, part, op, deadline));
                           if (divide_by > 0) part.div_(divide_by);
                           InstallPiece(b, pieces.front(), part, words);
                           return absl::OkStatus();
                         });
    }));
  }
  return absl::OkStatus();
}

}  // namespace muster
