// The engine's step state machine: each move of the diagram in
// step_lifecycle.h, and each move it refuses.
#include "trainer/lib/step_lifecycle.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace muster {
namespace {

using S = StepState;

// A lifecycle brought to `state` through moves of the diagram.
StepLifecycle At(S state) {
  StepLifecycle l;
  auto ok = [](absl::Status s) { EXPECT_TRUE(s.ok()) << s; };
  if (state == S::kStarting) return l;
  ok(l.Ready());
  if (state == S::kReady) return l;
  if (state == S::kEnded) {
    ok(l.End(StepOutcome::kFinished));
    return l;
  }
  if (state == S::kBroken) {
    l.Break(absl::InternalError("x"));
    return l;
  }
  ok(l.Prepare());
  if (state == S::kPrepared) return l;
  ok(l.Backward());
  if (state == S::kInBackward) return l;
  if (state == S::kFailed) {
    ok(l.Fail());
    return l;
  }
  ok(l.Reduced());
  if (state == S::kBoundaryDue) return l;
  ok(l.BeginBoundary());
  EXPECT_EQ(l.state(), S::kAtBoundary);
  return l;
}

const S kAll[] = {S::kStarting,    S::kReady,      S::kPrepared, S::kInBackward, S::kFailed,
                  S::kBoundaryDue, S::kAtBoundary, S::kEnded,    S::kBroken};

struct Move {
  const char* name;
  absl::Status (StepLifecycle::*move)();
  std::vector<S> from;
  S to;
};

const Move kMoves[] = {
    {"Ready", &StepLifecycle::Ready, {S::kStarting}, S::kReady},
    {"Prepare", &StepLifecycle::Prepare, {S::kReady, S::kPrepared}, S::kPrepared},
    {"Backward", &StepLifecycle::Backward, {S::kPrepared, S::kInBackward}, S::kInBackward},
    {"Reduced", &StepLifecycle::Reduced, {S::kInBackward}, S::kBoundaryDue},
    {"Fail", &StepLifecycle::Fail, {S::kInBackward}, S::kFailed},
    {"Salvaged", &StepLifecycle::Salvaged, {S::kFailed}, S::kBoundaryDue},
    {"Dropped", &StepLifecycle::Dropped, {S::kFailed}, S::kReady},
    {"StepTaken", &StepLifecycle::StepTaken,
     {S::kStarting, S::kReady, S::kAtBoundary, S::kBoundaryDue}, S::kBoundaryDue},
    {"BeginBoundary", &StepLifecycle::BeginBoundary, {S::kBoundaryDue}, S::kAtBoundary},
    {"Settle", &StepLifecycle::Settle, {S::kAtBoundary}, S::kReady},
};

// Every move from every state: allowed where the diagram has it (and it
// lands where the diagram says), refused elsewhere with the state unchanged
// and FAILED_PRECONDITION naming the move and the state.
TEST(StepLifecycleTest, EachMoveGoesWhereTheDiagramSaysAndIsRefusedElsewhere) {
  for (const Move& m : kMoves) {
    for (S from : kAll) {
      StepLifecycle l = At(from);
      ASSERT_EQ(l.state(), from);
      const absl::Status s = (l.*m.move)();
      const bool allowed = std::find(m.from.begin(), m.from.end(), from) != m.from.end();
      if (allowed) {
        EXPECT_TRUE(s.ok()) << m.name << " from " << StepStateName(from) << ": " << s;
        EXPECT_EQ(l.state(), m.to) << m.name << " from " << StepStateName(from);
      } else {
        EXPECT_TRUE(absl::IsFailedPrecondition(s)) << m.name << " from " << StepStateName(from);
        EXPECT_NE(s.message().find(m.name), std::string::npos) << s;
        EXPECT_NE(s.message().find(StepStateName(from)), std::string::npos) << s;
        EXPECT_EQ(l.state(), from) << m.name << " changed a refused state";
      }
    }
  }
}

TEST(StepLifecycleTest, EndFromAnyStateButBrokenKeepsTheOutcome) {
  for (S from : kAll) {
    StepLifecycle l = At(from);
    const absl::Status s = l.End(StepOutcome::kStoppedWithoutCheckpoint);
    if (from == S::kBroken) {
      EXPECT_TRUE(absl::IsFailedPrecondition(s));
      EXPECT_EQ(l.state(), S::kBroken);
      continue;
    }
    EXPECT_TRUE(s.ok()) << StepStateName(from);
    EXPECT_TRUE(l.ended());
    EXPECT_TRUE(l.over());
    EXPECT_EQ(l.outcome(), StepOutcome::kStoppedWithoutCheckpoint);
  }
}

// An error is the state as soon as it happens, not only at the end.
TEST(StepLifecycleTest, BreakMakesTheErrorTheStatusAtOnce) {
  for (S from : kAll) {
    StepLifecycle l = At(from);
    l.Break(absl::DataLossError("digests differ"));
    EXPECT_EQ(l.state(), S::kBroken);
    EXPECT_TRUE(l.over());
    EXPECT_TRUE(absl::IsDataLoss(l.status())) << l.status();
  }
  StepLifecycle l;
  l.Break(absl::OkStatus());  // not an error: no change
  EXPECT_EQ(l.state(), S::kStarting);
  EXPECT_TRUE(l.status().ok());
}

TEST(StepLifecycleTest, ACatchUpSourceIsTakenOnce) {
  StepLifecycle l;
  EXPECT_EQ(l.TakeCatchUp(), -1);
  l.CatchUpFrom(2);
  EXPECT_EQ(l.TakeCatchUp(), 2);
  EXPECT_EQ(l.TakeCatchUp(), -1);
}

}  // namespace
}  // namespace muster
