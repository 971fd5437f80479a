// muster::Autocast and muster::GradScaler (muster/amp.h).
#include "muster/amp.h"

#include <ATen/autocast_mode.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <cinttypes>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "trainer/ddp/unscale.h"

namespace muster {

// LibTorch 2 names autocast's state by device; 1.13 has a function per device.
Autocast::Autocast(torch::DeviceType device, torch::ScalarType dtype, bool enabled)
    : device_(device), enabled_(enabled) {
  if (!enabled_) return;
#if TORCH_VERSION_MAJOR >= 2
  was_enabled_ = at::autocast::is_autocast_enabled(device_);
  was_dtype_ = at::autocast::get_autocast_dtype(device_);
  at::autocast::set_autocast_dtype(device_, dtype);
  at::autocast::set_autocast_enabled(device_, true);
#else
  if (device_ == torch::kCUDA) {
    was_enabled_ = at::autocast::is_enabled();
    was_dtype_ = at::autocast::get_autocast_gpu_dtype();
    at::autocast::set_autocast_gpu_dtype(dtype);
    at::autocast::set_enabled(true);
  } else {
    was_enabled_ = at::autocast::is_cpu_enabled();
    was_dtype_ = at::autocast::get_autocast_cpu_dtype();
    at::autocast::set_autocast_cpu_dtype(dtype);
    at::autocast::set_cpu_enabled(true);
  }
#endif
  at::autocast::increment_nesting();
}

Autocast::~Autocast() {
  if (!enabled_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
#if TORCH_VERSION_MAJOR >= 2
  at::autocast::set_autocast_enabled(device_, was_enabled_);
  at::autocast::set_autocast_dtype(device_, was_dtype_);
#else
  if (device_ == torch::kCUDA) {
    at::autocast::set_enabled(was_enabled_);
    at::autocast::set_autocast_gpu_dtype(was_dtype_);
  } else {
    at::autocast::set_cpu_enabled(was_enabled_);
    at::autocast::set_autocast_cpu_dtype(was_dtype_);
  }
#endif
}

GradScaler::GradScaler(GradScalerOptions options)
    : options_(options), scale_(static_cast<float>(options.init_scale)) {}

torch::Tensor GradScaler::scale(const torch::Tensor& loss) const {
  return options_.enabled ? loss * scale_ : loss;
}

float GradScaler::inverse_scale() const {
  return static_cast<float>(1.0 / static_cast<double>(scale_));
}

void GradScaler::RecordUnscaledPass(bool found) {
  ++passes_;
  pass_found_ = found;
}

void GradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled) return;
  auto it = unscaled_.find(&optimizer);
  if (passes_ > 0) {
    // Registered: AfterBackward unscaled the pass and the world decided.
    if (it == unscaled_.end() || it->second.pass != passes_) {
      unscaled_[&optimizer] = {passes_, pass_found_};
    }
    return;
  }
  if (it != unscaled_.end()) return;
  std::vector<torch::Tensor> params;
  for (const auto& group : optimizer.param_groups()) {
    params.insert(params.end(), group.params().begin(), group.params().end());
  }
  unscaled_[&optimizer] = {0, UnscaleGradients(params, inverse_scale())};
}

bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled) {
    optimizer.step();
    return true;
  }
  unscale_(optimizer);
  if (unscaled_[&optimizer].found) {
    ++skipped_;
    return false;
  }
  optimizer.step();
  return true;
}

void GradScaler::update() {
  if (!options_.enabled || unscaled_.empty()) return;
  bool found = false;
  for (const auto& [optimizer, u] : unscaled_) found = found || u.found;
  unscaled_.clear();
  // As torch's _amp_update_scale_, in float32.
  if (found) {
    scale_ *= static_cast<float>(options_.backoff_factor);
    growth_tracker_ = 0;
  } else if (++growth_tracker_ >= options_.growth_interval) {
    const float grown = scale_ * static_cast<float>(options_.growth_factor);
    if (std::isfinite(grown)) scale_ = grown;
    growth_tracker_ = 0;
  }
}

Blob GradScaler::StateBlob(std::string name) {
  Blob blob;
  blob.name = name;
  blob.save = [this] {
    char text[96];
    std::snprintf(text, sizeof text, "%a %" PRId64 " %" PRId64, static_cast<double>(scale_),
                  growth_tracker_, skipped_);
    return std::string(text);
  };
  blob.load = [this, name](const std::string& bytes) {
    double scale = 0;
    int64_t tracker = -1, skipped = -1;
    if (std::sscanf(bytes.c_str(), "%la %" SCNd64 " %" SCNd64, &scale, &tracker, &skipped) != 3 ||
        !(scale > 0) || !std::isfinite(scale) || tracker < 0 || skipped < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": '", bytes, "' is not a loss scale, a growth count and a count of skips"));
    }
    scale_ = static_cast<float>(scale);
    growth_tracker_ = tracker;
    skipped_ = skipped;
    return absl::OkStatus();
  };
  return blob;
}

}  // namespace muster
