// AgreeOnSalvage over a real Gloo world (ranks as threads): every rank gets
// the same plan from the claims of all.
#include <gtest/gtest.h>

#include <functional>


#include "absl/strings/str_cat.h"
#include "tests/integration/comm_harness.h"
#include "trainer/elastic/step_salvage.h"

namespace muster {
namespace {

// Runs AgreeOnSalvage on a world of 4 with claim(rank); returns each rank's plan.
std::vector<SalvagePlan> Agree(const std::function<SalvageClaim(int)>& claim) {
  CommHarness h({0, 1, 2, 3}, absl::StrCat("salvage", ::getpid()));
  std::vector<SalvagePlan> plans(4);
  CommOptions o;
  o.backend = Backend::kGloo;
  o.gloo.hostname = "127.0.0.1";
  EXPECT_TRUE(h.Run(o, [&](RankContext& rc) {
    absl::StatusOr<SalvagePlan> plan =
        AgreeOnSalvage(claim(rc.world.rank), rc.comm.get(), absl::Now() + absl::Seconds(30));
    ASSERT_TRUE(plan.ok()) << plan.status();
    plans[rc.world.rank] = *plan;
  }).ok());
  return plans;
}

TEST(StepSalvageTest, SurvivorsOfAWorldOfFiveFindTheLostSharesAndTheFirstStepper) {
  // Ranks 1-3 survived a world of 5 (old ranks 4, 0, 2); rank 0 is a joiner.
  const int old_rank[] = {-1, 4, 0, 2};
  const auto plans = Agree([&](int rank) {
    SalvageClaim c;
    c.contributes = rank > 0;
    c.in_step = rank > 0;
    c.generation = 7;
    c.world = 5;
    c.rank = old_rank[rank];
    return c;
  });
  for (const SalvagePlan& p : plans) {
    EXPECT_TRUE(p.salvage());
    EXPECT_EQ(p.contributors, 3);
    EXPECT_EQ(p.old_world, 5);
    EXPECT_EQ(p.lost, (std::vector<int>{1, 3}));
    EXPECT_EQ(p.steppers, 3);
    EXPECT_EQ(p.first_stepper, 1);
  }
}

TEST(StepSalvageTest, GradientsFromDifferentWorldsOrNoneAreNotSalvaged) {
  auto mixed = Agree([](int rank) {
    SalvageClaim c;
    c.contributes = c.in_step = true;
    c.generation = rank == 3 ? 8 : 7;  // one gradient from another world
    c.world = 4;
    c.rank = rank;
    return c;
  });
  for (const SalvagePlan& p : mixed) EXPECT_FALSE(p.salvage());
  auto none = Agree([](int rank) {
    SalvageClaim c;
    c.in_step = rank < 2;
    return c;
  });
  for (const SalvagePlan& p : none) {
    EXPECT_FALSE(p.salvage());
    EXPECT_EQ(p.steppers, 2);
  }
}

}  // namespace
}  // namespace muster
