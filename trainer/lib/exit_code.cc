// Distributed::ExitCode: the exit status a program returns for its outcome
// (include/muster/muster.h lists them), and the engine's StepOutcome,
// which the outcome is.
#include "muster/muster.h"
#include "trainer/lib/step_lifecycle.h"

namespace muster {

static_assert(static_cast<int>(StepOutcome::kStopped) ==
                  static_cast<int>(Distributed::Outcome::kStopped) &&
              static_cast<int>(StepOutcome::kLeft) == static_cast<int>(Distributed::Outcome::kLeft) &&
              static_cast<int>(StepOutcome::kStoppedWithoutCheckpoint) ==
                  static_cast<int>(Distributed::Outcome::kStoppedWithoutCheckpoint),
              "StepOutcome follows Distributed::Outcome");

int Distributed::ExitCode(const absl::StatusOr<Outcome>& outcome) {
  if (!outcome.ok()) {
    // Bad options, or a job token the coordinator refuses: no restart mends
    // either.
    if (absl::IsInvalidArgument(outcome.status()) || absl::IsUnauthenticated(outcome.status())) {
      return kExitConfig;
    }
    if (absl::IsDataLoss(outcome.status())) return kExitDataLoss;
    return kExitError;
  }
  switch (*outcome) {
    case Outcome::kStopped: return kExitStopped;
    case Outcome::kStoppedWithoutCheckpoint: return kExitStoppedWithoutCheckpoint;
    case Outcome::kFinished:
    case Outcome::kLeft: return 0;
  }
  return kExitError;
}

}  // namespace muster
