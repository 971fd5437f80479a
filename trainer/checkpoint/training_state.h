// TrainingState: everything a trainer holds that must be the same on every
// rank and survive a restart — the model, the optimizer's state, the user's
// extra tensors and blobs. Checkpoints write it, state transfers broadcast
// it, and both name its tensors the same way:
//   "param.<name>", "buffer.<name>"   the model (ModelTensors)
//   "param.<module>/<name>", ...      a named module's (State::modules)
//   "<param>.<field>"                 the optimizers (OptimizerTensors;
//                                     <param> as above, without "param.")
//   "tensor.<name>", "blob.<name>"    extras (ExtraTensors; a blob is a U8 vector)
//
// Thread-safety: none of its own; used by the training thread, or by the
// checkpoint writer while the training thread waits for its snapshot.
#ifndef MUSTER_TRAINER_CHECKPOINT_TRAINING_STATE_H_
#define MUSTER_TRAINER_CHECKPOINT_TRAINING_STATE_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "muster/blob.h"
#include "muster/optimizer_codec.h"
#include "trainer/checkpoint/state_tensors.h"

namespace muster {

// The blob that holds the optimizers' learning rates where the program sets
// them itself (CarryLearningRates, trainer/lib/learning_rates.h). A
// checkpoint written before it existed has none; its restore leaves the
// rates as the program set them.
inline constexpr char kLearningRatesBlob[] = "learning_rates";

struct TrainingState {
  // A module and where its tensors' names come from: State::model has
  // the empty name ("param.<name>"), a named module prefixes its own
  // ("param.<module>/<name>").
  struct Module {
    std::string name;
    torch::nn::Module* module = nullptr;  // never null once validated
  };
  struct Optimizer {
    std::string name;  // for messages; "" for State::optimizer
    torch::optim::Optimizer* optimizer = nullptr;  // never null once validated
    const OptimizerCodec* codec = nullptr;
    std::shared_ptr<const OptimizerCodec> own_codec;  // a user's codec, kept alive
  };
  std::vector<Module> modules;        // at least one once validated
  std::vector<Optimizer> optimizers;  // no parameter in two of them
  NamedTensors tensors;               // extra tensors, by user name
  std::vector<Blob> blobs;

  // (From the public muster::State: trainer/lib/state_from.h.)
  // A model and (optionally) one of LibTorch's optimizers, nothing else.
  static TrainingState Of(torch::nn::Module* model, torch::optim::Optimizer* optimizer);

  // Every module's parameters and buffers ("param.", "buffer.", prefixed
  // by the module's name when it has one), each tensor once: a tensor
  // registered under two names (a tied weight) or in two modules keeps the
  // first name, and is reduced, moved and checkpointed once.
  NamedTensors Model() const;
  // Every module's parameters, named as Model() names them without the
  // "param." (what optimizer tensors are named after).
  NamedTensors Parameters() const;
  // Gives every parameter its optimizer state first (see EnsureOptimizerState).
  NamedTensors OptimizerState() const;
  // Puts tensors named as OptimizerState() names them into the optimizers'
  // state (after a transfer). Errors: the codecs'.
  absl::Status LoadOptimizer(const NamedTensors& tensors) const;
  // The extra tensors and the blobs' current bytes.
  NamedTensors Extra() const;
  bool has_extra() const { return !tensors.empty() || !blobs.empty(); }
  // Hands the blobs' bytes (by blob name) to their load functions. An absent
  // name is an error (DATA_LOSS), but kLearningRatesBlob's, as is an error
  // from load.
  absl::Status LoadBlobs(const std::map<std::string, std::string>& bytes) const;
};

// A blob's bytes as a U8 tensor, and back.
torch::Tensor BytesTensor(const std::string& bytes);
std::string TensorBytes(const torch::Tensor& t);

}  // namespace muster

#endif  // MUSTER_TRAINER_CHECKPOINT_TRAINING_STATE_H_
