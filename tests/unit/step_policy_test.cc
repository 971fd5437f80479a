// StepPolicy: the decision every rank takes after a step from the averaged
// control words (stop, leave, newer world, a checkpoint due by time,
// finish).
#include "trainer/elastic/step_policy.h"

#include <gtest/gtest.h>

namespace muster {
namespace {

ControlArray Averages(int stop, int leave, int newer, int world, int checkpoint = 0,
                      int finish = 0) {
  return {static_cast<float>(stop) / world, static_cast<float>(leave) / world,
          static_cast<float>(newer) / world, static_cast<float>(checkpoint) / world,
          static_cast<float>(finish) / world};
}

TEST(StepPolicyTest, NothingAskedContinues) {
  EXPECT_EQ(DecideAfterStep(Averages(0, 0, 0, 4), 4, {}, false), StepDecision::kContinue);
}

TEST(StepPolicyTest, OneRankToldToStopStopsEveryRank) {
  EXPECT_EQ(DecideAfterStep(Averages(1, 0, 0, 4), 4, {}, false), StepDecision::kStop);
  EXPECT_EQ(DecideAfterStep(Averages(1, 1, 1, 3), 3, {true, false, false}, false),
            StepDecision::kStop);
}

TEST(StepPolicyTest, EveryRankLeavingAtOnceIsAPreemptionAndStops) {
  EXPECT_EQ(DecideAfterStep(Averages(0, 4, 0, 4), 4, {false, true, false}, false),
            StepDecision::kStop);
}

TEST(StepPolicyTest, EveryRankDrainedLeavesInsteadOfStopping) {
  EXPECT_EQ(DecideAfterStep(Averages(0, 2, 0, 2), 2, {false, true, false}, true),
            StepDecision::kLeave);
}

TEST(StepPolicyTest, TheLeavingRankLeavesAndTheOthersRegroup) {
  const auto words = Averages(0, 1, 0, 4);
  EXPECT_EQ(DecideAfterStep(words, 4, {false, true, false}, false), StepDecision::kLeave);
  EXPECT_EQ(DecideAfterStep(words, 4, {}, false), StepDecision::kRegroup);
}

TEST(StepPolicyTest, ANewerWorldHeardByOneRankRegroupsAll) {
  EXPECT_EQ(DecideAfterStep(Averages(0, 0, 1, 5), 5, {}, false), StepDecision::kRegroup);
}

TEST(StepPolicyTest, ControlWordsAreOnesAndZeros) {
  const ControlWords w{true, false, true, true, true};
  EXPECT_EQ(w.ToArray(), (ControlArray{1, 0, 1, 1, 1}));
  const ControlWords finish{false, false, false, false, true};
  EXPECT_EQ(finish.ToArray(), (ControlArray{0, 0, 0, 0, 1}));
}

// One rank of five asked to finish (early stopping) ends the job on every
// rank, even where others are asked to stop or leave at the same step: the
// job is over either way, and a stop would have a batch script requeue it.
TEST(StepPolicyTest, OneRankAskedToFinishFinishesEveryRankOverAStopOrLeave) {
  EXPECT_EQ(DecideAfterStep(Averages(0, 0, 0, 5, 0, 1), 5, {}, false), StepDecision::kFinish);
  EXPECT_EQ(DecideAfterStep(Averages(1, 1, 1, 5, 0, 1), 5, {false, true, false}, false),
            StepDecision::kFinish);
  EXPECT_EQ(DecideAfterStep(Averages(0, 5, 0, 5, 0, 1), 5, {false, true, false}, false),
            StepDecision::kFinish);
}

// One rank of seven whose clock says a checkpoint is due makes it due on
// all; it changes no decision.
TEST(StepPolicyTest, ACheckpointDueOnOneRankIsDueOnEveryRank) {
  EXPECT_FALSE(CheckpointDueOnAnyRank(Averages(0, 0, 0, 7)));
  EXPECT_TRUE(CheckpointDueOnAnyRank(Averages(0, 0, 0, 7, 1)));
  EXPECT_EQ(DecideAfterStep(Averages(0, 0, 0, 7, 1), 7, {}, false), StepDecision::kContinue);
}

}  // namespace
}  // namespace muster
