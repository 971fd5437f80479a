#include "trainer/lib/learning_rates.h"

#include <cmath>
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace muster {
namespace {

std::vector<torch::optim::Optimizer*> OptimizersOf(const TrainingState& state) {
  std::vector<torch::optim::Optimizer*> out;
  for (const TrainingState::Optimizer& o : state.optimizers) out.push_back(o.optimizer);
  return out;
}

// Every optimizer's groups, in order: the one list both the schedules and
// the carried rates index.
std::vector<torch::optim::OptimizerParamGroup*> GroupsOf(
    const std::vector<torch::optim::Optimizer*>& optimizers) {
  std::vector<torch::optim::OptimizerParamGroup*> out;
  for (torch::optim::Optimizer* o : optimizers) {
    for (auto& group : o->param_groups()) out.push_back(&group);
  }
  return out;
}

}  // namespace

absl::StatusOr<LearningRates> LearningRates::For(const Options& options,
                                                 const TrainingState& state) {
  LearningRates out(options, OptimizersOf(state));
  if (out.optimizers_.empty()) {
    if (options.group_lr_schedule) {
      return absl::InvalidArgumentError(
          "Options::group_lr_schedule needs State::optimizer: its groups get the rates");
    }
    return out;
  }
  for (const auto* group : out.Groups()) out.base_.push_back(group->options().get_lr());
  if (options.lr_schedule && !options.group_lr_schedule && out.base_.size() > 1 &&
      out.base_[0] == 0) {
    return absl::InvalidArgumentError(
        "Options::lr_schedule: the first parameter group's rate is 0, so the other groups' "
        "ratios to it are undefined; set group_lr_schedule instead");
  }
  return out;
}

std::vector<torch::optim::OptimizerParamGroup*> LearningRates::Groups() const {
  return GroupsOf(optimizers_);
}

const std::vector<double>& LearningRates::Apply(const Progress& p) {
  if (optimizers_.empty()) {
    if (lr_schedule_) rates_ = {lr_schedule_(p)};
    return rates_;
  }
  const std::vector<torch::optim::OptimizerParamGroup*> groups = Groups();
  rates_.resize(groups.size());
  const double first = lr_schedule_ ? lr_schedule_(p) : 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    if (group_lr_schedule_) {
      rates_[g] = group_lr_schedule_(p, g);
    } else if (lr_schedule_) {
      rates_[g] = g == 0 ? first : first * (base_.at(g) / base_.at(0));
    } else {
      rates_[g] = groups[g]->options().get_lr();
      continue;
    }
    groups[g]->options().set_lr(rates_[g]);
  }
  return rates_;
}

absl::Status CarryLearningRates(TrainingState* state) {
  const std::vector<torch::optim::Optimizer*> optimizers = OptimizersOf(*state);
  if (optimizers.empty()) return absl::OkStatus();
  for (const Blob& b : state->blobs) {
    if (b.name == kLearningRatesBlob) {
      return absl::InvalidArgumentError(
          absl::StrCat("State::blobs: '", b.name,
                       "' holds the optimizers' learning rates: name yours otherwise"));
    }
  }
  const auto groups = [optimizers] { return GroupsOf(optimizers); };
  Blob blob;
  blob.name = kLearningRatesBlob;
  blob.save = [groups] {  // each rate exactly, as C's hexadecimal floating point
    std::string text;
    for (const auto* group : groups()) {
      char rate[40];
      std::snprintf(rate, sizeof rate, "%a", group->options().get_lr());
      absl::StrAppend(&text, text.empty() ? "" : " ", rate);
    }
    return text;
  };
  blob.load = [groups](const std::string& bytes) {
    const std::vector<torch::optim::OptimizerParamGroup*> to = groups();
    const std::vector<std::string> words = absl::StrSplit(bytes, ' ', absl::SkipEmpty());
    std::vector<double> rates;
    for (const std::string& w : words) {
      double rate = -1;
      if (std::sscanf(w.c_str(), "%la", &rate) != 1 || !std::isfinite(rate) || rate < 0) break;
      rates.push_back(rate);
    }
    if (rates.size() != words.size() || rates.size() != to.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", bytes.substr(0, 200), "' is not ", to.size(),
                       " learning rates, one for each of the optimizers' parameter groups"));
    }
    for (size_t g = 0; g < to.size(); ++g) to[g]->options().set_lr(rates[g]);
    return absl::OkStatus();
  };
  state->blobs.push_back(std::move(blob));
  return absl::OkStatus();
}

}  // namespace muster
