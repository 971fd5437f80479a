#include "trainer/lib/state_from.h"

#include <map>
#include <set>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "trainer/checkpoint/optimizer_codecs.h"

namespace muster {
namespace {

bool IsEntryName(const std::string& name) {
  if (name.empty()) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') return false;
  }
  return true;
}

absl::StatusOr<TrainingState::Optimizer> OptimizerFrom(
    const std::string& field, const std::string& codec_field, const std::string& name,
    torch::optim::Optimizer* optimizer, std::shared_ptr<const OptimizerCodec> codec) {
  TrainingState::Optimizer out{name, optimizer, nullptr, std::move(codec)};
  out.codec = out.own_codec ? out.own_codec.get() : BuiltinOptimizerCodec(*optimizer);
  if (out.codec == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": muster knows SGD, Adam, AdamW, RMSprop, Adagrad and LBFGS; for another "
        "optimizer set ", codec_field, " (muster/optimizer_codec.h)"));
  }
  return out;
}

std::string ModuleLabel(const TrainingState::Module& m) {
  return m.name.empty() ? "State::model" : "module '" + m.name + "'";
}

// Each module registered once, and each parameter in at most one optimizer,
// listed there once. A parameter under two names (a tied weight) or in two
// modules is one parameter: TrainingState names it once.
absl::Status CheckEachParameterOnce(const TrainingState& state) {
  std::map<const void*, std::string> registered;
  for (const TrainingState::Module& m : state.modules) {
    auto [it, fresh] = registered.emplace(m.module, ModuleLabel(m));
    if (!fresh) {
      return absl::InvalidArgumentError(absl::StrCat("State: ", ModuleLabel(m), " is ", it->second,
                                                     " again: register each module once"));
    }
  }
  std::map<const void*, std::string> module_of;
  for (const auto& [name, p] : state.Parameters()) module_of.emplace(p.unsafeGetTensorImpl(), name);
  const auto named = [&](const torch::Tensor& p) {
    auto it = module_of.find(p.unsafeGetTensorImpl());
    return it == module_of.end() ? std::string() : " '" + it->second + "'";
  };
  std::map<const void*, std::string> optimizer_of;
  for (const TrainingState::Optimizer& o : state.optimizers) {
    const std::string label = o.name.empty() ? "State::optimizer" : "optimizer '" + o.name + "'";
    for (const auto& group : o.optimizer->param_groups()) {
      for (const torch::Tensor& p : group.params()) {
        auto [it, fresh] = optimizer_of.emplace(p.unsafeGetTensorImpl(), label);
        if (fresh) continue;
        if (it->second == label) {
          // LibTorch's optimizers would step it twice per step.
          return absl::InvalidArgumentError(absl::StrCat(
              "State: ", label, " lists the parameter", named(p),
              " twice (a tied weight?): give each tensor to the optimizer once"));
        }
        return absl::InvalidArgumentError(absl::StrCat("State: ", label, " and ", it->second,
                                                       " update the same parameter", named(p)));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status AddModelsAndOptimizers(const State& state, TrainingState* out) {
  if (state.model == nullptr && state.modules.empty()) {
    return absl::InvalidArgumentError("State::model is null and State::modules is empty");
  }
  if (state.model != nullptr) out->modules.push_back({"", state.model});
  std::set<std::string> names;
  for (const State::NamedModule& m : state.modules) {
    if (!IsEntryName(m.name) || !names.insert(m.name).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "State::modules: name '", m.name,
          "' is empty, used twice or not made of letters, digits, '_' and '-'"));
    }
    if (m.module == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("State::modules: '", m.name, "' is null"));
    }
    out->modules.push_back({m.name, m.module});
  }
  if (state.optimizer != nullptr) {
    MUSTER_ASSIGN_OR_RETURN(TrainingState::Optimizer o,
                            OptimizerFrom("State::optimizer", "State::optimizer_codec", "", state.optimizer,
                                          state.optimizer_codec));
    out->optimizers.push_back(std::move(o));
  }
  names.clear();
  for (const State::NamedOptimizer& o : state.optimizers) {
    const std::string field = absl::StrCat("State::optimizers: '", o.name, "'");
    if (!IsEntryName(o.name) || !names.insert(o.name).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": the name is empty, used twice or not made of letters, digits, '_' and '-'"));
    }
    if (o.optimizer == nullptr) return absl::InvalidArgumentError(field + " is null");
    MUSTER_ASSIGN_OR_RETURN(TrainingState::Optimizer to,
                            OptimizerFrom(field, "its codec", o.name, o.optimizer, o.codec));
    out->optimizers.push_back(std::move(to));
  }
  return CheckEachParameterOnce(*out);
}

}  // namespace

absl::StatusOr<TrainingState> TrainingStateFrom(const State& state) {
  TrainingState out;
  MUSTER_RETURN_IF_ERROR(AddModelsAndOptimizers(state, &out));
  std::set<std::string> names;
  for (const auto& [name, t] : state.tensors) {
    if (name.empty() || !names.insert("tensor." + name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("State::tensors: name '", name, "' is empty or used twice"));
    }
    if (!t.defined()) {
      return absl::InvalidArgumentError(absl::StrCat("State::tensors: '", name, "' is undefined"));
    }
    out.tensors.emplace_back(name, t);
  }
  for (const Blob& b : state.blobs) {
    if (b.name.empty() || !names.insert("blob." + b.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("State::blobs: name '", b.name, "' is empty or used twice"));
    }
    if (!b.save || !b.load) {
      return absl::InvalidArgumentError(
          absl::StrCat("State::blobs: '", b.name, "' needs both save and load"));
    }
    out.blobs.push_back(b);
  }
  if (state.grad_scaler != nullptr) {
    Blob scaler = state.grad_scaler->StateBlob();
    if (!names.insert("blob." + scaler.name).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "State::blobs: '", scaler.name, "' is State::grad_scaler's: name yours otherwise"));
    }
    out.blobs.push_back(std::move(scaler));
  }
  return out;
}

}  // namespace muster
