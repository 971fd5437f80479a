// The engine's TrainingState from the public muster::State, checked.
#ifndef MUSTER_TRAINER_LIB_STATE_FROM_H_
#define MUSTER_TRAINER_LIB_STATE_FROM_H_

#include "absl/status/statusor.h"
#include "muster/muster.h"
#include "trainer/checkpoint/training_state.h"

namespace muster {

// INVALID_ARGUMENT naming what is wrong: no model, an optimizer whose state
// muster cannot carry (no codec), duplicate or empty names, an undefined
// tensor, a blob without save or load.
absl::StatusOr<TrainingState> TrainingStateFrom(const State& state);

}  // namespace muster

#endif  // MUSTER_TRAINER_LIB_STATE_FROM_H_
