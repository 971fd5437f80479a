#include "trainer/elastic/step_policy.h"

#include <cmath>

namespace muster {

ControlArray ControlWords::ToArray() const {
  return {stop ? 1.0f : 0.0f, leave ? 1.0f : 0.0f, newer_world ? 1.0f : 0.0f,
          checkpoint_due ? 1.0f : 0.0f, finish ? 1.0f : 0.0f};
}

StepDecision DecideAfterStep(const ControlArray& averages, int world, const ControlWords& mine,
                             bool drained) {
  const int stopping = static_cast<int>(std::lround(averages[0] * world));
  const int leaving = RanksLeaving(averages, world);
  const int heard_newer = static_cast<int>(std::lround(averages[2] * world));
  if (averages[4] > 0) return StepDecision::kFinish;
  if (stopping > 0 || (leaving == world && !drained)) return StepDecision::kStop;
  if (mine.leave && leaving > 0) return StepDecision::kLeave;
  if (leaving > 0 || heard_newer > 0) return StepDecision::kRegroup;
  return StepDecision::kContinue;
}

bool CheckpointDueOnAnyRank(const ControlArray& averages) { return averages[3] > 0; }

int RanksLeaving(const ControlArray& averages, int world) {
  return static_cast<int>(std::lround(averages[1] * world));
}

}  // namespace muster
