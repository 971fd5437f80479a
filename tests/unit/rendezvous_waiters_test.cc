// RendezvousWaiters (coordinator/rendezvous_waiters.h): adding waiters, and
// taking the ones a completed world answers, the expired ones, a member's,
// and all of them; time is plain absl::Time values.
#include "coordinator/rendezvous_waiters.h"

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "coordinator/rendezvous.h"
#include "tests/unit/world_of_members.h"

namespace muster {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1'000'000);

// A call of member `id` (incarnation `incarnation`) waiting for a world
// after `after_generation`, with step `step`, due `seconds` after kT0.
RendezvousWaiter Waiter(const std::string& id, uint64_t incarnation, uint64_t after_generation,
                        int64_t step, int seconds) {
  return RendezvousWaiter{MemberKey{id, incarnation}, after_generation, step,
                          kT0 + absl::Seconds(seconds), RendezvousWaiter::Callback(), false};
}

// "id/step" of each waiter, in order.
std::vector<std::string> Names(const std::vector<RendezvousWaiter>& waiters) {
  std::vector<std::string> out;
  for (const RendezvousWaiter& w : waiters) out.push_back(absl::StrCat(w.member.id, "/", w.step));
  return out;
}

// "id/step@rank" of each waiter AnsweredBy returned, in order.
std::vector<std::string> Names(
    const std::vector<std::pair<const RendezvousWaiter*, uint32_t>>& waiters) {
  std::vector<std::string> out;
  for (const auto& [w, rank] : waiters) {
    out.push_back(absl::StrCat(w->member.id, "/", w->step, "@", rank));
  }
  return out;
}

TEST(RendezvousWaitersTest, StartsEmpty) {
  RendezvousWaiters w;
  EXPECT_EQ(w.size(), 0u);
  EXPECT_EQ(w.earliest_deadline(), absl::InfiniteFuture());
  EXPECT_TRUE(w.MemberIds().empty());
  EXPECT_TRUE(w.TakeExpired(kT0).empty());
  EXPECT_TRUE(w.TakeAll().empty());
}

TEST(RendezvousWaitersTest, AddLowersTheEarliestDeadline) {
  RendezvousWaiters w;
  w.Add(Waiter("m0", 1, 0, 1, 30));
  EXPECT_EQ(w.earliest_deadline(), kT0 + absl::Seconds(30));
  w.Add(Waiter("m1", 1, 0, 1, 10));
  w.Add(Waiter("m0", 1, 0, 2, 20));  // a second call of m0
  EXPECT_EQ(w.size(), 3u);
  EXPECT_EQ(w.earliest_deadline(), kT0 + absl::Seconds(10));
  EXPECT_THAT(w.MemberIds(), ::testing::UnorderedElementsAre("m0", "m1"));
}

TEST(RendezvousWaitersTest, AnswersOnlyTheWorldsIncarnationsWaitingForAnOlderGeneration) {
  const World world = MakeWorld(/*generation=*/2, /*n=*/2);
  EXPECT_TRUE(RendezvousWaiters::Answers(world, Waiter("m0", 1, 1, 0, 30)));
  EXPECT_TRUE(RendezvousWaiters::Answers(world, Waiter("m0", 1, 0, 0, 30)));
  EXPECT_FALSE(RendezvousWaiters::Answers(world, Waiter("m2", 1, 1, 0, 30)));  // not in it
  EXPECT_FALSE(RendezvousWaiters::Answers(world, Waiter("m0", 2, 1, 0, 30)));  // restarted
  EXPECT_FALSE(RendezvousWaiters::Answers(world, Waiter("m0", 1, 2, 0, 30)));  // after it
}

TEST(RendezvousWaitersTest, AWorldAnswersItsWaiters) {
  const World world = MakeWorld(/*generation=*/2, /*n=*/2);
  RendezvousWaiters w;
  w.Add(Waiter("m0", 1, 1, 5, 30));
  w.Add(Waiter("m2", 1, 1, 5, 30));  // not in the world
  w.Add(Waiter("m1", 2, 1, 5, 30));  // another incarnation
  w.Add(Waiter("m1", 1, 2, 5, 30));  // waits for a world after it
  w.Add(Waiter("m1", 1, 1, 7, 30));
  w.Add(Waiter("m0", 1, 1, 8, 30));  // m0's later call
  // Left in place, newest first: who arrives, with its latest step first.
  EXPECT_EQ(Names(w.AnsweredBy(world)),
            (std::vector<std::string>{"m0/8@0", "m1/7@1", "m0/5@0"}));
  EXPECT_EQ(w.size(), 6u);
  // Taken, oldest first; the others stay in their order.
  EXPECT_EQ(Names(w.TakeAnsweredBy(world)), (std::vector<std::string>{"m0/5", "m1/7", "m0/8"}));
  EXPECT_EQ(w.size(), 3u);
  EXPECT_TRUE(w.AnsweredBy(world).empty());
  EXPECT_EQ(Names(w.TakeAll()), (std::vector<std::string>{"m2/5", "m1/5", "m1/5"}));
}

TEST(RendezvousWaitersTest, ARankTheWaiterHoldsCountsOnlyWhereItsIdIs) {
  const World world = MakeWorld(/*generation=*/2, /*n=*/3);
  RendezvousWaiters w;
  RendezvousWaiter right = Waiter("m2", 1, 1, 5, 30);
  right.rank = 2;
  RendezvousWaiter wrong = Waiter("m1", 1, 1, 6, 30);
  wrong.rank = 0;  // m0's rank: looked up by id instead
  RendezvousWaiter outside = Waiter("m0", 1, 1, 7, 30);
  outside.rank = 9;  // no such rank
  RendezvousWaiter stranger = Waiter("x", 1, 1, 8, 30);
  stranger.rank = 1;  // m1's rank, and x is in no rank
  w.Add(std::move(right));
  w.Add(std::move(wrong));
  w.Add(std::move(outside));
  w.Add(std::move(stranger));
  EXPECT_EQ(Names(w.AnsweredBy(world)),
            (std::vector<std::string>{"m0/7@0", "m1/6@1", "m2/5@2"}));
  std::vector<RendezvousWaiter> taken = w.TakeAnsweredBy(world);
  ASSERT_EQ(taken.size(), 3u);
  EXPECT_EQ(taken[0].rank, 2);
  EXPECT_EQ(taken[1].rank, 1);
  EXPECT_EQ(taken[2].rank, 0);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(Names(w.TakeAll()), (std::vector<std::string>{"x/8"}));
}

TEST(RendezvousWaitersTest, ATakenWaiterCarriesItsCallback) {
  RendezvousWaiters w;
  std::optional<absl::StatusOr<RendezvousResult>> answer;
  RendezvousWaiter waiter = Waiter("m0", 1, 0, 0, 30);
  waiter.done = [&answer](absl::StatusOr<RendezvousResult> r) { answer = std::move(r); };
  w.Add(std::move(waiter));
  std::vector<RendezvousWaiter> taken = w.TakeAnsweredBy(MakeWorld(1, 1));
  ASSERT_EQ(taken.size(), 1u);
  EXPECT_FALSE(answer.has_value());  // taking answers nothing
  taken[0].done(RendezvousResult{std::make_shared<const World>(MakeWorld(1, 1)), 0, nullptr});
  ASSERT_TRUE(answer.has_value());
  ASSERT_TRUE(answer->ok());
  EXPECT_EQ((*answer)->world->generation, 1u);
}

TEST(RendezvousWaitersTest, TakeExpiredTakesTheDueOnesOldestFirst) {
  RendezvousWaiters w;
  w.Add(Waiter("m0", 1, 0, 0, 20));
  w.Add(Waiter("m1", 1, 0, 0, 30));
  w.Add(Waiter("m2", 1, 0, 0, 10));
  EXPECT_TRUE(w.TakeExpired(kT0 + absl::Seconds(9)).empty());
  EXPECT_EQ(w.size(), 3u);
  // A deadline at `now` is due.
  EXPECT_EQ(Names(w.TakeExpired(kT0 + absl::Seconds(20))),
            (std::vector<std::string>{"m0/0", "m2/0"}));
  EXPECT_EQ(w.size(), 1u);
  EXPECT_EQ(w.earliest_deadline(), kT0 + absl::Seconds(30));
  EXPECT_EQ(Names(w.TakeExpired(kT0 + absl::Seconds(30))), (std::vector<std::string>{"m1/0"}));
  EXPECT_EQ(w.earliest_deadline(), absl::InfiniteFuture());
}

TEST(RendezvousWaitersTest, TakeMemberTakesEveryCallOfThatId) {
  RendezvousWaiters w;
  w.Add(Waiter("m0", 1, 0, 1, 30));
  w.Add(Waiter("m1", 1, 0, 1, 30));
  w.Add(Waiter("m0", 2, 0, 2, 30));  // any incarnation
  EXPECT_EQ(Names(w.TakeMember("m0")), (std::vector<std::string>{"m0/1", "m0/2"}));
  EXPECT_THAT(w.MemberIds(), ::testing::UnorderedElementsAre("m1"));
  EXPECT_TRUE(w.TakeMember("m0").empty());
}

TEST(RendezvousWaitersTest, AnEarlyBoundIsCorrectedByTheNextScan) {
  RendezvousWaiters w;
  w.Add(Waiter("m0", 1, 0, 0, 10));
  w.Add(Waiter("m1", 1, 0, 0, 30));
  ASSERT_EQ(w.TakeMember("m0").size(), 1u);
  // Too early, never too late.
  EXPECT_EQ(w.earliest_deadline(), kT0 + absl::Seconds(10));
  EXPECT_TRUE(w.TakeExpired(kT0 + absl::Seconds(10)).empty());
  EXPECT_EQ(w.earliest_deadline(), kT0 + absl::Seconds(30));
  EXPECT_EQ(w.size(), 1u);
}

TEST(RendezvousWaitersTest, TakeAllEmptiesIt) {
  RendezvousWaiters w;
  w.Add(Waiter("m1", 1, 0, 0, 30));
  w.Add(Waiter("m0", 1, 0, 0, 10));
  EXPECT_EQ(Names(w.TakeAll()), (std::vector<std::string>{"m1/0", "m0/0"}));
  EXPECT_EQ(w.size(), 0u);
  EXPECT_EQ(w.earliest_deadline(), absl::InfiniteFuture());
  EXPECT_TRUE(w.TakeExpired(kT0 + absl::Hours(1)).empty());
}

}  // namespace
}  // namespace muster
