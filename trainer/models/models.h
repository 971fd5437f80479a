// The built-in models: an MLP (784-512-512-10), a small CNN and a
// ResNet-18-style CNN, all classifiers of C x H x W images.
#ifndef MUSTER_TRAINER_MODELS_MODELS_H_
#define MUSTER_TRAINER_MODELS_MODELS_H_

#include <torch/nn/module.h>
#include <torch/types.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace muster {

// A classifier: images (N, C, H, W) to logits (N, classes).
class Net : public torch::nn::Module {
 public:
  virtual torch::Tensor forward(torch::Tensor x) = 0;
};

struct ModelShape {
  int channels = 1;
  int height = 28;
  int width = 28;
  int classes = 10;
};

// "mlp", "cnn" or "resnet18". INVALID_ARGUMENT names unknown models.
absl::StatusOr<std::shared_ptr<Net>> MakeModel(const std::string& name, const ModelShape& shape);

}  // namespace muster

#endif  // MUSTER_TRAINER_MODELS_MODELS_H_
