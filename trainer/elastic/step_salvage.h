// Step salvage: when a peer fails during a step's gradient all-reduce, the
// survivors still hold their own gradients. After the regroup, every rank of
// the new world agrees here on what can be salvaged, and then all reduce
// those gradients again (GradientSync::Resync) instead of dropping the step.
//
// Each rank claims what it holds:
//   contributes  it holds a gradient for exactly the step the new world is
//                at (same step, same sampler position after the state
//                transfer), computed in world `generation` of `world` ranks
//                as rank `rank`;
//   in_step      it is inside AfterBackward, so its user code will run
//                optimizer.step() when the step is salvaged (a joiner or a
//                rank outside a step is not, and takes the state after the
//                step from a rank that is).
// One small all-reduce of the claims, and one of the old world's shares,
// give every rank the same plan: how many contribute, which shares of the
// old step were lost (their examples go back to the sampler), and which rank
// is the first in a step. Contributors from different old worlds (which a
// cascade of failures cannot produce, but a bug could) salvage nothing.
//
// Thread-safety: a collective; the training thread of each rank.
#ifndef MUSTER_TRAINER_ELASTIC_STEP_SALVAGE_H_
#define MUSTER_TRAINER_ELASTIC_STEP_SALVAGE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "trainer/comm/communicator.h"

namespace muster {

struct SalvageClaim {
  bool contributes = false;
  uint64_t generation = 0;  // of the world the gradient was computed in
  int world = 0;            // its size
  int rank = 0;             // this rank's place in it
  bool in_step = false;
};

struct SalvagePlan {
  int contributors = 0;      // 0: nothing to salvage (drop the step)
  int old_world = 0;         // size of the world the step was taken in
  std::vector<int> lost;     // its ranks whose shares nobody trained on
  int steppers = 0;          // ranks in_step
  int first_stepper = -1;    // the lowest such rank in the new world
  bool salvage() const { return contributors > 0; }
};

// Every rank of `comm` calls it with its claim; all get the same plan.
// Errors: the communicator's.
absl::StatusOr<SalvagePlan> AgreeOnSalvage(const SalvageClaim& mine, Communicator* comm,
                                           absl::Time deadline);

}  // namespace muster

#endif  // MUSTER_TRAINER_ELASTIC_STEP_SALVAGE_H_
