#include "coordinator/actions.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace muster {
namespace {

// What a decision collects runs after its lock is released: an action may
// take the lock again (as completions that re-enter the coordinator do).
TEST(DecisionTest, ActionsRunAfterTheLockIsReleasedInTheOrderAdded) {
  absl::Mutex mu;
  std::vector<std::string> ran;
  {
    Decision decision(&mu, nullptr);
    mu.AssertHeld();
    decision.actions().Add([&] {
      ASSERT_TRUE(mu.TryLock()) << "an action ran under the decision's lock";
      mu.Unlock();
      ran.push_back("first");
    });
    decision.actions().Add([&] { ran.push_back("second"); });
    EXPECT_TRUE(ran.empty());
  }
  EXPECT_EQ(ran, (std::vector<std::string>{"first", "second"}));
}

// The gate also runs outside the lock, before the first action; when it
// fails (the decision is not durable) nothing is announced.
TEST(DecisionTest, TheGateRunsOutsideTheLockAndAFailedGateDropsTheActions) {
  absl::Mutex mu;
  bool gate_saw_lock_free = false;
  int ran = 0;
  {
    Decision decision(&mu, [&] {
      gate_saw_lock_free = mu.TryLock();
      if (gate_saw_lock_free) mu.Unlock();
      return false;
    });
    decision.actions().Add([&] { ++ran; });
  }
  EXPECT_TRUE(gate_saw_lock_free);
  EXPECT_EQ(ran, 0);
}

// No actions: the gate (a wait for the persister) is not even run.
TEST(DecisionTest, ADecisionWithoutActionsDoesNotWaitAtTheGate) {
  absl::Mutex mu;
  int gates = 0;
  { Decision decision(&mu, [&] { return ++gates > 0; }); }
  EXPECT_EQ(gates, 0);
  EXPECT_TRUE(mu.TryLock());
  mu.Unlock();
}

}  // namespace
}  // namespace muster
