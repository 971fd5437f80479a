#include "trainer/models/models.h"

#include <torch/torch.h>

#include "absl/strings/str_cat.h"

namespace muster {
namespace {

namespace nn = torch::nn;
namespace F = torch::nn::functional;

class Mlp : public Net {
 public:
  explicit Mlp(const ModelShape& s)
      : fc1_(register_module("fc1", nn::Linear(s.channels * s.height * s.width, 512))),
        fc2_(register_module("fc2", nn::Linear(512, 512))),
        fc3_(register_module("fc3", nn::Linear(512, s.classes))) {}

  torch::Tensor forward(torch::Tensor x) override {
    x = x.flatten(1);
    x = torch::relu(fc1_->forward(x));
    x = torch::relu(fc2_->forward(x));
    return fc3_->forward(x);
  }

 private:
  nn::Linear fc1_, fc2_, fc3_;
};

class SmallCnn : public Net {
 public:
  explicit SmallCnn(const ModelShape& s)
      : conv1_(register_module(
            "conv1", nn::Conv2d(nn::Conv2dOptions(s.channels, 32, 3).padding(1)))),
        conv2_(register_module("conv2", nn::Conv2d(nn::Conv2dOptions(32, 64, 3).padding(1)))),
        fc1_(register_module("fc1", nn::Linear(64 * (s.height / 4) * (s.width / 4), 128))),
        fc2_(register_module("fc2", nn::Linear(128, s.classes))) {}

  torch::Tensor forward(torch::Tensor x) override {
    x = torch::max_pool2d(torch::relu(conv1_->forward(x)), 2);
    x = torch::max_pool2d(torch::relu(conv2_->forward(x)), 2);
    x = torch::relu(fc1_->forward(x.flatten(1)));
    return fc2_->forward(x);
  }

 private:
  nn::Conv2d conv1_, conv2_;
  nn::Linear fc1_, fc2_;
};

class BasicBlock : public nn::Module {
 public:
  BasicBlock(int in, int out, int stride)
      : conv1_(register_module(
            "conv1", nn::Conv2d(nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)))),
        bn1_(register_module("bn1", nn::BatchNorm2d(out))),
        conv2_(register_module(
            "conv2", nn::Conv2d(nn::Conv2dOptions(out, out, 3).padding(1).bias(false)))),
        bn2_(register_module("bn2", nn::BatchNorm2d(out))) {
    if (stride != 1 || in != out) {
      down_ = register_module(
          "downsample",
          nn::Sequential(nn::Conv2d(nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)),
                         nn::BatchNorm2d(out)));
    }
  }

  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor y = torch::relu(bn1_->forward(conv1_->forward(x)));
    y = bn2_->forward(conv2_->forward(y));
    return torch::relu(y + (down_.is_empty() ? x : down_->forward(x)));
  }

 private:
  nn::Conv2d conv1_;
  nn::BatchNorm2d bn1_;
  nn::Conv2d conv2_;
  nn::BatchNorm2d bn2_;
  nn::Sequential down_{nullptr};
};

// ResNet-18's layout (four stages of two basic blocks, 64-512 channels). For
// small images (<= 64 px) the stem is a 3x3 convolution without pooling.
class ResNet18 : public Net {
 public:
  explicit ResNet18(const ModelShape& s) : small_(s.height <= 64) {
    stem_ = register_module(
        "stem", small_ ? nn::Conv2d(nn::Conv2dOptions(s.channels, 64, 3).padding(1).bias(false))
                       : nn::Conv2d(nn::Conv2dOptions(s.channels, 64, 7).stride(2).padding(3).bias(false)));
    bn_ = register_module("bn", nn::BatchNorm2d(64));
    const int widths[] = {64, 128, 256, 512};
    int in = 64;
    for (int stage = 0; stage < 4; ++stage) {
      for (int b = 0; b < 2; ++b) {
        const int stride = (stage > 0 && b == 0) ? 2 : 1;
        blocks_.push_back(register_module(absl::StrCat("layer", stage + 1, "_", b),
                                          std::make_shared<BasicBlock>(in, widths[stage], stride)));
        in = widths[stage];
      }
    }
    fc_ = register_module("fc", nn::Linear(512, s.classes));
  }

  torch::Tensor forward(torch::Tensor x) override {
    x = torch::relu(bn_->forward(stem_->forward(x)));
    if (!small_) x = torch::max_pool2d(x, 3, 2, 1);
    for (auto& block : blocks_) x = block->forward(x);
    x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
    return fc_->forward(x);
  }

 private:
  bool small_;
  nn::Conv2d stem_{nullptr};
  nn::BatchNorm2d bn_{nullptr};
  std::vector<std::shared_ptr<BasicBlock>> blocks_;
  nn::Linear fc_{nullptr};
};

}  // namespace

absl::StatusOr<std::shared_ptr<Net>> MakeModel(const std::string& name, const ModelShape& shape) {
  if (name == "mlp") return std::shared_ptr<Net>(std::make_shared<Mlp>(shape));
  if (name == "cnn") return std::shared_ptr<Net>(std::make_shared<SmallCnn>(shape));
  if (name == "resnet18") return std::shared_ptr<Net>(std::make_shared<ResNet18>(shape));
  return absl::InvalidArgumentError(
      absl::StrCat("unknown model '", name, "' (mlp, cnn, resnet18)"));
}

}  // namespace muster
