#include "trainer/lib/step_lifecycle.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace muster {

const char* StepStateName(StepState s) {
  switch (s) {
    case StepState::kStarting: return "starting";
    case StepState::kReady: return "ready";
    case StepState::kPrepared: return "prepared";
    case StepState::kInBackward: return "in backward";
    case StepState::kFailed: return "failed";
    case StepState::kBoundaryDue: return "boundary due";
    case StepState::kAtBoundary: return "at the boundary";
    case StepState::kEnded: return "ended";
    case StepState::kBroken: return "broken";
  }
  return "?";
}

absl::Status StepLifecycle::Move(const char* move, std::initializer_list<StepState> from,
                                 StepState to) {
  if (std::find(from.begin(), from.end(), state_) == from.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("step lifecycle: ", move, " while ", StepStateName(state_)));
  }
  state_ = to;
  return absl::OkStatus();
}

absl::Status StepLifecycle::Ready() {
  return Move("Ready", {StepState::kStarting}, StepState::kReady);
}
absl::Status StepLifecycle::Prepare() {
  // kPrepared again: the program asked for the next step without taking
  // this one (no backward at all); it is prepared anew.
  return Move("Prepare", {StepState::kReady, StepState::kPrepared}, StepState::kPrepared);
}
absl::Status StepLifecycle::Backward() {
  return Move("Backward", {StepState::kPrepared, StepState::kInBackward}, StepState::kInBackward);
}
absl::Status StepLifecycle::NextPass() {
  return Move("NextPass", {StepState::kBoundaryDue}, StepState::kInBackward);
}
absl::Status StepLifecycle::Reduced() {
  return Move("Reduced", {StepState::kInBackward}, StepState::kBoundaryDue);
}
absl::Status StepLifecycle::Fail() {
  return Move("Fail", {StepState::kInBackward}, StepState::kFailed);
}
absl::Status StepLifecycle::Salvaged() {
  return Move("Salvaged", {StepState::kFailed}, StepState::kBoundaryDue);
}
absl::Status StepLifecycle::Dropped() {
  return Move("Dropped", {StepState::kFailed}, StepState::kReady);
}
absl::Status StepLifecycle::StepTaken() {
  return Move("StepTaken",
              {StepState::kStarting, StepState::kReady, StepState::kAtBoundary,
               StepState::kBoundaryDue},
              StepState::kBoundaryDue);
}
absl::Status StepLifecycle::BeginBoundary() {
  return Move("BeginBoundary", {StepState::kBoundaryDue}, StepState::kAtBoundary);
}
absl::Status StepLifecycle::Settle() {
  return Move("Settle", {StepState::kAtBoundary}, StepState::kReady);
}

absl::Status StepLifecycle::End(StepOutcome outcome) {
  if (state_ == StepState::kBroken) {
    return absl::FailedPreconditionError("step lifecycle: End while broken");
  }
  state_ = StepState::kEnded;
  outcome_ = outcome;
  return absl::OkStatus();
}

void StepLifecycle::Break(absl::Status error) {
  if (error.ok()) return;
  state_ = StepState::kBroken;
  status_ = std::move(error);
}

}  // namespace muster
