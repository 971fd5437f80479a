// TrainingCounters: the numbers besides the tensors that every rank of a
// world holds alike between steps, and that travel with the state: how many
// steps were taken, where the sampler stands, the world size the learning
// rates were set for, and how many passes of a step of several passes
// (State::modules) are done.
//
// The state transfer (state_sync.h) broadcasts them, and StateDigest and
// CheckSameState hash them, as int64 words in one fixed order (ToWords);
// that order is the format between the ranks of a job (one build), and
// both ends read it alike:
//   [0] step  [1] sample offset  [2] LR world size  [3] returned epoch
//   [4] passes done  [5...] the returned examples, oldest first.
// Checkpoints do not use the words: they keep each counter in a field of
// its own (CheckpointMeta).
//
// A plain value; not thread-safe.
#ifndef MUSTER_TRAINER_ELASTIC_TRAINING_COUNTERS_H_
#define MUSTER_TRAINER_ELASTIC_TRAINING_COUNTERS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/data/sampler.h"

namespace muster {

struct TrainingCounters {
  // Steps committed (taken, salvaged or caught up) since the job began.
  int64_t step = 0;
  // Where the sampler stands: the global sample offset and the examples
  // that salvaged steps handed back.
  SamplerPosition position;
  // The world size the learning rates were set for (Options::elastic_lr);
  // 0 until a world is entered or a checkpoint restored.
  int lr_world_size = 0;
  // Synchronised backward passes done in the step under way, in a step of
  // several passes (BeforeBackwardFor); 0 between steps, and always 0
  // with one pass per step.
  int pass = 0;

  // The words, in the order above.
  std::vector<int64_t> ToWords() const;
  // The counters of `words` (ToWords' order). Errors: DATA_LOSS when there
  // are fewer than the five fixed words.
  static absl::StatusOr<TrainingCounters> FromWords(const std::vector<int64_t>& words);

  bool operator==(const TrainingCounters& o) const {
    return step == o.step && position == o.position && lr_world_size == o.lr_world_size &&
           pass == o.pass;
  }
};

}  // namespace muster

#endif  // MUSTER_TRAINER_ELASTIC_TRAINING_COUNTERS_H_
