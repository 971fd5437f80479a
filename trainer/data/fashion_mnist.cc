#include <cmath>

#include "absl/strings/str_cat.h"
#include "trainer/data/dataset.h"
#include "trainer/data/idx.h"

namespace muster {
namespace {

// Mean and standard deviation of Fashion-MNIST's training pixels in [0, 1].
constexpr float kMean = 0.2860f;
constexpr float kStd = 0.3530f;

class FashionMnist : public Dataset {
 public:
  FashionMnist(IdxArray images, IdxArray labels)
      : images_(std::move(images)), labels_(std::move(labels)) {}

  int64_t size() const override { return images_.dims[0]; }
  int channels() const override { return 1; }
  int height() const override { return static_cast<int>(images_.dims[1]); }
  int width() const override { return static_cast<int>(images_.dims[2]); }
  int num_classes() const override { return 10; }

  void Fill(const int64_t* indices, int64_t n, float* images, int64_t* labels) const override {
    const int64_t per = example_floats();
    for (int64_t k = 0; k < n; ++k) {
      const uint8_t* src = images_.data.data() + indices[k] * per;
      float* dst = images + k * per;
      for (int64_t i = 0; i < per; ++i) dst[i] = (src[i] / 255.0f - kMean) / kStd;
      labels[k] = labels_.data[indices[k]];
    }
  }

 private:
  IdxArray images_;
  IdxArray labels_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Dataset>> LoadFashionMnist(const std::string& dir, bool train) {
  const std::string prefix = train ? "train" : "t10k";
  const std::string image_path = absl::StrCat(dir, "/", prefix, "-images-idx3-ubyte.gz");
  const std::string label_path = absl::StrCat(dir, "/", prefix, "-labels-idx1-ubyte.gz");
  auto images = ReadIdx(image_path, 3);
  if (!images.ok()) return images.status();
  auto labels = ReadIdx(label_path, 1);
  if (!labels.ok()) return labels.status();
  if (images->dims[0] != labels->dims[0]) {
    return absl::DataLossError(absl::StrCat(image_path, " holds ", images->dims[0], " images but ",
                                            label_path, " holds ", labels->dims[0], " labels"));
  }
  for (uint8_t l : labels->data) {
    if (l >= 10) return absl::DataLossError(absl::StrCat(label_path, ": label ", int{l}, " >= 10"));
  }
  return std::unique_ptr<Dataset>(new FashionMnist(std::move(*images), std::move(*labels)));
}

namespace {

class Synthetic : public Dataset {
 public:
  Synthetic(int64_t size, int c, int h, int w, int classes)
      : size_(size), c_(c), h_(h), w_(w), classes_(classes) {}
  int64_t size() const override { return size_; }
  int channels() const override { return c_; }
  int height() const override { return h_; }
  int width() const override { return w_; }
  int num_classes() const override { return classes_; }

  void Fill(const int64_t* indices, int64_t n, float* images, int64_t* labels) const override {
    const int64_t per = example_floats();
    for (int64_t k = 0; k < n; ++k) {
      const int64_t label = indices[k] % classes_;
      // A cheap hash of (index, position): values in [-1, 1), plus a
      // label-dependent offset so the task is learnable.
      uint64_t x = static_cast<uint64_t>(indices[k]) * 0x9E3779B97F4A7C15ull + 1;
      float* dst = images + k * per;
      for (int64_t i = 0; i < per; ++i) {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        const float noise = static_cast<float>((x * 0x2545F4914F6CDD1Dull) >> 40) / 8388608.0f - 1.0f;
        dst[i] = 0.5f * noise + (i % classes_ == label ? 1.0f : 0.0f);
      }
      labels[k] = label;
    }
  }

 private:
  int64_t size_;
  int c_, h_, w_, classes_;
};

}  // namespace

std::unique_ptr<Dataset> NewSyntheticDataset(int64_t size, int channels, int height, int width,
                                             int classes) {
  return std::make_unique<Synthetic>(size, channels, height, width, classes);
}

}  // namespace muster
