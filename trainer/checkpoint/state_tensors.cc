#include "trainer/checkpoint/state_tensors.h"

#include <torch/torch.h>

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
// Adam and AdamW keep the same fields in distinct types.
template <typename AdamState>
void AppendAdamState(const std::string& key, const AdamState& a, NamedTensors* out) {
  out->emplace_back(key + ".step", torch::tensor(a.step(), torch::kInt64));
  out->emplace_back(key + ".exp_avg", a.exp_avg());
  out->emplace_back(key + ".exp_avg_sq", a.exp_avg_sq());
  if (a.max_exp_avg_sq().defined()) out->emplace_back(key + ".max_exp_avg_sq", a.max_exp_avg_sq());
}

template <typename AdamState>
std::unique_ptr<AdamState> ZeroAdamState(const torch::Tensor& p) {
  auto s = std::make_unique<AdamState>();
  s->step(0);
  s->exp_avg(torch::zeros_like(p));
  s->exp_avg_sq(torch::zeros_like(p));
  return s;
}

}  // namespace

// Every tensor of the model's state, named.
NamedTensors ModelTensors(torch::nn::Module& model) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& p : model.named_parameters()) out.emplace_back("param." + p.key(), p.value());
  for (const auto& b : model.named_buffers()) out.emplace_back("buffer." + b.key(), b.value());
  return out;
}

// Every tensor of the optimizer's state, named "<param>.<field>".
NamedTensors OptimizerTensors(
    torch::nn::Module& model, torch::optim::Optimizer& optimizer) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  auto& state = optimizer.state();
  for (const auto& p : model.named_parameters()) {
    auto it = state.find(StateKey(state, p.value()));
    if (it == state.end()) continue;
    if (auto* s = dynamic_cast<torch::optim::SGDParamState*>(it->second.get())) {
      if (s->momentum_buffer().defined()) out.emplace_back(p.key() + ".momentum_buffer", s->momentum_buffer());
    } else if (auto* a = dynamic_cast<torch::optim::AdamWParamState*>(it->second.get())) {
      AppendAdamState(p.key(), *a, &out);
    } else if (auto* adam = dynamic_cast<torch::optim::AdamParamState*>(it->second.get())) {
      AppendAdamState(p.key(), *adam, &out);
    }
  }
  return out;
}
void EnsureOptimizerState(torch::nn::Module& model, torch::optim::Optimizer& optimizer) {
  torch::NoGradGuard no_grad;
  auto& state = optimizer.state();
  for (auto& group : optimizer.param_groups()) {
    const bool adamw = dynamic_cast<torch::optim::AdamWOptions*>(&group.options()) != nullptr;
    const bool adam = dynamic_cast<torch::optim::AdamOptions*>(&group.options()) != nullptr;
    auto* sgd = dynamic_cast<torch::optim::SGDOptions*>(&group.options());
    for (const torch::Tensor& p : group.params()) {
      auto key = StateKey(state, p);
      if (state.find(key) != state.end()) continue;
      if (adamw) {
        state[key] = ZeroAdamState<torch::optim::AdamWParamState>(p);
      } else if (adam) {
        state[key] = ZeroAdamState<torch::optim::AdamParamState>(p);
      } else if (sgd != nullptr && sgd->momentum() != 0) {
        auto s = std::make_unique<torch::optim::SGDParamState>();
        s->momentum_buffer(torch::zeros_like(p));
        state[key] = std::move(s);
      }
    }
  }
  (void)model;
}

void PutOptimizerState(torch::optim::Optimizer& optimizer, const torch::Tensor& param,
                       std::unique_ptr<torch::optim::OptimizerParamState> state) {
  auto& map = optimizer.state();
  map[StateKey(map, param)] = std::move(state);
}

void ApplyOptimizerSteps(torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                         const NamedTensors& tensors) {
  auto& state = optimizer.state();
  for (const auto& p : model.named_parameters()) {
    auto it = state.find(StateKey(state, p.value()));
    if (it == state.end()) continue;
    auto* a = dynamic_cast<torch::optim::AdamWParamState*>(it->second.get());
    auto* adam = dynamic_cast<torch::optim::AdamParamState*>(it->second.get());
    if (a == nullptr && adam == nullptr) continue;
    for (const auto& [name, t] : tensors) {
      if (name != p.key() + ".step") continue;
      if (a != nullptr) a->step(t.item<int64_t>());
      if (adam != nullptr) adam->step(t.item<int64_t>());
    }
  }
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
