// Loss-scaled gradients back to their true size (muster::GradScaler).
#ifndef MUSTER_TRAINER_DDP_UNSCALE_H_
#define MUSTER_TRAINER_DDP_UNSCALE_H_

#include <torch/types.h>

#include <vector>

namespace muster {

// Multiplies each defined .grad of `params` by `inverse_scale` in place,
// as torch.amp.GradScaler's unscale_ does; true when any of them then holds
// an inf or a NaN. One host synchronisation in all.
bool UnscaleGradients(const std::vector<torch::Tensor>& params, float inverse_scale);

}  // namespace muster

#endif  // MUSTER_TRAINER_DDP_UNSCALE_H_
