// The one place that knows LibTorch's optimizers: an OptimizerCodec
// (include/muster/optimizer_codec.h) for each of SGD, Adam, AdamW, RMSprop,
// Adagrad and LBFGS.
#ifndef MUSTER_TRAINER_CHECKPOINT_OPTIMIZER_CODECS_H_
#define MUSTER_TRAINER_CHECKPOINT_OPTIMIZER_CODECS_H_

#include "muster/optimizer_codec.h"

namespace muster {

// The codec of `optimizer` (by the type of its first group's options), or
// null for an optimizer LibTorch does not ship. Codecs are stateless
// singletons.
const OptimizerCodec* BuiltinOptimizerCodec(const torch::optim::Optimizer& optimizer);

}  // namespace muster

#endif  // MUSTER_TRAINER_CHECKPOINT_OPTIMIZER_CODECS_H_
