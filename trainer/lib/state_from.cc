#include "trainer/lib/state_from.h"

#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "trainer/checkpoint/optimizer_codecs.h"

namespace muster {

absl::StatusOr<TrainingState> TrainingStateFrom(const State& state) {
  if (state.model == nullptr) return absl::InvalidArgumentError("State::model is null");
  std::set<std::string> names;
  TrainingState out;
  out.model = state.model;
  out.optimizer = state.optimizer;
  if (state.optimizer != nullptr) {
    out.own_codec = state.optimizer_codec;
    out.codec = out.own_codec ? out.own_codec.get() : BuiltinOptimizerCodec(*state.optimizer);
    if (out.codec == nullptr) {
      return absl::InvalidArgumentError(
          "State::optimizer: muster knows SGD, Adam, AdamW, RMSprop, Adagrad and LBFGS; for "
          "another optimizer set State::optimizer_codec (muster/optimizer_codec.h)");
    }
  }
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
  return out;
}

}  // namespace muster
