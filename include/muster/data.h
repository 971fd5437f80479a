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
// share into micro-batches whose gradients accumulate. Use it with the
// loader's workers = 0 (the default): workers would fetch ahead of the step.
// Its position is muster's (checkpointed and moved with the state): save
// and load write nothing.
#ifndef MUSTER_DATA_H_
#define MUSTER_DATA_H_

#include <torch/data/samplers/base.h>

#include <algorithm>
#include <cstddef>
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

}  // namespace muster

#endif  // MUSTER_DATA_H_
