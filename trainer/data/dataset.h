// Datasets: images with integer labels, read into caller-provided buffers so
// that this directory needs no LibTorch. Implementations are immutable after
// construction and thread-safe.
#ifndef MUSTER_TRAINER_DATA_DATASET_H_
#define MUSTER_TRAINER_DATA_DATASET_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace muster {

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual int channels() const = 0;
  virtual int height() const = 0;
  virtual int width() const = 0;
  virtual int num_classes() const = 0;
  int64_t example_floats() const { return int64_t{channels()} * height() * width(); }

  // Writes examples `indices[0..n)`: `images` receives n * example_floats()
  // normalised floats (N, C, H, W order), `labels` n class indices.
  virtual void Fill(const int64_t* indices, int64_t n, float* images, int64_t* labels) const = 0;
};

// Fashion-MNIST from its IDX .gz files in `dir` (train: train-images-idx3-
// ubyte.gz / train-labels-idx1-ubyte.gz; test: t10k-*). Errors: NOT_FOUND
// naming the missing file; DATA_LOSS naming the file and the field when a
// file is truncated, has the wrong magic number or inconsistent sizes.
absl::StatusOr<std::unique_ptr<Dataset>> LoadFashionMnist(const std::string& dir, bool train);

// Deterministic synthetic images (each example is a function of its index),
// for benchmarks: `size` examples of C x H x W, `classes` labels.
std::unique_ptr<Dataset> NewSyntheticDataset(int64_t size, int channels, int height, int width,
                                             int classes);

// Where Debian's dataset-fashion-mnist package puts the files.
inline constexpr char kDefaultFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";

}  // namespace muster

#endif  // MUSTER_TRAINER_DATA_DATASET_H_
