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

namespace muster {

// One field of a group's optimizer state, as the codec's Initial names it.
struct FieldSpec {
  std::string name;
  bool per_element;  // the parameter's shape and dtype; else a 0-dim scalar
  torch::Dtype dtype;
};

// One group's state, flat: for each per-element field the group's
// elements (padded to whole int64 words), then two float32 words for each
// scalar field.
struct FlatState {
  std::vector<FieldSpec> specs;
  int64_t per_element = 0, scalars = 0, padded = 0;
  torch::Tensor flat;

  int64_t ElementOffset(int64_t field) const { return field * padded; }
  int64_t ScalarOffset(int64_t scalar) const { return per_element * padded + 2 * scalar; }
};

namespace {

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

// A scalar field's value as 8 bytes (int64 counters as they are, anything
// else as a double), and back.
int64_t ScalarBits(const torch::Tensor& t) {
  int64_t bits = 0;
  if (t.scalar_type() == torch::kInt64) {
    bits = t.item<int64_t>();
  } else {
    const double d = t.item<double>();
    std::memcpy(&bits, &d, sizeof(bits));
  }
  return bits;
}
torch::Tensor ScalarFrom(int64_t bits, torch::Dtype dtype) {
  if (dtype == torch::kInt64) return torch::scalar_tensor(bits, torch::kInt64);
  double d = 0;
  std::memcpy(&d, &bits, sizeof(d));
  return torch::scalar_tensor(d, torch::kFloat64).to(dtype);
}

// The scalar words of flat state `state` (its 64-bit words, each held as
// two float32 elements), on the CPU, for ScalarAt.
torch::Tensor ScalarWords(const FlatState& state) {
  return state.flat.narrow(0, state.ScalarOffset(0), 2 * state.scalars).to(torch::kCPU);
}

// Scalar field `c` of `words` (ScalarWords) as a 0-dim tensor of `dtype`.
torch::Tensor ScalarAt(const torch::Tensor& words, int64_t c, torch::Dtype dtype) {
  int64_t bits = 0;
  std::memcpy(&bits, static_cast<const char*>(words.data_ptr()) + 8 * c, sizeof(bits));
  return ScalarFrom(bits, dtype);
}

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

torch::Tensor OptimizerShards::FlatGradients(int g) const {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> parts;
  for (const torch::Tensor& p : groups_[g].params) {
    parts.push_back(p.grad().defined() ? p.grad().reshape({-1})
                                       : torch::zeros({p.numel()}, p.options()));
  }
  return Flat(parts);
}

absl::StatusOr<OwnShardState> OptimizerShards::OwnShard(const NamedTensors& named_params) const {
  std::map<const c10::TensorImpl*, std::string> names;
  for (const auto& [name, p] : named_params) names[p.unsafeGetTensorImpl()] = name;
  OwnShardState out;
  out.shard = rank_;
  out.world = layout_.world();
  torch::NoGradGuard no_grad;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const Group& group = groups_[g];
    ShardFileGroup file;
    const ElementRange own = layout_.Range(static_cast<int>(g), rank_);
    file.elements = layout_.group_elements(static_cast<int>(g));
    file.begin = own.begin;
    file.end = own.end;
    for (const torch::Tensor& p : group.params) {
      auto it = names.find(p.unsafeGetTensorImpl());
      if (it == names.end()) {
        return absl::InternalError(absl::StrCat("optimizer group ", g, ": a trained parameter of ",
                                                p.numel(), " elements has no name in the state"));
      }
      file.params.push_back({it->second, p.sizes().vec()});
    }
    torch::optim::OptimizerParamState* held =
        group.masters.empty() ? nullptr : FindOptimizerState(*group.optimizer, group.masters[0]);
    if (held != nullptr) {
      const auto& options = group.optimizer->param_groups()[group.index].options();
      for (const auto& [name, t] : group.codec->Save(*held, options)) {
        const bool pe = PerElement(t, group.masters[0]);
        torch::Tensor cpu = t.detach().to(torch::kCPU).contiguous();
        MUSTER_ASSIGN_OR_RETURN(std::string dtype, DtypeName(cpu.scalar_type()));
        file.fields.push_back({name, pe, {name, dtype, cpu.sizes().vec(), cpu.data_ptr()}});
        out.keep.push_back(std::move(cpu));
      }
    }
    out.groups.push_back(std::move(file));
  }
  return out;
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

size_t OptimizerShards::MasterIndex(int shard) const {
  const std::vector<int> kept = layout_.KeptBy(rank_);  // the masters' order
  return static_cast<size_t>(std::find(kept.begin(), kept.end(), shard) - kept.begin());
}

void OptimizerShards::SetKeptGradient(int g, int shard, ElementRange range,
                                      const torch::Tensor& averaged) {
  const size_t k = MasterIndex(shard);
  if (k >= groups_[g].masters.size() || range.size() <= 0) return;
  torch::NoGradGuard no_grad;
  torch::Tensor& master = groups_[g].masters[k];
  if (!master.grad().defined()) master.mutable_grad() = torch::empty_like(master);
  const ElementRange held = layout_.Range(g, shard);
  master.mutable_grad().narrow(0, range.begin - held.begin, range.size()).copy_(averaged);
}

double OptimizerShards::KeptGradientSquares(int shard) const {
  const size_t k = MasterIndex(shard);
  double sum = 0;
  for (const Group& group : groups_) {
    if (k >= group.masters.size() || !group.masters[k].grad().defined()) continue;
    const double norm = group.masters[k].grad().norm().item<double>();
    sum += norm * norm;
  }
  return sum;
}

void OptimizerShards::ScaleKeptGradients(double factor) {
  torch::NoGradGuard no_grad;
  for (Group& group : groups_) {
    for (torch::Tensor& master : group.masters) {
      if (master.grad().defined()) master.mutable_grad().mul_(factor);
    }
  }
}

torch::Tensor& OptimizerShards::GradientVector(Group& group) {
  if (!group.grads.defined()) {
    int64_t n = 0;
    for (const torch::Tensor& p : group.params) n += p.numel();
    group.grads = torch::empty({n}, group.params.front().options());
  }
  return group.grads;
}

void OptimizerShards::UseGradientVector(int g, torch::Tensor flat) {
  Group& group = groups_[g];
  TORCH_CHECK(flat.is_contiguous() && flat.numel() == layout_.group_elements(g),
              "UseGradientVector: group ", g, " has ", layout_.group_elements(g),
              " elements, the vector ", flat.numel());
  group.grads = std::move(flat);
}

void OptimizerShards::ShareGradients(int g) {
  Group& group = groups_[g];
  if (group.masters.empty()) return;
  torch::NoGradGuard no_grad;
  torch::Tensor& flat = GradientVector(group);
  int64_t offset = 0;
  for (torch::Tensor& p : group.params) {
    // A .grad made anew (a zero_grad that set it to none, then backward)
    // is copied in; a parameter without one reads zeros and keeps none.
    if (!IsAliasAt(p.grad(), flat, offset)) {
      torch::Tensor slot = flat.narrow(0, offset, p.numel());
      if (p.grad().defined()) {
        slot.copy_(p.grad().reshape({-1}));
        p.mutable_grad() = AliasOf(flat, offset, p.sizes());
      } else {
        slot.zero_();
      }
    }
    offset += p.numel();
  }
  const std::vector<int> kept = layout_.KeptBy(rank_);
  for (size_t k = 0; k < kept.size(); ++k) {
    const ElementRange range = layout_.Range(g, kept[k]);
    group.masters[k].mutable_grad() = AliasOf(flat, range.begin, {range.size()});
  }
}

void OptimizerShards::WriteKept(int g, int shard, ElementRange range,
                                torch::Tensor* chunk) const {
  const size_t k = MasterIndex(shard);
  if (k >= groups_[g].masters.size()) return;
  torch::NoGradGuard no_grad;
  const ElementRange held = layout_.Range(g, shard);
  const ElementRange both = Overlap(held, range);
  if (both.size() == 0) return;
  chunk->narrow(0, both.begin - range.begin, both.size())
      .copy_(groups_[g].masters[k].narrow(0, both.begin - held.begin, both.size()));
}

void OptimizerShards::Install(int g, ElementRange range, const torch::Tensor& chunk) {
  torch::NoGradGuard no_grad;
  int64_t offset = 0;
  for (torch::Tensor& p : groups_[g].params) {
    const ElementRange in_p = Overlap({offset, offset + p.numel()}, range);
    if (in_p.size() > 0) {
      const torch::Tensor from = chunk.narrow(0, in_p.begin - range.begin, in_p.size());
      if (p.is_contiguous()) {
        p.view({-1}).narrow(0, in_p.begin - offset, in_p.size()).copy_(from);
      } else {
        torch::Tensor flat = p.reshape({-1}).clone();
        flat.narrow(0, in_p.begin - offset, in_p.size()).copy_(from);
        p.copy_(flat.view_as(p));
      }
    }
    offset += p.numel();
  }
}

void OptimizerShards::TakeParameterValues() {
  torch::NoGradGuard no_grad;
  const std::vector<int> kept = layout_.KeptBy(rank_);
  for (size_t g = 0; g < groups_.size(); ++g) {
    Group& group = groups_[g];
    if (group.masters.empty()) continue;
    if (!MastersShareParameters(static_cast<int>(g))) {
      const torch::Tensor values = FlatValues(group.params);
      for (size_t k = 0; k < group.masters.size(); ++k) {
        const ElementRange range = layout_.Range(static_cast<int>(g), kept[k]);
        group.masters[k].detach().copy_(values.narrow(0, range.begin, range.size()));
      }
    }
    MarkGathered(group);
  }
}

bool OptimizerShards::MastersShareParameters(int g) const {
  const Group& group = groups_[g];
  return group.values.defined() && LaidOutIn(group.params, group.values);
}

namespace {

// A fingerprint of `t`'s bits: XXH3 of its bytes on the CPU; elsewhere the
// sum of its 32-bit words, reduced where it lives (a copy to the host at
// every gather would cost the masters' size each step).
int64_t Fingerprint(const torch::Tensor& t) {
  torch::NoGradGuard no_grad;
  if (t.numel() == 0) return 0;
  if (t.device().is_cpu() && t.is_contiguous()) {
    return static_cast<int64_t>(
        XXH3_64bits(t.data_ptr(), static_cast<size_t>(t.numel()) * t.element_size()));
  }
  return t.detach().contiguous().view(torch::kInt32).sum(torch::kInt64).item<int64_t>();
}

}  // namespace

bool OptimizerShards::SteppedSinceGathered(const Group& group, int g, const ShardLayout& layout,
                                           int rank) {
  for (size_t k = 0; k < group.masters.size() && k < group.gathered_versions.size(); ++k) {
    if (static_cast<int64_t>(group.masters[k]._version()) != group.gathered_versions[k]) {
      return true;
    }
  }
  if (!group.values.defined()) {
    return MastersDifferFromParameters(group.params, group.masters, g, layout, rank);
  }
  for (size_t k = 0; k < group.masters.size() && k < group.gathered_prints.size(); ++k) {
    if (Fingerprint(group.masters[k]) != group.gathered_prints[k]) return true;
  }
  return false;
}

void OptimizerShards::MarkGathered(Group& group) {
  group.gathered_versions.clear();
  group.gathered_prints.clear();
  for (const torch::Tensor& m : group.masters) {
    group.gathered_versions.push_back(static_cast<int64_t>(m._version()));
    if (group.values.defined()) group.gathered_prints.push_back(Fingerprint(m));
  }
}

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

absl::Status OptimizerShards::GatherParameters(Communicator* comm, absl::Time deadline,
                                               int64_t chunk_elements) {
  return GatherGroups(comm, deadline, chunk_elements, std::vector<int64_t>(groups_.size(), 1));
}

absl::Status OptimizerShards::GatherStepped(Communicator* comm, absl::Time deadline,
                                            int64_t chunk_elements) {
  std::vector<int64_t> stepped(groups_.size(), 0);
  for (size_t g = 0; g < groups_.size(); ++g) {
    stepped[g] = SteppedSinceGathered(groups_[g], static_cast<int>(g), layout_, rank_);
  }
  // A rank whose kept ranges of a group are empty cannot tell: the world's
  // sum decides for all.
  MUSTER_RETURN_IF_ERROR(AllReduceValues(comm, stepped.data(), stepped.size(), DataType::kInt64,
                                         ReduceOp::kSum, deadline));
  return GatherGroups(comm, deadline, chunk_elements, stepped);
}

absl::Status OptimizerShards::GatherGroups(Communicator* comm, absl::Time deadline,
                                           int64_t chunk_elements,
                                           const std::vector<int64_t>& gather) {
  if (comm->size() != layout_.world()) {
    return absl::InvalidArgumentError(absl::StrCat("a layout of ", layout_.world(),
                                                   " ranks gathered over ", comm->size()));
  }
  // Rounds, not contiguous chunks: each takes a piece of every shard, so
  // every rank sends in every round (PlanGatherRounds).
  const std::vector<GatherRound> rounds = PlanGatherRounds(layout_, chunk_elements);
  int64_t largest = 0;
  for (const GatherRound& round : rounds) {
    int64_t n = 0;
    for (const ElementRange& piece : round.pieces) n += piece.size();
    largest = std::max(largest, n);
  }
  // Inside each node where its ranks keep every shard: `provider[s]` is
  // the node-local rank that sends shard s's pieces there. Where every
  // rank keeps every shard (two copies in a world of two), each is its
  // own "node" and nothing is sent at all.
  int node_size = 1;
  std::vector<std::vector<int>> node_plan = PlanNodeGather(layout_, node_size);
  if (node_plan.empty()) {
    node_size = static_cast<int>(comm->NodeRanks().size());
    node_plan = PlanNodeGather(layout_, node_size);
  }
  const bool in_node = !node_plan.empty();
  const int local = in_node ? rank_ % node_size : rank_;
  const std::vector<int> provider = in_node ? node_plan[rank_ / node_size] : std::vector<int>();
  // One round's buffer, reused: the pieces by sender, each sender's in
  // shard order (in rank order when every rank sends its own).
  torch::Tensor buffer = torch::empty(
      {largest}, torch::TensorOptions().dtype(torch::kFloat32).device(CommDevice(*comm)));
  const int W = layout_.world();
  const std::vector<int> kept = layout_.KeptBy(rank_);
  for (const GatherRound& round : rounds) {
    const int g = round.group;
    // A group with nothing trained is the same on every rank.
    if (groups_[g].masters.empty() || gather[g] == 0) continue;
    const std::vector<size_t> sizes = round.counts();
    std::vector<size_t> counts(in_node ? node_size : W, 0);
    std::vector<int> sender(W);
    for (int s = 0; s < W; ++s) {
      sender[s] = in_node ? provider[s] : s;
      counts[sender[s]] += sizes[s];
    }
    std::vector<torch::Tensor> parts(W);
    int64_t at = 0;
    for (size_t who = 0; who < counts.size(); ++who) {
      for (int s = 0; s < W; ++s) {
        if (sender[s] != static_cast<int>(who)) continue;
        parts[s] = buffer.narrow(0, at, static_cast<int64_t>(sizes[s]));
        at += static_cast<int64_t>(sizes[s]);
      }
    }
    for (int s = 0; s < W; ++s) {
      if (sender[s] == local) WriteKept(g, s, round.pieces[s], &parts[s]);
    }
    if (!in_node) {
      MUSTER_RETURN_IF_ERROR(
          comm->AllGather(buffer.data_ptr(), counts, DataType::kFloat32, deadline));
    } else if (node_size > 1) {
      MUSTER_RETURN_IF_ERROR(
          comm->AllGatherInNode(buffer.data_ptr(), counts, DataType::kFloat32, deadline));
    }
    // Where this rank's masters are its parameters' storage, the pieces
    // it keeps are in place already.
    const bool shared = MastersShareParameters(g);
    for (int s = 0; s < W; ++s) {
      const bool in_place = shared && std::find(kept.begin(), kept.end(), s) != kept.end();
      if (sizes[s] > 0 && !in_place) Install(g, round.pieces[s], parts[s]);
    }
  }
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (gather[g] != 0) MarkGathered(groups_[g]);
  }
  return absl::OkStatus();
}

namespace {

void HashTensor(XXH3_state_t* h, const torch::Tensor& t) {
  const torch::Tensor c = t.detach().contiguous().cpu();
  XXH3_64bits_update(h, c.data_ptr(), static_cast<size_t>(c.numel()) * c.element_size());
}

}  // namespace

absl::Status OptimizerShards::CheckCopiesAgree(Communicator* comm, absl::Time deadline) const {
  const int W = layout_.world();
  if (comm->size() != W || comm->rank() != rank_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "check the shards' copies: rank ", comm->rank(), " of ", comm->size(),
        " is not rank ", rank_, " of the layout's ", W));
  }
  // By shard, its owner's digest, then its buddy's; then by rank, whether
  // its masters differ from its parameters. One writer per word: the sum
  // is exact.
  std::vector<int64_t> table(3 * static_cast<size_t>(W), 0);
  torch::NoGradGuard no_grad;
  const std::vector<int> kept = layout_.KeptBy(rank_);
  std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> h(XXH3_createState(),
                                                                      &XXH3_freeState);
  for (size_t k = 0; k < kept.size(); ++k) {
    XXH3_64bits_reset(h.get());
    for (const Group& group : groups_) {
      if (k >= group.masters.size()) continue;
      HashTensor(h.get(), group.masters[k]);
      torch::optim::OptimizerParamState* state =
          FindOptimizerState(*group.optimizer, group.masters[k]);
      if (state == nullptr) continue;
      const auto& options = group.optimizer->param_groups()[group.index].options();
      for (const auto& [name, field] : group.codec->Save(*state, options)) {
        XXH3_64bits_update(h.get(), name.data(), name.size());
        HashTensor(h.get(), field);
      }
    }
    table[k * W + static_cast<size_t>(kept[k])] =
        static_cast<int64_t>(XXH3_64bits_digest(h.get()));
  }
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (MastersDifferFromParameters(groups_[g].params, groups_[g].masters, static_cast<int>(g),
                                    layout_, rank_)) {
      table[2 * W + rank_] = 1;
    }
  }
  MUSTER_RETURN_IF_ERROR(AllReduceValues(comm, table.data(), table.size(), DataType::kInt64,
                                         ReduceOp::kSum, deadline));
  for (int r = 0; r < W; ++r) {
    if (table[2 * W + r] != 0) {
      return absl::DataLossError(absl::StrCat(
          "rank ", r, "'s optimizer shards hold other values than its parameters after the "
          "step's gather"));
    }
  }
  if (layout_.copies() < 2) return absl::OkStatus();
  for (int s = 0; s < W; ++s) {
    if (table[s] != table[W + s]) {
      const std::vector<int> holders = layout_.Holders(s);
      return absl::DataLossError(absl::StrCat("the two copies of optimizer shard ", s,
                                              " differ: rank ", holders[0],
                                              " (its owner) and rank ", holders[1],
                                              " (its buddy) hold other values or state"));
    }
  }
  return absl::OkStatus();
}

absl::Status OptimizerShards::CheckAlive(const std::vector<bool>& alive,
                                         const char* what) const {
  if (static_cast<int>(alive.size()) == layout_.world() && alive[rank_]) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, ": ", alive.size(),
                                                 " ranks said alive or not, of a layout of ",
                                                 layout_.world(), ", this rank ", rank_,
                                                 " among them"));
}

absl::Status OptimizerShards::Unshard(const std::vector<bool>& alive, Communicator* comm,
                                      absl::Time deadline, int whole_source) {
  MUSTER_RETURN_IF_ERROR(CheckAlive(alive, "unshard"));
  MUSTER_RETURN_IF_ERROR(
      Assemble(groups_, &layout_, rank_, alive, whole_source, comm, deadline));
  groups_.clear();
  return absl::OkStatus();
}

absl::Status OptimizerShards::Check(const std::vector<torch::optim::Optimizer*>& optimizers) {
  std::vector<Group> groups;
  std::vector<int64_t> elements;
  return Collect(optimizers, &groups, &elements);
}

void OptimizerShards::ResetParameterGradients() {
  for (Group& group : groups_) {
    for (torch::Tensor& p : group.params) p.mutable_grad().reset();
  }
}

void OptimizerShards::Restore(std::vector<Group>& groups) {
  for (Group& group : groups) {
    for (const torch::Tensor& master : group.masters) {
      EraseOptimizerState(*group.optimizer, master);
    }
    group.optimizer->param_groups()[group.index].params() = group.listed;
    group.masters.clear();
  }
}

void OptimizerShards::Release() {
  Restore(groups_);
  groups_.clear();
}

absl::Status OptimizerShards::ReceiveUnsharded(
    const std::vector<torch::optim::Optimizer*>& optimizers, Communicator* comm,
    absl::Time deadline) {
  std::vector<Group> groups;
  std::vector<int64_t> elements;
  MUSTER_RETURN_IF_ERROR(Collect(optimizers, &groups, &elements));
  return Assemble(groups, /*layout=*/nullptr, /*rank=*/-1, {}, /*whole_source=*/-1, comm,
                  deadline);
}

absl::Status OptimizerShards::SendWhole(const std::vector<torch::optim::Optimizer*>& optimizers,
                                        const ShardLayout& layout,
                                        const std::vector<bool>& alive, Communicator* comm,
                                        absl::Time deadline) {
  std::vector<Group> groups;
  std::vector<int64_t> elements;
  MUSTER_RETURN_IF_ERROR(Collect(optimizers, &groups, &elements));
  if (static_cast<int>(alive.size()) != layout.world()) {
    return absl::InvalidArgumentError(absl::StrCat("send whole: ", alive.size(),
                                                   " ranks said alive or not, of a layout of ",
                                                   layout.world()));
  }
  return Assemble(groups, &layout, kHoldsWholeState, alive, comm->rank(), comm, deadline);
}

namespace {

// Whether some shard comes from the whole source (ShardSources).
bool AnyFromWhole(const std::vector<int>& source) {
  return std::find(source.begin(), source.end(), kHoldsWholeState) != source.end();
}

// The rank of `layout` that sends each shard: the first of its holders
// that `alive` says lives on; else kHoldsWholeState where a rank holds the
// whole state (`whole`), or -1. `*lost` names the first range with
// elements that nobody sends ("" when there is none).
std::vector<int> ShardSources(const ShardLayout& layout, const std::vector<bool>& alive,
                              bool whole, std::string* lost) {
  std::vector<int> source;
  for (int s = 0; s < layout.world(); ++s) {
    int from = -1;
    for (int h : layout.Holders(s)) {
      if (alive[h]) {
        from = h;
        break;
      }
    }
    if (from < 0 && whole) from = kHoldsWholeState;
    source.push_back(from);
    for (int g = 0; g < layout.groups() && from == -1 && lost->empty(); ++g) {
      const ElementRange r = layout.Range(g, s);
      if (r.size() > 0) {
        *lost = absl::StrCat("the optimizer state of group ", g, " elements [", r.begin, ", ",
                             r.end, ") (shard ", s, ") has no living holder");
      }
    }
  }
  return source;
}

}  // namespace

absl::Status OptimizerShards::AgreeOnHeader(const std::vector<Group>& groups,
                                            const ShardLayout* layout, int rank,
                                            const std::string& lost, Communicator* comm,
                                            absl::Time deadline, std::vector<int64_t>* header) {
  const size_t G = groups.size();
  const bool whole = rank == kHoldsWholeState;
  std::vector<int64_t>& h = *header;
  h.assign(2 * G + 2, 0);
  h[0] = lost.empty() ? 0 : 1;
  for (size_t g = 0; g < G; ++g) {
    const Group& group = groups[g];
    // The whole source holds every range in its parameters' own state.
    const std::vector<torch::Tensor>& mine = whole ? group.params : group.masters;
    const bool held = layout != nullptr && !mine.empty();
    h[g + 1] = held && FindOptimizerState(*group.optimizer, mine[0]) != nullptr;
    h[G + g + 1] = held;
    if (held && !whole && h[2 * G + 1] == 0 &&
        SteppedSinceGathered(group, static_cast<int>(g), *layout, rank)) {
      h[2 * G + 1] = 1;
    }
  }
  MUSTER_RETURN_IF_ERROR(
      AllReduceValues(comm, h.data(), h.size(), DataType::kInt64, ReduceOp::kSum, deadline));
  bool any_state = false;
  for (size_t g = 0; g < G; ++g) any_state = any_state || h[g + 1] > 0;
  // A lost range is lost whether it has state or only values: an optimizer
  // without state (SGD without momentum) that stepped since the last gather
  // holds the range's new values in its masters alone. Every rank steps
  // the same step, so a survivor that stepped means the dead one did too.
  if (h[0] > 0 && (any_state || h[2 * G + 1] > 0)) {
    return absl::NotFoundError(absl::StrCat(
        lost.empty() ? "a range of the optimizer state has no living holder" : lost,
        any_state ? "" : " and was stepped since the last gather",
        ": it must come from a checkpoint"));
  }
  return absl::OkStatus();
}

// Every rank of `comm`: a header (a range lost anywhere? state in which
// groups?) summed over the world, then, for each group with state, one
// buffer of its fields, flat over the group's elements, into which the
// living holder of each range writes its master's state and everyone else
// zeros. The buffer is summed as int64 words: each word has one writer,
// so the sum moves the float32 bits exactly (a float sum would turn -0
// into +0).
absl::Status OptimizerShards::Assemble(std::vector<Group>& groups, const ShardLayout* layout,
                                       int rank, const std::vector<bool>& alive,
                                       int whole_source, Communicator* comm,
                                       absl::Time deadline) {
  const size_t G = groups.size();
  const bool whole = rank == kHoldsWholeState;
  std::string lost;
  const std::vector<int> source =
      layout != nullptr ? ShardSources(*layout, alive, whole_source >= 0, &lost)
                        : std::vector<int>();
  torch::NoGradGuard no_grad;
  std::vector<int64_t> header;
  MUSTER_RETURN_IF_ERROR(AgreeOnHeader(groups, layout, rank, lost, comm, deadline, &header));
  for (size_t g = 0; g < G; ++g) {
    Group& group = groups[g];
    // Nobody holds sharded state for it: each rank keeps what its own
    // optimizer holds (none before a first step, or what its constructor
    // made, as Adagrad's does), which the state transfer that follows a
    // new world makes equal.
    if (header[g + 1] == 0) continue;
    MUSTER_ASSIGN_OR_RETURN(
        FlatState state,
        StartFlatState(group, static_cast<int>(g), *comm, group.PaddedElements()));
    if (layout != nullptr) {
      MUSTER_RETURN_IF_ERROR(
          whole ? WriteWholeState(group, static_cast<int>(g), *layout, source, &state)
                : WriteHeldState(group, static_cast<int>(g), *layout, rank, source, &state));
    }
    MUSTER_RETURN_IF_ERROR(comm->AllReduce(state.flat.data_ptr(),
                                           static_cast<size_t>(state.flat.numel() / 2),
                                           DataType::kInt64, ReduceOp::kSum, deadline));
    MUSTER_RETURN_IF_ERROR(InstallFlatState(group, state));
  }
  for (size_t g = 0; g < G; ++g) {
    if (header[G + g + 1] == 0) continue;
    MUSTER_RETURN_IF_ERROR(
        AssembleValues(groups[g], static_cast<int>(g), layout, rank, source, comm, deadline));
  }
  Restore(groups);
  return absl::OkStatus();
}

// Between an optimizer step and the boundary's GatherParameters only the
// masters hold the new values of their ranges (a world that broke in that
// gather leaves the parameters differing by rank): each range's values
// come from the rank that sends its state, moved as int64 words as the
// state is. A range nobody sends keeps this rank's own values; a joiner
// (`layout` null) keeps its own, which the state transfer replaces.
absl::Status OptimizerShards::AssembleValues(const Group& group, int g, const ShardLayout* layout,
                                             int rank, const std::vector<int>& source,
                                             Communicator* comm, absl::Time deadline) {
  torch::Tensor flat =
      torch::zeros({group.PaddedElements()},
                   torch::TensorOptions().dtype(torch::kFloat32).device(CommDevice(*comm)));
  if (rank == kHoldsWholeState && AnyFromWhole(source)) {
    const torch::Tensor values = FlatValues(group.params).to(flat.device());
    for (int s = 0; s < layout->world(); ++s) {
      const ElementRange range = layout->Range(g, s);
      if (source[s] != kHoldsWholeState || range.size() <= 0) continue;
      flat.narrow(0, range.begin, range.size()).copy_(values.narrow(0, range.begin, range.size()));
    }
  }
  const std::vector<int> kept =
      layout != nullptr && rank >= 0 ? layout->KeptBy(rank) : std::vector<int>();
  for (size_t k = 0; k < kept.size() && k < group.masters.size(); ++k) {
    if (source[kept[k]] != rank) continue;
    const ElementRange range = layout->Range(g, kept[k]);
    flat.narrow(0, range.begin, range.size()).copy_(group.masters[k]);
  }
  MUSTER_RETURN_IF_ERROR(comm->AllReduce(flat.data_ptr(), static_cast<size_t>(flat.numel() / 2),
                                         DataType::kInt64, ReduceOp::kSum, deadline));
  if (layout == nullptr) return absl::OkStatus();
  torch::Tensor values = FlatValues(group.params).to(flat.device());
  for (int s = 0; s < layout->world(); ++s) {
    const ElementRange range = layout->Range(g, s);
    if (source[s] == -1 || range.size() <= 0) continue;
    values.narrow(0, range.begin, range.size()).copy_(flat.narrow(0, range.begin, range.size()));
  }
  int64_t offset = 0;
  for (const torch::Tensor& p : group.params) {
    const torch::Tensor from = values.narrow(0, offset, p.numel()).view_as(p).to(p.device());
    // A parameter that holds these bits already is not written: a graph
    // built on it before the regroup (a GAN's generated images, made
    // before the step's first pass) checks its version in its backward.
    if (!SameBits(p, from)) p.detach().copy_(from);
    offset += p.numel();
  }
  return absl::OkStatus();
}

// The fields as the codec's Initial names them, and a zeroed buffer for
// them over `padded` elements (even) where `comm`'s buffers live.
absl::StatusOr<FlatState> OptimizerShards::StartFlatState(const Group& group, int g,
                                                          const Communicator& comm,
                                                          int64_t padded) {
  const auto& param_group = group.optimizer->param_groups()[group.index];
  // The fields of a one-element parameter like the group's: the group's
  // first parameter may be most of the model, and its initial state as
  // large.
  const torch::Tensor probe = torch::zeros({1}, group.params[0].options());
  std::unique_ptr<torch::optim::OptimizerParamState> initial =
      group.codec->Initial(probe, param_group, *group.optimizer);
  if (initial == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("optimizer group ", g, ": ", group.codec->name(),
                     "'s codec makes no initial state, yet its sharded state is held"));
  }
  FlatState state;
  for (const auto& [name, t] : group.codec->Save(*initial, param_group.options())) {
    const bool pe = PerElement(t, probe);
    state.specs.push_back({name, pe, t.scalar_type()});
    (pe ? state.per_element : state.scalars) += 1;
  }
  state.padded = padded;
  state.flat = torch::zeros({state.ScalarOffset(state.scalars)},
                            torch::TensorOptions().dtype(torch::kFloat32).device(CommDevice(comm)));
  return state;
}

namespace {

// `fields` (per-element ones of `range`'s elements, flat) into `state` at
// `range`; the scalars too where `scalars` (the sender of shard 0: the
// group's scalars have one sender).
absl::Status WriteFields(const OptimizerCodec::Fields& fields, int g, ElementRange range,
                         bool scalars, FlatState* state) {
  int64_t f = 0, c = 0;
  for (const FieldSpec& spec : state->specs) {
    auto it = std::find_if(fields.begin(), fields.end(),
                           [&](const auto& field) { return field.first == spec.name; });
    if (it == fields.end()) {
      return absl::InternalError(
          absl::StrCat("optimizer group ", g, ": its shard's state has no \"", spec.name, "\""));
    }
    if (spec.per_element) {
      state->flat.narrow(0, state->ElementOffset(f++) + range.begin, range.size())
          .copy_(it->second.reshape({-1}));
    } else if (scalars) {
      const int64_t bits = ScalarBits(it->second);
      torch::Tensor word = torch::empty({2}, torch::kFloat32);
      std::memcpy(word.data_ptr(), &bits, sizeof(bits));
      state->flat.narrow(0, state->ScalarOffset(c++), 2).copy_(word);
    } else {
      ++c;
    }
  }
  return absl::OkStatus();
}

}  // namespace

// This rank's part of `state`: the fields of the shards it sends.
absl::Status OptimizerShards::WriteHeldState(const Group& group, int g, const ShardLayout& layout,
                                             int rank, const std::vector<int>& source,
                                             FlatState* state) {
  const auto& options = group.optimizer->param_groups()[group.index].options();
  const std::vector<int> kept = layout.KeptBy(rank);
  for (size_t k = 0; k < kept.size(); ++k) {
    const int s = kept[k];
    if (source[s] != rank) continue;
    torch::optim::OptimizerParamState* held =
        FindOptimizerState(*group.optimizer, group.masters[k]);
    if (held == nullptr) continue;
    MUSTER_RETURN_IF_ERROR(
        WriteFields(group.codec->Save(*held, options), g, layout.Range(g, s), s == 0, state));
  }
  return absl::OkStatus();
}

// The whole source's part of `state`: the fields of the ranges no holder
// lives to send, cut from its parameters' own state laid flat.
absl::Status OptimizerShards::WriteWholeState(const Group& group, int g,
                                              const ShardLayout& layout,
                                              const std::vector<int>& source, FlatState* state) {
  if (!AnyFromWhole(source)) return absl::OkStatus();  // every range has a holder
  const auto& options = group.optimizer->param_groups()[group.index].options();
  std::map<std::string, std::vector<torch::Tensor>> parts;
  OptimizerCodec::Fields first;
  for (const torch::Tensor& p : group.params) {
    torch::optim::OptimizerParamState* held = FindOptimizerState(*group.optimizer, p);
    if (held == nullptr) {
      return absl::InternalError(
          absl::StrCat("optimizer group ", g, ": a parameter of the whole state has none"));
    }
    OptimizerCodec::Fields fields = group.codec->Save(*held, options);
    for (const auto& [name, t] : fields) {
      if (PerElement(t, p)) parts[name].push_back(t.reshape({-1}));
    }
    if (first.empty()) first = std::move(fields);
  }
  OptimizerCodec::Fields flat;  // the per-element fields over the group, the scalars
  for (const auto& [name, t] : first) {
    const auto it = parts.find(name);
    flat.emplace_back(name, it != parts.end() ? Flat(it->second) : t);
  }
  for (int s = 0; s < layout.world(); ++s) {
    const ElementRange range = layout.Range(g, s);
    if (source[s] != kHoldsWholeState) continue;
    OptimizerCodec::Fields cut;
    for (const auto& [name, t] : flat) {
      cut.emplace_back(name, parts.count(name) > 0 ? t.narrow(0, range.begin, range.size()) : t);
    }
    MUSTER_RETURN_IF_ERROR(WriteFields(cut, g, range, s == 0, state));
  }
  return absl::OkStatus();
}

// Every trained parameter of the group gets its state from `state`.
absl::Status OptimizerShards::InstallFlatState(const Group& group, const FlatState& state) {
  const auto& param_group = group.optimizer->param_groups()[group.index];
  const torch::Tensor words = ScalarWords(state);
  int64_t offset = 0;
  for (const torch::Tensor& p : group.params) {
    std::map<std::string, torch::Tensor> fields;
    int64_t f = 0, c = 0;
    for (const FieldSpec& spec : state.specs) {
      if (spec.per_element) {
        fields[spec.name] = state.flat.narrow(0, state.ElementOffset(f++) + offset, p.numel())
                                .view(p.sizes())
                                .to(p.device())
                                .clone();
      } else {
        fields[spec.name] = ScalarAt(words, c++, spec.dtype);
      }
    }
    std::unique_ptr<torch::optim::OptimizerParamState> loaded =
        group.codec->Initial(p, param_group, *group.optimizer);
    MUSTER_RETURN_IF_ERROR(group.codec->Load(fields, param_group.options(), loaded.get()));
    PutOptimizerState(*group.optimizer, p, std::move(loaded));
    offset += p.numel();
  }
  return absl::OkStatus();
}

namespace {

// `fields` (a master's state over `whole`, its range) cut to `piece`, a
// range inside it: WriteFields' input for the piece.
OptimizerCodec::Fields CutFields(const OptimizerCodec::Fields& fields, ElementRange whole,
                                 ElementRange piece) {
  OptimizerCodec::Fields out;
  for (const auto& [name, t] : fields) {
    out.emplace_back(name, t.dim() > 0 ? t.reshape({-1}).narrow(0, piece.begin - whole.begin,
                                                               piece.size())
                                       : t);
  }
  return out;
}

// A round `round` of new shard `range`, summed over the world (`buffer`),
// into the shard's fields `out`, made where `device` at the first round.
void KeepRound(const FlatState& buffer, ElementRange range, ElementRange round,
               torch::Device device, std::map<std::string, torch::Tensor>* out) {
  const torch::Tensor words = ScalarWords(buffer);
  int64_t f = 0, c = 0;
  for (const FieldSpec& spec : buffer.specs) {
    if (spec.per_element) {
      torch::Tensor& field = (*out)[spec.name];
      if (!field.defined()) {
        field = torch::empty({range.size()},
                             torch::TensorOptions().dtype(spec.dtype).device(device));
      }
      field.narrow(0, round.begin - range.begin, round.size())
          .copy_(buffer.flat.narrow(0, buffer.ElementOffset(f++), round.size()));
    } else {
      (*out)[spec.name] = ScalarAt(words, c++, spec.dtype);
    }
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<OptimizerShards>> OptimizerShards::Redistribute(
    OptimizerShards* held, const std::vector<torch::optim::Optimizer*>& optimizers,
    const ShardWorld& agreed, int copies, Communicator* comm, absl::Time deadline,
    int64_t chunk) {
  // This rank's view of the groups: a holder's own (its optimizers list
  // the masters), a joiner's from its optimizers.
  std::vector<Group> collected;
  std::vector<int64_t> elements;
  if (held == nullptr) {
    MUSTER_RETURN_IF_ERROR(Collect(optimizers, &collected, &elements));
  } else {
    MUSTER_RETURN_IF_ERROR(held->CheckAlive(agreed.alive, "redistribute"));
    for (int g = 0; g < held->layout_.groups(); ++g) {
      elements.push_back(held->layout_.group_elements(g));
    }
  }
  const std::vector<Group>& groups = held != nullptr ? held->groups_ : collected;
  MUSTER_ASSIGN_OR_RETURN(ShardLayout after,
                          ShardLayout::Make(elements, agreed.node_of_rank, copies));
  const size_t G = groups.size();
  std::string lost;
  const std::vector<int> source =
      held != nullptr ? ShardSources(held->layout_, agreed.alive, /*whole=*/false, &lost)
                      : std::vector<int>();
  torch::NoGradGuard no_grad;
  std::vector<int64_t> header;
  MUSTER_RETURN_IF_ERROR(AgreeOnHeader(groups, held != nullptr ? &held->layout_ : nullptr,
                                       held != nullptr ? held->rank_ : -1, lost, comm, deadline,
                                       &header));
  const bool stepped = header[2 * G + 1] > 0;
  // Every group's kept shards' fields, aside until every round is done.
  const size_t kept = after.KeptBy(comm->rank()).size();
  std::vector<std::vector<KeptFields>> fields(G);
  for (size_t g = 0; g < G; ++g) {
    if (elements[g] == 0) continue;  // not sharded
    fields[g].resize(kept);
    if (header[g + 1] == 0) continue;  // no state yet: the masters get none
    MUSTER_RETURN_IF_ERROR(MoveGroup(groups, static_cast<int>(g), held, source, after,
                                     comm->rank(), comm, deadline, chunk, &fields[g]));
  }
  for (size_t g = 0; g < G && stepped; ++g) {
    if (header[G + g + 1] == 0) continue;
    MUSTER_RETURN_IF_ERROR(AssembleValues(groups[g], static_cast<int>(g),
                                          held != nullptr ? &held->layout_ : nullptr,
                                          held != nullptr ? held->rank_ : -1, source, comm,
                                          deadline));
  }
  // Every rank has its fields only once every rank's rounds are done: a
  // rank that passes this word knows that no rank keeps the old shards
  // for lack of the new.
  int64_t done = 1;
  MUSTER_RETURN_IF_ERROR(
      AllReduceValues(comm, &done, 1, DataType::kInt64, ReduceOp::kSum, deadline));
  if (held != nullptr) {
    Restore(held->groups_);
    held->groups_.clear();
    elements.clear();
    MUSTER_RETURN_IF_ERROR(Collect(optimizers, &collected, &elements));
  }
  return Build(std::move(collected), std::move(after), comm->rank(), fields);
}

absl::Status OptimizerShards::MoveGroup(const std::vector<Group>& groups, int g,
                                        const OptimizerShards* held,
                                        const std::vector<int>& source, const ShardLayout& after,
                                        int rank, Communicator* comm, absl::Time deadline,
                                        int64_t chunk, std::vector<KeptFields>* kept) {
  const Group& group = groups[g];
  const auto& options = group.optimizer->param_groups()[group.index].options();
  const torch::Device device = group.params[0].device();
  // What this rank sends: each master's fields whose shard it is the
  // source of (by KeptBy's order of the old layout).
  std::vector<int> sent;
  std::vector<OptimizerCodec::Fields> sent_fields;
  if (held != nullptr) {
    const std::vector<int> old_kept = held->layout_.KeptBy(held->rank_);
    for (size_t k = 0; k < old_kept.size(); ++k) {
      if (source[old_kept[k]] != held->rank_) continue;
      torch::optim::OptimizerParamState* state =
          FindOptimizerState(*group.optimizer, group.masters[k]);
      if (state == nullptr) {
        return absl::InternalError(
            absl::StrCat("optimizer group ", g, ": a master it sends has no state"));
      }
      sent.push_back(old_kept[k]);
      sent_fields.push_back(group.codec->Save(*state, options));
    }
  }
  const std::vector<int> mine = after.KeptBy(rank);
  chunk = std::max<int64_t>(chunk, 1);
  // The fields, once: each round's buffer is made alike.
  MUSTER_ASSIGN_OR_RETURN(const FlatState fields, StartFlatState(group, g, *comm, 0));
  for (int s = 0; s < after.world(); ++s) {
    const ElementRange range = after.Range(g, s);
    const auto it = std::find(mine.begin(), mine.end(), s);
    KeptFields* out = it != mine.end() ? &(*kept)[static_cast<size_t>(it - mine.begin())] : nullptr;
    // At least one round, for the scalars of an empty range.
    for (int64_t begin = range.begin;;) {
      const int64_t n = std::min(chunk, range.end - begin);
      const ElementRange round{begin, begin + n};
      FlatState buffer = fields;
      buffer.padded = n + n % 2;
      buffer.flat = torch::zeros({buffer.ScalarOffset(buffer.scalars)}, fields.flat.options());
      for (size_t i = 0; i < sent.size(); ++i) {
        const ElementRange whole = held->layout_.Range(g, sent[i]);
        const ElementRange piece = Overlap(whole, round);
        // The group's scalars have one writer: the sender of old shard 0.
        const bool scalars = sent[i] == 0;
        const bool empty = piece.size() <= 0;
        if (empty && !scalars) continue;
        const ElementRange at = empty ? ElementRange{whole.begin, whole.begin} : piece;
        const ElementRange into = empty ? ElementRange{0, 0}
                                        : ElementRange{piece.begin - begin, piece.end - begin};
        MUSTER_RETURN_IF_ERROR(
            WriteFields(CutFields(sent_fields[i], whole, at), g, into, scalars, &buffer));
      }
      // Every rank sizes the round alike: none is empty on one rank alone.
      if (buffer.flat.numel() > 0) {
        MUSTER_RETURN_IF_ERROR(comm->AllReduce(buffer.flat.data_ptr(),
                                               static_cast<size_t>(buffer.flat.numel() / 2),
                                               DataType::kInt64, ReduceOp::kSum, deadline));
      }
      if (out != nullptr) KeepRound(buffer, range, round, device, out);
      begin += n;
      if (begin >= range.end) break;
    }
  }
  return absl::OkStatus();
}

namespace {

// ShardWorld::outside_step from AgreeOnShards' words (`stride` a rank).
std::vector<bool> OutsideTheStep(const int64_t* words, int size, int stride) {
  const int64_t* in_step = nullptr;
  for (int r = 0; r < size && in_step == nullptr; ++r) {
    if (words[r * stride + 4] >= 0) in_step = words + r * stride;
  }
  if (in_step == nullptr) return {};
  std::vector<bool> outside(static_cast<size_t>(size), false);
  for (int r = 0; r < size; ++r) {
    const int64_t* w = words + r * stride;
    if (w[4] == in_step[4] && w[5] == in_step[5]) continue;
    if (w[4] >= 0 || w[1] != 0 || w[2] != -1) return {};  // in another step, or holds state
    outside[r] = true;
  }
  return outside;
}

}  // namespace

absl::StatusOr<ShardWorld> AgreeOnShards(Communicator* comm, int node, uint64_t generation,
                                         int rank, int world, absl::Time deadline,
                                         int64_t failed_step, uint64_t failed_generation) {
  constexpr int64_t kWords = 6;
  const int size = comm->size();
  std::vector<int64_t> all(static_cast<size_t>(size * kWords), 0);
  int64_t* mine = all.data() + comm->rank() * kWords;
  mine[0] = node;
  mine[1] = static_cast<int64_t>(generation);
  mine[2] = rank;
  mine[3] = world;
  mine[4] = failed_step;
  mine[5] = static_cast<int64_t>(failed_generation);
  MUSTER_RETURN_IF_ERROR(AllGatherValues(comm, all.data(),
                                         std::vector<size_t>(size, static_cast<size_t>(kWords)),
                                         DataType::kInt64, deadline));
  const int64_t* words = all.data();
  ShardWorld out;
  for (int r = 0; r < size; ++r) {
    out.node_of_rank.push_back(static_cast<int>(words[r * kWords]));
    out.one_step = out.one_step && words[r * kWords + 4] == words[4] &&
                   words[r * kWords + 5] == words[5];
    if (words[r * kWords + 2] == kHoldsWholeState) continue;
    out.generation = std::max(out.generation, static_cast<uint64_t>(words[r * kWords + 1]));
  }
  if (!out.one_step) out.outside_step = OutsideTheStep(words, size, static_cast<int>(kWords));
  int64_t layout_world = -1;
  for (int r = 0; r < size; ++r) {
    const int64_t* w = words + r * kWords;
    const bool newest = out.generation != 0 && static_cast<uint64_t>(w[1]) == out.generation;
    const bool whole = w[2] == kHoldsWholeState;
    out.layout_rank.push_back(newest && !whole ? static_cast<int>(w[2]) : -1);
    if (!newest) continue;
    if (whole && out.whole_source < 0) out.whole_source = r;
    if (layout_world >= 0 && w[3] != layout_world) {
      return absl::InvalidArgumentError(absl::StrCat("the shards of generation ", out.generation,
                                                     " are said to be of ", layout_world,
                                                     " and of ", w[3], " ranks"));
    }
    layout_world = w[3];
  }
  if (out.generation == 0) return out;
  out.alive.assign(static_cast<size_t>(layout_world), false);
  for (int r = 0; r < size; ++r) {
    const int held = out.layout_rank[r];
    if (held < 0) continue;
    if (held >= layout_world || out.alive[held]) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", r, " claims rank ", held,
                                                     " of the shards of generation ",
                                                     out.generation, ", of ", layout_world,
                                                     " ranks, which another holds or is none"));
    }
    out.alive[held] = true;
  }
  return out;
}

}  // namespace muster
