// TrainingState: everything a trainer holds that must be the same on every
// rank and survive a restart — the model, the optimizer's state, the user's
// extra tensors and blobs. Checkpoints write it, state transfers broadcast
// it, and both name its tensors the same way:
//   "param.<name>", "buffer.<name>"   the model (ModelTensors)
//   "<param>.<field>"                 the optimizer (OptimizerTensors)
//   "tensor.<name>", "blob.<name>"    extras (ExtraTensors; a blob is a U8 vector)
//
// Thread-safety: none of its own; used by the training thread, or by the
// checkpoint writer while the training thread waits for its snapshot.
#ifndef MUSTER_TRAINER_CHECKPOINT_TRAINING_STATE_H_
#define MUSTER_TRAINER_CHECKPOINT_TRAINING_STATE_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "muster/blob.h"
#include "muster/optimizer_codec.h"
#include "trainer/checkpoint/state_tensors.h"

namespace muster {

struct TrainingState {
  torch::nn::Module* model = nullptr;            // never null once validated
  torch::optim::Optimizer* optimizer = nullptr;  // may be null
  const OptimizerCodec* codec = nullptr;         // set with an optimizer
  std::shared_ptr<const OptimizerCodec> own_codec;  // a user's codec, kept alive
  NamedTensors tensors;                          // extra tensors, by user name
  std::vector<Blob> blobs;

  // (From the public muster::State: trainer/lib/state_from.h.)
  // A model and (optionally) one of LibTorch's optimizers, nothing else.
  static TrainingState Of(torch::nn::Module* model, torch::optim::Optimizer* optimizer);

  NamedTensors Model() const { return ModelTensors(*model); }
  // Gives every parameter its optimizer state first (see EnsureOptimizerState).
  NamedTensors Optimizer() const;
  // Puts tensors named as Optimizer() names them into the optimizer's state
  // (after a transfer). Errors: the codec's.
  absl::Status LoadOptimizer(const NamedTensors& tensors) const;
  // The extra tensors and the blobs' current bytes.
  NamedTensors Extra() const;
  bool has_extra() const { return !tensors.empty() || !blobs.empty(); }
  // Hands the blobs' bytes (by blob name) to their load functions. An absent
  // name is an error (DATA_LOSS), as is an error from load.
  absl::Status LoadBlobs(const std::map<std::string, std::string>& bytes) const;
};

// A blob's bytes as a U8 tensor, and back.
torch::Tensor BytesTensor(const std::string& bytes);
std::string TensorBytes(const torch::Tensor& t);

}  // namespace muster

#endif  // MUSTER_TRAINER_CHECKPOINT_TRAINING_STATE_H_
