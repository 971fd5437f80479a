#include "trainer/checkpoint/training_state.h"

#include <torch/torch.h>

#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "trainer/checkpoint/optimizer_codecs.h"

namespace muster {

absl::StatusOr<TrainingState> TrainingState::From(const State& state) {
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

TrainingState TrainingState::Of(torch::nn::Module* model, torch::optim::Optimizer* optimizer) {
  TrainingState out;
  out.model = model;
  out.optimizer = optimizer;
  if (optimizer != nullptr) out.codec = BuiltinOptimizerCodec(*optimizer);
  return out;
}

NamedTensors TrainingState::Optimizer() const {
  if (optimizer == nullptr) return {};
  EnsureOptimizerState(*optimizer, *codec);
  return OptimizerTensors(*model, *optimizer, *codec);
}

absl::Status TrainingState::LoadOptimizer(const NamedTensors& tensors) const {
  if (optimizer == nullptr) return absl::OkStatus();
  return LoadOptimizerTensors(*model, *optimizer, *codec, tensors);
}

NamedTensors TrainingState::Extra() const {
  NamedTensors out;
  for (const auto& [name, t] : tensors) out.emplace_back("tensor." + name, t);
  for (const Blob& b : blobs) out.emplace_back("blob." + b.name, BytesTensor(b.save()));
  return out;
}

absl::Status TrainingState::LoadBlobs(const std::map<std::string, std::string>& bytes) const {
  for (const Blob& b : blobs) {
    auto it = bytes.find(b.name);
    if (it == bytes.end()) {
      return absl::DataLossError(absl::StrCat("blob '", b.name, "' is missing"));
    }
    if (absl::Status s = b.load(it->second); !s.ok()) {
      return absl::DataLossError(absl::StrCat("blob '", b.name, "' rejected: ", s.message()));
    }
  }
  return absl::OkStatus();
}

torch::Tensor BytesTensor(const std::string& bytes) {
  torch::Tensor t = torch::empty({static_cast<int64_t>(bytes.size())}, torch::kUInt8);
  if (!bytes.empty()) std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  return t;
}

std::string TensorBytes(const torch::Tensor& t) {
  torch::Tensor c = t.contiguous().cpu();
  return std::string(static_cast<const char*>(c.data_ptr()), c.numel() * c.element_size());
}

}  // namespace muster
