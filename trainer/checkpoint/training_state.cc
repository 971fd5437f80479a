#include "trainer/checkpoint/training_state.h"

#include <torch/torch.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "trainer/checkpoint/optimizer_codecs.h"

namespace muster {

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
