// muster::OptimizerCodec: how muster reads and writes an optimizer's state,
// so that it travels to joiners, into checkpoints and back, bit for bit.
//
// muster knows LibTorch's optimizers: SGD, Adam, AdamW, RMSprop, Adagrad
// and LBFGS. For an optimizer of your own, implement this interface and set
// State::optimizer_codec. The state is per parameter (LibTorch keeps it by
// parameter); each piece of it is a named field:
//   * Initial: the state the optimizer would create for a parameter before
//     its first step (zeros, step 0), or null when it creates none. muster
//     gives it to every parameter that has none, so that every rank holds
//     the same fields before a transfer; so it must not change what the
//     first step computes.
//   * Save: the fields of one parameter's state (given its group's
//     options), each a tensor: tensors the
//     state holds (shared, not copied) and scalars as 0-dim tensors (int64
//     counters as kInt64, doubles as kFloat64). Names: letters, digits, '_'.
//     The same fields, shapes and dtypes for equal states on every rank.
//   * Load: puts fields (as Save named and shaped them) into a state; a
//     tensor may be adopted as it is. INVALID_ARGUMENT when one is missing.
// Group options (learning rate, betas, ...) are not state: every rank
// constructs the optimizer with the same options.
#ifndef MUSTER_OPTIMIZER_CODEC_H_
#define MUSTER_OPTIMIZER_CODEC_H_

#include <torch/optim/optimizer.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace muster {

class OptimizerCodec {
 public:
  using Fields = std::vector<std::pair<std::string, torch::Tensor>>;

  virtual ~OptimizerCodec() = default;
  // For messages ("RMSprop").
  virtual std::string name() const = 0;
  virtual std::unique_ptr<torch::optim::OptimizerParamState> Initial(
      const torch::Tensor& param, const torch::optim::OptimizerParamGroup& group,
      const torch::optim::Optimizer& optimizer) const = 0;
  // `options`: the options of the parameter's group.
  virtual Fields Save(const torch::optim::OptimizerParamState& state,
                      const torch::optim::OptimizerOptions& options) const = 0;
  virtual absl::Status Load(const std::map<std::string, torch::Tensor>& fields,
                            const torch::optim::OptimizerOptions& options,
                            torch::optim::OptimizerParamState* state) const = 0;
};

}  // namespace muster

#endif  // MUSTER_OPTIMIZER_CODEC_H_
