// OptimizerShards: the flat state of a group, the buffer its fields travel
// in between ranks (optimizer_shards.h).
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

}  // namespace muster
