// LearningRates: the schedule of Options (lr_schedule, group_lr_schedule)
// applied to the optimizers' parameter groups before each step
// (docs/library.md, "Learning rates"). With several optimizers, their
// groups count as one list, in the order the optimizers were registered.
#ifndef MUSTER_TRAINER_LIB_LEARNING_RATES_H_
#define MUSTER_TRAINER_LIB_LEARNING_RATES_H_

#include <torch/optim/optimizer.h>

#include <functional>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "muster/options.h"
#include "trainer/checkpoint/training_state.h"

namespace muster {

class LearningRates {
 public:
  // Keeps each group's rate at this point (the base of lr_schedule's
  // ratios). INVALID_ARGUMENT when a schedule cannot apply: a
  // group_lr_schedule without an optimizer, or lr_schedule over several
  // groups whose first rate is 0. `state` may hold no optimizer; its
  // optimizers must outlive this object.
  static absl::StatusOr<LearningRates> For(const Options& options, const TrainingState& state);

  // Sets the rates of the step at `p` on the optimizer's groups (where a
  // schedule is set) and returns them: each group's rate in effect; without
  // an optimizer, lr_schedule's rate (none without one).
  const std::vector<double>& Apply(const Progress& p);
  const std::vector<double>& current() const { return rates_; }

 private:
  LearningRates(const Options& options, std::vector<torch::optim::Optimizer*> optimizers)
      : lr_schedule_(options.lr_schedule),
        group_lr_schedule_(options.group_lr_schedule),
        optimizers_(std::move(optimizers)) {}
  // Every optimizer's groups, in order.
  std::vector<torch::optim::OptimizerParamGroup*> Groups() const;

  std::function<double(const Progress&)> lr_schedule_;
  std::function<double(const Progress&, size_t)> group_lr_schedule_;
  std::vector<torch::optim::Optimizer*> optimizers_;
  std::vector<double> base_;   // each group's rate at For
  std::vector<double> rates_;  // each group's rate in this step
};

// Where no schedule is set, the rates are the program's own: it may lower
// them as it trains (at a step it reads from Distributed::step()). They are
// then training state: `state` gets a blob (kLearningRatesBlob) that saves
// every group's rate, LearningRates' order, and loads them back, so that
// checkpoints, the state transfer and the ranks' agreement carry them as
// they carry the optimizers' state. Nothing where `state` holds no
// optimizer. INVALID_ARGUMENT when one of the program's blobs has the name.
absl::Status CarryLearningRates(TrainingState* state);

}  // namespace muster

#endif  // MUSTER_TRAINER_LIB_LEARNING_RATES_H_
