#include "trainer/lib/learning_rates.h"

namespace muster {

absl::StatusOr<LearningRates> LearningRates::For(const Options& options,
                                                 torch::optim::Optimizer* optimizer) {
  LearningRates out(options, optimizer);
  if (optimizer == nullptr) {
    if (options.group_lr_schedule) {
      return absl::InvalidArgumentError(
          "Options::group_lr_schedule needs State::optimizer: its groups get the rates");
    }
    return out;
  }
  for (auto& group : optimizer->param_groups()) out.base_.push_back(group.options().get_lr());
  if (options.lr_schedule && !options.group_lr_schedule && out.base_.size() > 1 &&
      out.base_[0] == 0) {
    return absl::InvalidArgumentError(
        "Options::lr_schedule: the first parameter group's rate is 0, so the other groups' "
        "ratios to it are undefined; set group_lr_schedule instead");
  }
  return out;
}

const std::vector<double>& LearningRates::Apply(const Progress& p) {
  if (optimizer_ == nullptr) {
    if (lr_schedule_) rates_ = {lr_schedule_(p)};
    return rates_;
  }
  auto& groups = optimizer_->param_groups();
  rates_.resize(groups.size());
  const double first = lr_schedule_ ? lr_schedule_(p) : 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    if (group_lr_schedule_) {
      rates_[g] = group_lr_schedule_(p, g);
    } else if (lr_schedule_) {
      rates_[g] = g == 0 ? first : first * (base_.at(g) / base_.at(0));
    } else {
      rates_[g] = groups[g].options().get_lr();
      continue;
    }
    groups[g].options().set_lr(rates_[g]);
  }
  return rates_;
}

}  // namespace muster
