#include "trainer/checkpoint/state_tensors.h"

#include <torch/torch.h>

#include <set>
#include <sstream>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "trainer/checkpoint/safetensors.h"

namespace muster {
namespace {

// The key under which LibTorch keeps a parameter's optimizer state: the
// TensorImpl pointer (2.x) or its printed form (1.13).
template <typename Map>
typename Map::key_type StateKey(const Map&, const torch::Tensor& p) {
  using Key = typename Map::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream s;
    s << p.unsafeGetTensorImpl();
    return s.str();
  } else {
    return static_cast<Key>(p.unsafeGetTensorImpl());
  }
}
}  // namespace

NamedTensors EachTensorOnce(NamedTensors tensors) {
  std::set<const void*> seen;
  NamedTensors out;
  out.reserve(tensors.size());
  for (auto& [name, t] : tensors) {
    if (seen.insert(t.unsafeGetTensorImpl()).second) out.emplace_back(std::move(name), std::move(t));
  }
  return out;
}

// Every tensor of the model's state, named.
NamedTensors ModelTensors(torch::nn::Module& model, const std::string& prefix) {
  NamedTensors out;
  for (const auto& p : model.named_parameters()) {
    out.emplace_back("param." + prefix + p.key(), p.value());
  }
  for (const auto& b : model.named_buffers()) {
    out.emplace_back("buffer." + prefix + b.key(), b.value());
  }
  return EachTensorOnce(std::move(out));
}

NamedTensors NamedParameters(torch::nn::Module& model) {
  NamedTensors out;
  for (const auto& p : model.named_parameters()) out.emplace_back(p.key(), p.value());
  return EachTensorOnce(std::move(out));
}

// Every tensor of the optimizer's state, named "<param>.<field>".
NamedTensors OptimizerTensors(const NamedTensors& params, torch::optim::Optimizer& optimizer,
                              const OptimizerCodec& codec) {
  NamedTensors out;
  auto& state = optimizer.state();
  for (const auto& [name, param] : params) {
    auto it = state.find(StateKey(state, param));
    const torch::optim::OptimizerOptions* options = GroupOptionsOf(optimizer, param);
    if (it == state.end() || options == nullptr) continue;
    for (auto& [field, t] : codec.Save(*it->second, *options)) {
      out.emplace_back(name + "." + field, t);
    }
  }
  return out;
}

void EnsureOptimizerState(torch::optim::Optimizer& optimizer, const OptimizerCodec& codec) {
  torch::NoGradGuard no_grad;
  auto& state = optimizer.state();
  for (auto& group : optimizer.param_groups()) {
    for (const torch::Tensor& p : group.params()) {
      auto key = StateKey(state, p);
      if (state.find(key) != state.end()) continue;
      if (auto s = codec.Initial(p, group, optimizer)) state[key] = std::move(s);
    }
  }
}

void PutOptimizerState(torch::optim::Optimizer& optimizer, const torch::Tensor& param,
                       std::unique_ptr<torch::optim::OptimizerParamState> state) {
  auto& map = optimizer.state();
  map[StateKey(map, param)] = std::move(state);
}

torch::optim::OptimizerParamState* FindOptimizerState(torch::optim::Optimizer& optimizer,
                                                      const torch::Tensor& param) {
  auto& map = optimizer.state();
  auto it = map.find(StateKey(map, param));
  return it == map.end() ? nullptr : it->second.get();
}

void EraseOptimizerState(torch::optim::Optimizer& optimizer, const torch::Tensor& param) {
  auto& map = optimizer.state();
  map.erase(StateKey(map, param));
}

const torch::optim::OptimizerOptions* GroupOptionsOf(const torch::optim::Optimizer& optimizer,
                                                      const torch::Tensor& param) {
  for (const auto& group : optimizer.param_groups()) {
    for (const torch::Tensor& p : group.params()) {
      if (p.is_same(param)) return &group.options();
    }
  }
  return nullptr;
}

absl::Status LoadOptimizerTensors(const NamedTensors& params, torch::optim::Optimizer& optimizer,
                                  const OptimizerCodec& codec, const NamedTensors& tensors) {
  auto& state = optimizer.state();
  for (const auto& [name, param] : params) {
    auto it = state.find(StateKey(state, param));
    const torch::optim::OptimizerOptions* options = GroupOptionsOf(optimizer, param);
    if (it == state.end() || options == nullptr) continue;
    const std::string prefix = name + ".";
    std::map<std::string, torch::Tensor> fields;
    for (const auto& [name, t] : tensors) {
      if (name.rfind(prefix, 0) != 0) continue;
      const std::string field = name.substr(prefix.size());
      if (field.find('.') == std::string::npos) fields[field] = t;
    }
    if (absl::Status s = codec.Load(fields, *options, it->second.get()); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(name, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> DtypeName(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat32: return std::string("F32");
    case torch::kFloat64: return std::string("F64");
    case torch::kFloat16: return std::string("F16");
    case torch::kBFloat16: return std::string("BF16");
    case torch::kInt64: return std::string("I64");
    case torch::kInt32: return std::string("I32");
    case torch::kUInt8: return std::string("U8");
    case torch::kBool: return std::string("BOOL");
    default: return absl::InvalidArgumentError(absl::StrCat("unsupported dtype ", c10::toString(t)));
  }
}

absl::StatusOr<torch::ScalarType> DtypeFromName(const std::string& name) {
  for (torch::ScalarType t : {torch::kFloat32, torch::kFloat64, torch::kFloat16, torch::kBFloat16,
                              torch::kInt64, torch::kInt32, torch::kUInt8, torch::kBool}) {
    if (DtypeName(t).value() == name) return t;
  }
  return absl::InvalidArgumentError(absl::StrCat("unsupported dtype ", name));
}

absl::StatusOr<std::string> EncodeSafetensors(const NamedTensors& tensors,
                                              const std::map<std::string, std::string>& metadata) {
  torch::NoGradGuard no_grad;
  std::vector<TensorRef> refs;
  std::vector<torch::Tensor> host;
  for (const auto& [name, tensor] : tensors) {
    torch::Tensor t = tensor.detach();
    if (!t.device().is_cpu()) t = t.cpu();
    t = t.contiguous();
    MUSTER_ASSIGN_OR_RETURN(std::string dtype, DtypeName(t.scalar_type()));
    refs.push_back({name, dtype, t.sizes().vec(), t.data_ptr()});
    host.push_back(t);
  }
  MUSTER_ASSIGN_OR_RETURN(std::string out, SafetensorsPrefix(refs, metadata));
  for (const torch::Tensor& t : host) {
    out.append(static_cast<const char*>(t.data_ptr()),
               static_cast<size_t>(t.numel()) * t.element_size());
  }
  return out;
}

}  // namespace muster
