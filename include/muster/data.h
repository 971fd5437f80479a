// muster::StepSampler: this rank's share of each step for LibTorch's data
// loader (torch::data::make_data_loader), as DistributedRandomSampler is
// for a fixed world. muster decides the share (Distributed::Batch): it
// follows the job's global sample offset, so every example is seen once per
// epoch whatever world sizes the job goes through, and it is re-sharded
// when the world changes. One pass over the loader is one step's share:
//
//   auto job = muster::Distributed::Start(options, state);
//   muster::Distributed& d = **job;
//   auto loader = torch::data::make_data_loader(
//       dataset.map(torch::data::transforms::Stack<>()), muster::StepSampler(d),
//       torch::data::DataLoaderOptions().batch_size(options.batch_per_rank));
//   while (!d.ShouldStop()) {
//     optimizer.zero_grad();
//     d.BeforeBackward();
//     for (auto& batch : *loader) loss_on(batch).backward();
//     if (!d.AfterBackward().ok()) continue;
//     optimizer.step();
//   }
//
// An empty share (a rank left without examples at the end of an epoch)
// makes the pass empty: the rank does no backward, and AfterBackward
// contributes zeros for it. A batch_size below batch_per_rank splits the
// share into micro-batches whose gradients accumulate. LibTorch's workers
// fetch only inside one pass (the loader's prefetch ends with the share),
// so with one batch per step they gain nothing: muster::DataLoader below
// fetches the next step's share while this one trains. Its position is
// muster's (checkpointed and moved with the state): save and load write
// nothing.
#ifndef MUSTER_DATA_H_
#define MUSTER_DATA_H_

#include <torch/data/samplers/base.h>

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "muster/muster.h"

namespace muster {

class StepSampler : public torch::data::samplers::Sampler<> {
 public:
  // `d` must outlive the sampler.
  explicit StepSampler(const Distributed& d) : d_(&d) {}

  // The loader calls it when a pass begins: the pass serves the share of
  // the step ShouldStop prepared. `new_size` is ignored.
  void reset(c10::optional<size_t> /*new_size*/ = c10::nullopt) override { served_ = 0; }

  c10::optional<std::vector<size_t>> next(size_t batch_size) override {
    const std::vector<int64_t>& share = d_->Batch();
    if (served_ >= share.size() || batch_size == 0) return c10::nullopt;
    const size_t n = std::min(batch_size, share.size() - served_);
    std::vector<size_t> out(share.begin() + static_cast<std::ptrdiff_t>(served_),
                            share.begin() + static_cast<std::ptrdiff_t>(served_ + n));
    served_ += n;
    return out;
  }

  void save(torch::serialize::OutputArchive& /*archive*/) const override {}
  void load(torch::serialize::InputArchive& /*archive*/) override {}

 private:
  const Distributed* d_;
  size_t served_ = 0;
};

namespace data_internal {

// A dataset's example: its ExampleType, or a mapped dataset's batch element.
template <typename D, typename = void>
struct ExampleOf {
  using type = typename D::OutputBatchType::value_type;
};
template <typename D>
struct ExampleOf<D, std::void_t<typename D::ExampleType>> {
  using type = typename D::ExampleType;
};

template <typename D, typename = void>
struct HasGet : std::false_type {};
template <typename D>
struct HasGet<D, std::void_t<decltype(std::declval<D&>().get(size_t{0}))>> : std::true_type {};

// Example `index` of `dataset`.
template <typename D>
typename ExampleOf<D>::type Get(D& dataset, size_t index) {
  if constexpr (HasGet<D>::value) {
    return dataset.get(index);
  } else {
    auto batch = dataset.get_batch(typename D::BatchRequestType(index));
    return std::move(batch.at(0));
  }
}

}  // namespace data_internal

// muster::DataLoader: this rank's examples of each step, fetched by worker
// threads, and the next steps' fetched ahead while this one trains, as
// torch.utils.data.DataLoader's workers and prefetch do for DDP:
//
//   muster::DataLoader<ImageFolder> loader(d, dataset, /*workers=*/4);
//   while (!d.ShouldStop()) {
//     std::vector<torch::data::Example<>> batch = loader.Batch();   // d.Batch()'s
//     ...
//   }
//
// What a step trains on is always Distributed::Batch(): the loader only
// decides what is ready when the step asks, so no example is seen twice or
// lost, whatever the world does. Ahead it fetches UpcomingBatch() of the
// next `steps_ahead` steps (default 2), the shares as they stand if the
// world stays. When the world changes at the
// boundary (a join, a leave, a failure), the shares move: examples fetched
// ahead that the rank's new share still holds are used, the others are
// dropped (dropped_ahead()) and fetched by the rank they now belong to.
//
// `Dataset` is a torch::data dataset (get(index) -> ExampleType), or one
// with per-example transforms mapped over it as LibTorch's loader takes it
// (`Images(root).map(torch::data::transforms::Normalize<>(mean, stddev))`,
// each example fetched as get_batch of one). The workers fetch
// concurrently, so it must allow that (read-only state, as LibTorch's own
// loader's workers require). workers = 0 fetches on the calling thread,
// one example after another, nothing ahead.
//
// Thread-safety: Batch() belongs to the training thread.
template <typename Dataset>
class DataLoader {
 public:
  using Example = typename data_internal::ExampleOf<Dataset>::type;

  // `d` must outlive the loader.
  DataLoader(Distributed& d, Dataset dataset, int workers, int steps_ahead = 2)
      : d_(&d), dataset_(std::move(dataset)), steps_ahead_(std::max(1, steps_ahead)) {
    for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { Work(); });
  }
  ~DataLoader() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      queue_.clear();
    }
    wake_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // The examples of Batch(), in its order: those fetched ahead as they are,
  // the rest fetched now (by the workers, in parallel). Then the workers
  // start on the next steps' (UpcomingBatch). Call once per step, after
  // ShouldStop.
  std::vector<Example> Batch() {
    const std::vector<int64_t> share = d_->Batch();
    std::vector<int64_t> next;  // the next steps' shares, the nearest first
    for (int k = 1; k <= steps_ahead_ && !threads_.empty(); ++k) {
      const std::vector<int64_t> more = d_->UpcomingBatch(k);
      next.insert(next.end(), more.begin(), more.end());
    }
    if (threads_.empty()) {
      std::vector<Example> out;
      for (int64_t i : share) out.push_back(data_internal::Get(dataset_, static_cast<size_t>(i)));
      return out;
    }
    std::vector<std::shared_future<Example>> wanted;
    {
      std::lock_guard<std::mutex> lock(mu_);
      Keep(share, next);
      for (auto it = share.rbegin(); it != share.rend(); ++it) {
        if (ready_.count(*it) == 0) Fetch(*it, /*first=*/true);
        else ++fetched_ahead_;
      }
      for (int64_t i : share) wanted.push_back(ready_.at(i));
      for (int64_t i : next) {
        if (ready_.count(i) == 0) Fetch(i, /*first=*/false);
      }
    }
    wake_.notify_all();
    std::vector<Example> out;
    out.reserve(wanted.size());
    for (const std::shared_future<Example>& f : wanted) out.push_back(f.get());
    std::lock_guard<std::mutex> lock(mu_);
    const std::set<int64_t> ahead(next.begin(), next.end());
    for (int64_t i : share) {
      if (ahead.count(i) == 0) ready_.erase(i);
    }
    return out;
  }

  // Examples a step found fetched ahead, and examples fetched ahead that a
  // world change moved to another rank.
  int64_t fetched_ahead() const {
    std::lock_guard<std::mutex> lock(mu_);
    return fetched_ahead_;
  }
  int64_t dropped_ahead() const {
    std::lock_guard<std::mutex> lock(mu_);
    return dropped_ahead_;
  }

 private:
  struct Job {
    int64_t index;
    std::promise<Example> promise;
  };

  // Drops what neither this step nor the next holds (fetched, or still
  // queued); a fetch under way finishes for nothing.
  void Keep(const std::vector<int64_t>& share, const std::vector<int64_t>& next) {
    std::set<int64_t> keep(share.begin(), share.end());
    keep.insert(next.begin(), next.end());
    for (auto it = ready_.begin(); it != ready_.end();) {
      if (keep.count(it->first) != 0) {
        ++it;
        continue;
      }
      ++dropped_ahead_;
      it = ready_.erase(it);
    }
    queue_.erase(std::remove_if(queue_.begin(), queue_.end(),
                                [&](const Job& j) { return keep.count(j.index) == 0; }),
                 queue_.end());
  }

  void Fetch(int64_t index, bool first) {
    Job job{index, std::promise<Example>()};
    ready_[index] = job.promise.get_future().share();
    if (first) queue_.push_front(std::move(job));
    else queue_.push_back(std::move(job));
  }

  void Work() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      Job job = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      try {
        job.promise.set_value(data_internal::Get(dataset_, static_cast<size_t>(job.index)));
      } catch (...) {
        job.promise.set_exception(std::current_exception());  // rethrown by Batch()
      }
      lock.lock();
    }
  }

  Distributed* d_;
  Dataset dataset_;
  const int steps_ahead_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::deque<Job> queue_;
  std::map<int64_t, std::shared_future<Example>> ready_;
  bool stopping_ = false;
  int64_t fetched_ahead_ = 0;
  int64_t dropped_ahead_ = 0;
  std::vector<std::thread> threads_;
};

}  // namespace muster

#endif  // MUSTER_DATA_H_
