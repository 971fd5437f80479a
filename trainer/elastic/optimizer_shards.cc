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

// `params`' values, flat, in order.
torch::Tensor FlatValues(const std::vector<torch::Tensor>& params) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> parts;
  for (const torch::Tensor& p : params) parts.push_back(p.detach().reshape({-1}));
  return Flat(parts);
}

// A group can be sharded: float32 on one device.
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

using Fields = std::map<std::string, torch::Tensor>;

// The fields of `range` of the group's flat state: each per-element field
// (the parameter's shape and dtype) concatenated over `params` and cut to
// the range; each scalar field (a 0-dim step count of another dtype) as
// every parameter holds it. Empty when no parameter has state.
// INVALID_ARGUMENT when some have state and some do not, their scalars
// differ, or a field is neither per-element nor a scalar.
absl::StatusOr<Fields> SliceState(torch::optim::Optimizer& optimizer, const OptimizerCodec& codec,
                                  const torch::optim::OptimizerOptions& options,
                                  const std::vector<torch::Tensor>& params, ElementRange range,
                                  const std::string& where) {
  std::map<std::string, std::vector<torch::Tensor>> per_element;
  Fields out;
  size_t with_state = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const torch::Tensor& p = params[i];
    torch::optim::OptimizerParamState* state = FindOptimizerState(optimizer, p);
    if (state == nullptr) continue;
    ++with_state;
    for (auto& [name, t] : codec.Save(*state, options)) {
      if (t.sizes() == p.sizes() && t.scalar_type() == p.scalar_type()) {
        per_element[name].push_back(t.reshape({-1}));
        continue;
      }
      if (t.dim() != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": parameter ", i, "'s \"", name,
                         "\" is neither one value per element nor a scalar"));
      }
      auto [it, first] = out.emplace(name, t.clone());
      if (!first && !torch::equal(it->second, t)) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": its parameters' \"", name, "\" differ (", it->second.item<double>(), " and ",
            t.item<double>(), "); a sharded group keeps one for all its parameters"));
      }
    }
  }
  if (with_state == 0) return Fields{};
  if (with_state != params.size()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", with_state, " of its ",
                                                   params.size(),
                                                   " trained parameters have optimizer state"));
  }
  for (auto& [name, parts] : per_element) {
    out[name] = torch::cat(parts).narrow(0, range.begin, range.size()).clone();
  }
  return out;
}

}  // namespace

absl::Status OptimizerShards::Collect(const std::vector<torch::optim::Optimizer*>& optimizers,
                                      std::vector<Group>* groups, std::vector<int64_t>* elements) {
  for (size_t o = 0; o < optimizers.size(); ++o) {
    const OptimizerCodec* codec = BuiltinOptimizerCodec(*optimizers[o]);
    if (codec == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer ", o,
                       ": muster shards the state of SGD, Adam, AdamW, RMSprop and "
                       "Adagrad only"));
    }
    if (codec->name() == "LBFGS") {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer ", o,
                       " is LBFGS, whose step reads every gradient at once: its state "
                       "cannot be sharded"));
    }
    auto& param_groups = optimizers[o]->param_groups();
    for (size_t i = 0; i < param_groups.size(); ++i) {
      MUSTER_RETURN_IF_ERROR(
          CheckGroup(param_groups[i], absl::StrCat("optimizer ", o, " group ", i)));
      Group group{optimizers[o], codec, i, {}, {}, {}};
      int64_t n = 0;
      for (const torch::Tensor& p : param_groups[i].params()) {
        // A frozen parameter gets no gradient, and the optimizer skips it:
        // it stays in the group's list as it is.
        (p.requires_grad() ? group.params : group.frozen).push_back(p);
        if (p.requires_grad()) n += p.numel();
      }
      elements->push_back(n);
      groups->push_back(std::move(group));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<OptimizerShards>> OptimizerShards::Make(
    const std::vector<torch::optim::Optimizer*>& optimizers, int rank,
    const std::vector<int>& node_of_rank, int copies) {
  if (rank < 0 || rank >= static_cast<int>(node_of_rank.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is not in a world of ", node_of_rank.size()));
  }
  std::vector<Group> groups;
  std::vector<int64_t> elements;
  MUSTER_RETURN_IF_ERROR(Collect(optimizers, &groups, &elements));
  MUSTER_ASSIGN_OR_RETURN(ShardLayout layout, ShardLayout::Make(elements, node_of_rank, copies));
  torch::NoGradGuard no_grad;
  // Everything is built aside first: a refusal changes nothing.
  std::vector<std::vector<std::unique_ptr<torch::optim::OptimizerParamState>>> states(
      groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    Group& group = groups[g];
    if (elements[g] == 0) continue;  // nothing to shard: the group stays as it is
    const auto& param_group = group.optimizer->param_groups()[group.index];
    const torch::Tensor flat = FlatValues(group.params);
    for (int shard : layout.KeptBy(rank)) {
      const ElementRange range = layout.Range(static_cast<int>(g), shard);
      torch::Tensor master = flat.narrow(0, range.begin, range.size()).clone();
      master.set_requires_grad(true);
      group.masters.push_back(master);
      MUSTER_ASSIGN_OR_RETURN(Fields fields,
                              SliceState(*group.optimizer, *group.codec, param_group.options(),
                                         group.params, range, absl::StrCat("optimizer group ", g)));
      // No state yet (a fresh optimizer): the masters get none either, and
      // the optimizer makes it at the first step as it would have.
      std::unique_ptr<torch::optim::OptimizerParamState> state;
      if (!fields.empty()) {
        state = group.codec->Initial(master, param_group, *group.optimizer);
        if (state != nullptr) {
          MUSTER_RETURN_IF_ERROR(group.codec->Load(fields, param_group.options(), state.get()));
        }
      }
      states[g].push_back(std::move(state));
    }
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    Group& group = groups[g];
    if (group.masters.empty()) continue;
    for (const torch::Tensor& p : group.params) EraseOptimizerState(*group.optimizer, p);
    for (size_t k = 0; k < group.masters.size(); ++k) {
      if (states[g][k] != nullptr) {
        PutOptimizerState(*group.optimizer, group.masters[k], std::move(states[g][k]));
      }
    }
    std::vector<torch::Tensor> listed = group.masters;
    listed.insert(listed.end(), group.frozen.begin(), group.frozen.end());
    group.optimizer->param_groups()[group.index].params() = std::move(listed);
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

torch::Tensor OptimizerShards::FlatParameters(int g) const { return FlatValues(groups_[g].params); }

void OptimizerShards::SetGradients(int g, const torch::Tensor& averaged) {
  if (groups_[g].masters.empty()) return;
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
  if (groups_[g].masters.empty()) return;
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
  for (size_t k = 0; k < groups_[g].masters.size(); ++k) {
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
