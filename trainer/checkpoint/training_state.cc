#include "trainer/checkpoint/training_state.h"

#include <torch/torch.h>

#include <cstring>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "trainer/checkpoint/optimizer_codecs.h"

namespace muster {

TrainingState TrainingState::Of(torch::nn::Module* model, torch::optim::Optimizer* optimizer) {
  TrainingState out;
  out.modules.push_back({"", model});
  if (optimizer != nullptr) {
    out.optimizers.push_back({"", optimizer, BuiltinOptimizerCodec(*optimizer), nullptr});
  }
  return out;
}

namespace {

std::string PrefixOf(const TrainingState::Module& m) {
  return m.name.empty() ? std::string() : m.name + "/";
}

}  // namespace

NamedTensors TrainingState::Model() const {
  NamedTensors out;
  for (const Module& m : modules) {
    NamedTensors one = ModelTensors(*m.module, PrefixOf(m));
    out.insert(out.end(), std::make_move_iterator(one.begin()), std::make_move_iterator(one.end()));
  }
  return EachTensorOnce(std::move(out));
}

NamedTensors TrainingState::Parameters() const {
  NamedTensors out;
  for (const Module& m : modules) {
    for (auto& [name, p] : NamedParameters(*m.module)) out.emplace_back(PrefixOf(m) + name, p);
  }
  return EachTensorOnce(std::move(out));
}

NamedTensors TrainingState::OptimizerState() const {
  if (optimizers.empty()) return {};
  const NamedTensors params = Parameters();
  NamedTensors out;
  for (const Optimizer& o : optimizers) {
    EnsureOptimizerState(*o.optimizer, *o.codec);
    NamedTensors one = OptimizerTensors(params, *o.optimizer, *o.codec);
    out.insert(out.end(), std::make_move_iterator(one.begin()), std::make_move_iterator(one.end()));
  }
  return out;
}

absl::Status TrainingState::LoadOptimizer(const NamedTensors& tensors) const {
  if (optimizers.empty()) return absl::OkStatus();
  const NamedTensors params = Parameters();
  for (const Optimizer& o : optimizers) {
    MUSTER_RETURN_IF_ERROR(LoadOptimizerTensors(params, *o.optimizer, *o.codec, tensors));
  }
  return absl::OkStatus();
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
    if (it == bytes.end() && b.name == kLearningRatesBlob) continue;
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
