// OptimizerShards: the gradients of the ranges a rank keeps, and the
// masters it steps (optimizer_shards.h).
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

}  // namespace muster
