#include "trainer/checkpoint/training_state.h"

#include <torch/torch.h>

#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"

namespace muster {
namespace {

absl::Status CheckOptimizer(torch::optim::Optimizer& optimizer) {
  for (auto& group : optimizer.param_groups()) {
    auto& o = group.options();
    if (dynamic_cast<torch::optim::SGDOptions*>(&o) == nullptr &&
        dynamic_cast<torch::optim::AdamOptions*>(&o) == nullptr &&
        dynamic_cast<torch::optim::AdamWOptions*>(&o) == nullptr) {
      return absl::InvalidArgumentError(
          "State::optimizer: muster carries the state of SGD, Adam and AdamW; register another "
          "optimizer's state as State::tensors or State::blobs and leave State::optimizer null");
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TrainingState> TrainingState::From(const State& state) {
  if (state.model == nullptr) return absl::InvalidArgumentError("State::model is null");
  if (state.optimizer != nullptr) {
    if (absl::Status s = CheckOptimizer(*state.optimizer); !s.ok()) return s;
  }
  std::set<std::string> names;
  TrainingState out;
  out.model = state.model;
  out.optimizer = state.optimizer;
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

NamedTensors TrainingState::Optimizer() const {
  if (optimizer == nullptr) return {};
  EnsureOptimizerState(*model, *optimizer);
  return OptimizerTensors(*model, *optimizer);
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
