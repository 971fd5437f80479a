#include "trainer/ddp/unscale.h"

#include <torch/torch.h>

namespace muster {

bool UnscaleGradients(const std::vector<torch::Tensor>& params, float inverse_scale) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> non_finite;
  for (const torch::Tensor& p : params) {
    torch::Tensor g = p.grad();
    if (!g.defined()) continue;
    g.mul_(inverse_scale);
    non_finite.push_back(g.isfinite().logical_not().any());
  }
  return !non_finite.empty() && torch::stack(non_finite).any().item<bool>();
}

}  // namespace muster
