#include "trainer/elastic/optimizer_shards.h"

#include <torch/torch.h>

#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "trainer/checkpoint/optimizer_codecs.h"
#include "trainer/checkpoint/state_tensors.h"

namespace muster {
namespace {

torch::Tensor Flat(const std::vector<torch::Tensor>& parts) {
  return parts.empty() ? torch::zeros({0}, torch::kFloat32) : torch::cat(parts);
}

// Group `index` of `optimizer` can be sharded: float32 on one device.
absl::Status CheckGroup(const torch::optim::OptimizerParamGroup& group, const std::string& where) {
  const std::vector<torch::Tensor>& params = group.params();
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].scalar_type() != torch::kFloat32) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": parameter ", i, " is ", c10::toString(params[i].scalar_type()),
                       "; sharded optimizer state needs float32 parameters"));
    }
    if (params[i].device() != params[0].device()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": its parameters are on ", params[0].device().str(), " and ",
          params[i].device().str(), "; a sharded group's parameters must share a device"));
    }
  }
  return absl::OkStatus();
}

// The fields of `range` of the group's flat state: each per-element field
// (a parameter's shape) concatenated over the group's parameters and cut
// to the range, each scalar field (a step count) as every parameter holds
// it. Empty when no parameter has state; INVALID_ARGUMENT when some have
// and some do not, or their scalars differ.
absl::StatusOr<std::map<std::string, torch::Tensor>> SliceState(
    torch::optim::Optimizer& optimizer, const OptimizerCodec& codec,
    const torch::optim::OptimizerParamGroup& group, ElementRange range, const std::string& where) {
  std::map<std::string, std::vector<torch::Tensor>> per_element;
  std::map<std::string, torch::Tensor> out;
  size_t with_state = 0;
  for (const torch::Tensor& p : group.params()) {
    torch::optim::OptimizerParamState* state = FindOptimizerState(optimizer, p);
    if (state == nullptr) continue;
    ++with_state;
    for (auto& [name, t] : codec.Save(*state, group.options())) {
      if (t.dim() > 0) {
        per_element[name].push_back(t.reshape({-1}));
        continue;
      }
      auto [it, first] = out.emplace(name, t.clone());
      if (!first && !torch::equal(it->second, t)) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": its parameters' \"", name, "\" differ (", it->second.item<double>(), " and ",
            t.item<double>(), "); a sharded group keeps one for all its parameters"));
      }
    }
  }
  if (with_state == 0) return std::map<std::string, torch::Tensor>{};
  if (with_state != group.params().size()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", with_state, " of its ",
                                                   group.params().size(),
                                                   " parameters have optimizer state"));
  }
  for (auto& [name, parts] : per_element) {
    out[name] = torch::cat(parts).narrow(0, range.begin, range.size()).clone();
  }
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<OptimizerShards>> OptimizerShards::Make(
    const std::vector<torch::optim::Optimizer*>& optimizers, int rank,
    const std::vector<int>& node_of_rank, int copies) {
  if (rank < 0 || rank >= static_cast<int>(node_of_rank.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is not in a world of ", node_of_rank.size()));
  }
  std::vector<Group> groups;
  std::vector<int64_t> elements;
  for (size_t o = 0; o < optimizers.size(); ++o) {
    const OptimizerCodec* codec = BuiltinOptimizerCodec(*optimizers[o]);
    if (codec == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer ", o, ": muster shards the state of SGD, Adam, AdamW, RMSprop and "
          "Adagrad only"));
    }
    if (codec->name() == "LBFGS") {
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer ", o, " is LBFGS, whose step reads every gradient at once: its state "
          "cannot be sharded"));
    }
    auto& param_groups = optimizers[o]->param_groups();
    for (size_t i = 0; i < param_groups.size(); ++i) {
      const std::string where = absl::StrCat("optimizer ", o, " group ", i);
      MUSTER_RETURN_IF_ERROR(CheckGroup(param_groups[i], where));
      int64_t n = 0;
      for (const torch::Tensor& p : param_groups[i].params()) n += p.numel();
      elements.push_back(n);
      groups.push_back(Group{optimizers[o], codec, i, param_groups[i].params(), {}});
    }
  }
  MUSTER_ASSIGN_OR_RETURN(ShardLayout layout, ShardLayout::Make(elements, node_of_rank, copies));
  torch::NoGradGuard no_grad;
  // Every check comes before the parameter lists change; a refusal leaves
  // at most the codec's initial state on parameters that had none, which
  // changes nothing a step computes.
  std::vector<std::vector<std::map<std::string, torch::Tensor>>> states(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    Group& group = groups[g];
    EnsureOptimizerState(*group.optimizer, *group.codec);
    const auto& param_group = group.optimizer->param_groups()[group.index];
    const torch::Tensor flat = Flat([&] {
      std::vector<torch::Tensor> parts;
      for (const torch::Tensor& p : group.params) parts.push_back(p.detach().reshape({-1}));
      return parts;
    }());
    for (int shard : layout.KeptBy(rank)) {
      const ElementRange range = layout.Range(static_cast<int>(g), shard);
      torch::Tensor master = flat.narrow(0, range.begin, range.size()).clone();
      master.set_requires_grad(true);
      group.masters.push_back(master);
      MUSTER_ASSIGN_OR_RETURN(
          auto fields,
          SliceState(*group.optimizer, *group.codec, param_group, range,
                     absl::StrCat("optimizer group ", g)));
      states[g].push_back(std::move(fields));
    }
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    Group& group = groups[g];
    auto& param_group = group.optimizer->param_groups()[group.index];
    for (size_t k = 0; k < group.masters.size(); ++k) {
      if (states[g][k].empty()) continue;
      std::unique_ptr<torch::optim::OptimizerParamState> state =
          group.codec->Initial(group.masters[k], param_group, *group.optimizer);
      if (state == nullptr) continue;
      MUSTER_RETURN_IF_ERROR(group.codec->Load(states[g][k], param_group.options(), state.get()));
      PutOptimizerState(*group.optimizer, group.masters[k], std::move(state));
    }
    for (const torch::Tensor& p : group.params) EraseOptimizerState(*group.optimizer, p);
    param_group.params() = group.masters;
  }
  return std::unique_ptr<OptimizerShards>(
      new OptimizerShards(std::move(layout), rank, std::move(groups)));
}

OptimizerShards::OptimizerShards(ShardLayout layout, int rank, std::vector<Group> groups)
    : layout_(std::move(layout)), rank_(rank), groups_(std::move(groups)) {}

torch::Tensor OptimizerShards::FlatGradients(int g) const {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> parts;
  for (const torch::Tensor& p : groups_[g].params) {
    parts.push_back(p.grad().defined() ? p.grad().reshape({-1})
                                       : torch::zeros({p.numel()}, p.options()));
  }
  return Flat(parts);
}

torch::Tensor OptimizerShards::FlatParameters(int g) const {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> parts;
  for (const torch::Tensor& p : groups_[g].params) parts.push_back(p.detach().reshape({-1}));
  return Flat(parts);
}

void OptimizerShards::SetGradients(int g, const torch::Tensor& averaged) {
  torch::NoGradGuard no_grad;
  const std::vector<int> kept = layout_.KeptBy(rank_);
  for (size_t k = 0; k < kept.size(); ++k) {
    const ElementRange range = layout_.Range(g, kept[k]);
    torch::Tensor& master = groups_[g].masters[k];
    const torch::Tensor slice = averaged.narrow(0, range.begin, range.size());
    if (master.grad().defined()) {
      master.mutable_grad().copy_(slice);
    } else {
      master.mutable_grad() = slice.clone();
    }
  }
}

void OptimizerShards::WriteOwn(int g, torch::Tensor* flat) const {
  torch::NoGradGuard no_grad;
  const ElementRange own = layout_.Range(g, rank_);
  flat->narrow(0, own.begin, own.size()).copy_(groups_[g].masters[0]);
}

void OptimizerShards::Install(int g, const torch::Tensor& flat) {
  torch::NoGradGuard no_grad;
  int64_t offset = 0;
  for (torch::Tensor& p : groups_[g].params) {
    p.copy_(flat.narrow(0, offset, p.numel()).view_as(p));
    offset += p.numel();
  }
  const std::vector<int> kept = layout_.KeptBy(rank_);
  for (size_t k = 0; k < kept.size(); ++k) {
    const ElementRange range = layout_.Range(g, kept[k]);
    groups_[g].masters[k].copy_(flat.narrow(0, range.begin, range.size()));
  }
}

int64_t OptimizerShards::StateElements() const {
  int64_t n = 0;
  for (const Group& group : groups_) {
    const auto& param_group = group.optimizer->param_groups()[group.index];
    for (const torch::Tensor& master : group.masters) {
      torch::optim::OptimizerParamState* state = FindOptimizerState(*group.optimizer, master);
      if (state == nullptr) continue;
      for (const auto& [name, t] : group.codec->Save(*state, param_group.options())) {
        if (t.dim() > 0) n += t.numel();
      }
    }
  }
  return n;
}

}  // namespace muster
