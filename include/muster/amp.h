// Mixed precision for LibTorch programs: an autocast scope, as Python's
// `with torch.autocast(...)`, and a loss scaler, as `torch.amp.GradScaler`,
// whose decision to skip a step is one decision for the whole world.
//
//   muster::GradScaler scaler;                 // fp16: scale the loss
//   state.grad_scaler = &scaler;               // travels, checkpoints, agrees
//   ...
//   while (!d.ShouldStop()) {
//     torch::Tensor loss;
//     {
//       muster::Autocast autocast(torch::kCUDA, torch::kHalf);
//       loss = LossOn(d.Batch());
//     }
//     optimizer.zero_grad();
//     d.BeforeBackward();
//     scaler.scale(loss).backward();
//     if (!d.AfterBackward().ok()) continue;
//     scaler.unscale_(optimizer);              // before your own clipping
//     torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
//     scaler.step(optimizer);                  // skipped on inf/NaN, on every rank
//     scaler.update();
//   }
//
// docs/library.md, "Mixed precision", says what each call does under muster.
#ifndef MUSTER_AMP_H_
#define MUSTER_AMP_H_

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cstdint>
#include <map>
#include <string>

#include "muster/blob.h"

namespace muster {

// Autocast on `device` (torch::kCPU or torch::kCUDA) with `dtype`
// (torch::kBFloat16, or torch::kHalf) for the scope's forward: ops that
// autocast lists run in `dtype`, the others in float32. Restores the
// previous state at the end of the scope, and clears autocast's cache of
// cast weights when the outermost scope ends, as torch.autocast does.
// Autocast is per thread. `enabled` false leaves everything as it is.
class Autocast {
 public:
  Autocast(torch::DeviceType device, torch::ScalarType dtype, bool enabled = true);
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  torch::DeviceType device_;
  bool enabled_;
  bool was_enabled_ = false;
  torch::ScalarType was_dtype_ = torch::kFloat32;
};

struct GradScalerOptions {
  double init_scale = 65536.0;
  double growth_factor = 2.0;    // after growth_interval steps without inf/NaN
  double backoff_factor = 0.5;   // after a step with inf/NaN
  int64_t growth_interval = 2000;
  bool enabled = true;           // false: scale() returns the loss, step() steps
};

// torch.amp.GradScaler's dynamic loss scaling. Register it as
// State::grad_scaler: then AfterBackward divides each pass's averaged
// gradients by the scale and decides, from those averages, whether any is
// inf or NaN, so every rank skips the same steps (a rank whose own
// gradients overflowed makes the average overflow on all), also where the
// optimizer state is sharded or the gradients reduce-scattered; and its
// scale, growth count and skipped steps travel to joiners, go into
// checkpoints and into the ranks' state digest. Unregistered it works as
// PyTorch's does, on the gradients the rank holds.
//
// Not thread-safe: the training thread's.
class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});

  // `loss` times the scale (the loss itself when disabled).
  torch::Tensor scale(const torch::Tensor& loss) const;
  // Divides the gradients of the optimizer's parameters by the scale and
  // notes whether any is inf or NaN, once per optimizer per step (a second
  // call does nothing). Registered, AfterBackward has done it already.
  // Call before clipping or reading the gradients.
  void unscale_(torch::optim::Optimizer& optimizer);
  // optimizer.step() unless its gradients held inf or NaN (unscaling them
  // first where unscale_ has not); true when it stepped.
  bool step(torch::optim::Optimizer& optimizer);
  // After the step's optimizers stepped: the scale times backoff_factor
  // when any gradient of the step was inf or NaN, else times
  // growth_factor after growth_interval such steps in a row. Then a new
  // step begins.
  void update();

  double get_scale() const { return scale_; }
  int64_t growth_tracker() const { return growth_tracker_; }
  bool enabled() const { return options_.enabled; }
  // The optimizer steps skipped in the run (part of the state).
  int64_t skipped_steps() const { return skipped_; }

  // The scale, the growth count and the skipped steps as bytes (what
  // State::grad_scaler registers, as the blob "grad_scaler"; a scaler
  // registered by hand goes into State::blobs this way). Its load refuses
  // bytes that are not a positive, finite scale and two counts
  // (INVALID_ARGUMENT).
  Blob StateBlob(std::string name = "grad_scaler");

  // For muster's AfterBackward: 1/scale as float32, as PyTorch computes it.
  float inverse_scale() const;
  // For muster's AfterBackward: the pass's averaged gradients were divided
  // by the scale, and the world found inf or NaN among them (`found`) or
  // not. The optimizers the program unscales or steps next take this
  // verdict.
  void RecordUnscaledPass(bool found);

 private:
  GradScalerOptions options_;
  float scale_;
  int64_t growth_tracker_ = 0;
  int64_t skipped_ = 0;
  // The passes AfterBackward unscaled (RecordUnscaledPass), and the last
  // one's verdict.
  int64_t passes_ = 0;
  bool pass_found_ = false;
  struct Unscaled {
    int64_t pass;  // the pass whose verdict it took; 0: unscaled here
    bool found;
  };
  // This step's optimizers whose gradients were unscaled.
  std::map<const torch::optim::Optimizer*, Unscaled> unscaled_;
};

}  // namespace muster

#endif  // MUSTER_AMP_H_
