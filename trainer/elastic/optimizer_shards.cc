// OptimizerShards (optimizer_shards.h): collecting the groups, laying them
// out, building a rank's shards, and the helpers its other files share
// (optimizer_shards_internal.h).
#include "trainer/elastic/optimizer_shards.h"

#include <c10/util/strides.h>
#include <torch/torch.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "trainer/checkpoint/optimizer_codecs.h"
#include "trainer/checkpoint/state_tensors.h"
#include "trainer/comm/values.h"
#include "trainer/ddp/device_comm.h"
#include "trainer/ddp/storage_alias.h"
#include "trainer/elastic/optimizer_shards_internal.h"

namespace muster {

// Whether the optimizer state field `t` of `param` is per element (the
// parameter's shape and dtype), not a scalar such as a step count.
bool PerElement(const torch::Tensor& t, const torch::Tensor& param) {
  return t.sizes() == param.sizes() && t.scalar_type() == param.scalar_type();
}

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

// Whether two float32 tensors of one shape hold the same bits (-0 is not
// +0, as the state digests see it).
bool SameBits(const torch::Tensor& a, const torch::Tensor& b) {
  return torch::equal(a.detach().view(torch::kInt32), b.detach().view(torch::kInt32));
}

// The elements [begin, end) of `range` ∩ `other`, empty when they do not meet.
ElementRange Overlap(ElementRange range, ElementRange other) {
  const int64_t begin = std::max(range.begin, other.begin), end = std::min(range.end, other.end);
  return ElementRange{begin, std::max(begin, end)};
}

// Whether a master this rank keeps holds values its parameters do not
// (after a gather, a drift: CheckCopiesAgree). Each master is compared with
// the parameters it cuts through, in place: a flat copy of the group would
// cost the group's size.
bool MastersDifferFromParameters(const std::vector<torch::Tensor>& params,
                          const std::vector<torch::Tensor>& masters, int g,
                          const ShardLayout& layout, int rank) {
  torch::NoGradGuard no_grad;
  const std::vector<int> kept = layout.KeptBy(rank);
  for (size_t k = 0; k < kept.size() && k < masters.size(); ++k) {
    const ElementRange range = layout.Range(g, kept[k]);
    int64_t offset = 0;
    for (const torch::Tensor& p : params) {
      const ElementRange in_p = Overlap({offset, offset + p.numel()}, range);
      if (in_p.size() > 0 &&
          !SameBits(p.detach().reshape({-1}).narrow(0, in_p.begin - offset, in_p.size()),
                    masters[k].narrow(0, in_p.begin - range.begin, in_p.size()))) {
        return true;
      }
      offset += p.numel();
    }
  }
  return false;
}

// Whether `t` is `flat`'s elements from `offset` on, in `t`'s shape.
bool IsAliasAt(const torch::Tensor& t, const torch::Tensor& flat, int64_t offset) {
  return t.defined() && t.is_contiguous() && t.storage().is_alias_of(flat.storage()) &&
         t.storage_offset() == flat.storage_offset() + offset;
}

// Whether `params` are `flat`'s elements, one after the other from its
// start.
bool LaidOutIn(const std::vector<torch::Tensor>& params, const torch::Tensor& flat) {
  int64_t offset = 0;
  for (const torch::Tensor& p : params) {
    if (!IsAliasAt(p, flat, offset)) return false;
    offset += p.numel();
  }
  return true;
}

namespace {

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
      if (PerElement(t, p)) {
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

// The flat vector `params` are views of, one after the other (an earlier
// Make made them so), or undefined where they are not.
torch::Tensor SharedValues(const std::vector<torch::Tensor>& params) {
  if (params.empty()) return {};
  int64_t n = 0;
  for (const torch::Tensor& p : params) n += p.numel();
  const torch::Tensor& first = params.front();
  if (!first.is_contiguous() ||
      first.storage().nbytes() <
          static_cast<size_t>((first.storage_offset() + n) * first.element_size())) {
    return {};
  }
  torch::Tensor flat = AliasOf(first, 0, {n});
  return LaidOutIn(params, flat) ? flat : torch::Tensor();
}

bool AllContiguous(const std::vector<torch::Tensor>& params) {
  for (const torch::Tensor& p : params) {
    if (!p.is_contiguous()) return false;
  }
  return true;
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
      Group group{optimizers[o], codec, i, {}, {}, {}, param_groups[i].params(), {}, {}, {}, {}};
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

absl::StatusOr<ShardLayout> OptimizerShards::Lay(
    const std::vector<torch::optim::Optimizer*>& optimizers, int rank,
    const std::vector<int>& node_of_rank, int copies, std::vector<Group>* groups,
    std::vector<int64_t>* elements) {
  if (rank < 0 || rank >= static_cast<int>(node_of_rank.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is not in a world of ", node_of_rank.size()));
  }
  MUSTER_RETURN_IF_ERROR(Collect(optimizers, groups, elements));
  return ShardLayout::Make(*elements, node_of_rank, copies);
}

absl::StatusOr<std::unique_ptr<OptimizerShards>> OptimizerShards::Make(
    const std::vector<torch::optim::Optimizer*>& optimizers, int rank,
    const std::vector<int>& node_of_rank, int copies) {
  std::vector<Group> groups;
  std::vector<int64_t> elements;
  MUSTER_ASSIGN_OR_RETURN(ShardLayout layout,
                          Lay(optimizers, rank, node_of_rank, copies, &groups, &elements));
  // Each kept shard's state, sliced from what the optimizers hold: a
  // refusal changes nothing.
  std::vector<std::vector<KeptFields>> fields(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    const Group& group = groups[g];
    if (elements[g] == 0) continue;  // nothing to shard: the group stays as it is
    const auto& param_group = group.optimizer->param_groups()[group.index];
    for (int shard : layout.KeptBy(rank)) {
      MUSTER_ASSIGN_OR_RETURN(
          Fields kept, SliceState(*group.optimizer, *group.codec, param_group.options(),
                                  group.params, layout.Range(static_cast<int>(g), shard),
                                  absl::StrCat("optimizer group ", g)));
      fields[g].push_back(std::move(kept));
    }
  }
  return Build(std::move(groups), std::move(layout), rank, fields);
}

absl::StatusOr<std::unique_ptr<OptimizerShards>> OptimizerShards::Build(
    std::vector<Group> groups, ShardLayout layout, int rank,
    const std::vector<std::vector<KeptFields>>& fields) {
  torch::NoGradGuard no_grad;
  // Everything is built aside first: a refusal changes nothing.
  std::vector<std::vector<std::unique_ptr<torch::optim::OptimizerParamState>>> states(
      groups.size());
  // By group: a flat vector the parameters are to be made views of.
  std::vector<torch::Tensor> to_share(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    Group& group = groups[g];
    if (fields[g].empty()) continue;  // nothing to shard: the group stays as it is
    const auto& param_group = group.optimizer->param_groups()[group.index];
    group.values = SharedValues(group.params);
    if (!group.values.defined() && AllContiguous(group.params)) {
      to_share[g] = group.values = FlatValues(group.params);
    }
    const torch::Tensor flat =
        group.values.defined() ? group.values : FlatValues(group.params);
    const std::vector<int> kept = layout.KeptBy(rank);
    for (size_t k = 0; k < kept.size(); ++k) {
      const ElementRange range = layout.Range(static_cast<int>(g), kept[k]);
      torch::Tensor master = group.values.defined()
                                 ? AliasOf(flat, range.begin, {range.size()})
                                 : flat.narrow(0, range.begin, range.size()).clone();
      master.set_requires_grad(true);
      group.masters.push_back(master);
      // No state yet (a fresh optimizer): the masters get none either, and
      // the optimizer makes it at the first step as it would have.
      std::unique_ptr<torch::optim::OptimizerParamState> state;
      if (!fields[g][k].empty()) {
        state = group.codec->Initial(master, param_group, *group.optimizer);
        if (state != nullptr) {
          MUSTER_RETURN_IF_ERROR(
              group.codec->Load(fields[g][k], param_group.options(), state.get()));
        }
      }
      states[g].push_back(std::move(state));
    }
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    Group& group = groups[g];
    if (group.masters.empty()) continue;
    if (to_share[g].defined()) {
      // The same tensors (the program's, the optimizer's list, a live
      // graph's saved ones), their values in the flat vector: the
      // parameters' old storage is freed where nothing else holds it.
      int64_t offset = 0;
      for (torch::Tensor& p : group.params) {
        p.set_data(AliasOf(to_share[g], offset, p.sizes()));
        offset += p.numel();
      }
    }
    MarkGathered(group);
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

namespace {

// The elements of the per-element state that `group`'s optimizer holds for
// `tensors`.
template <typename Group>
int64_t StateElementsOf(const Group& group, const std::vector<torch::Tensor>& tensors) {
  const auto& param_group = group.optimizer->param_groups()[group.index];
  int64_t n = 0;
  for (const torch::Tensor& t : tensors) {
    torch::optim::OptimizerParamState* state = FindOptimizerState(*group.optimizer, t);
    if (state == nullptr) continue;
    for (const auto& [name, field] : group.codec->Save(*state, param_group.options())) {
      if (field.dim() > 0) n += field.numel();
    }
  }
  return n;
}

}  // namespace

int64_t OptimizerShards::StateElements() const {
  int64_t n = 0;
  for (const Group& group : groups_) n += StateElementsOf(group, group.masters);
  return n;
}

absl::StatusOr<int64_t> OptimizerShards::WholeStateElements(
    const std::vector<torch::optim::Optimizer*>& optimizers) {
  std::vector<Group> groups;
  std::vector<int64_t> elements;
  MUSTER_RETURN_IF_ERROR(Collect(optimizers, &groups, &elements));
  int64_t n = 0;
  for (const Group& group : groups) n += StateElementsOf(group, group.params);
  return n;
}

}  // namespace muster
