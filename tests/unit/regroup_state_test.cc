// RegroupState: one test per transition of the diagram in
// coordinator/regroup_state.h and one per refused transition; the completed
// world and its delta (offered only to members of its base); the waiters a
// completed world answers. Time is plain absl::Time values.
#include "coordinator/regroup_state.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "coordinator/rendezvous.h"
#include "tests/unit/world_of_members.h"

namespace muster {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1'000'000);

RendezvousRules Rules() {
  RendezvousRules rules;
  rules.min_members = 1;
  rules.max_members = 8;
  rules.last_call = absl::Milliseconds(500);
  return rules;
}

std::shared_ptr<const World> Shared(World world) {
  return std::make_shared<const World>(std::move(world));
}

// Generation 1: m0, m1 on node a, m2 on node b.
std::shared_ptr<const World> First() {
  return Shared(MakeWorld(1, {{"m0", "a", 0}, {"m1", "a", 1}, {"m2", "b", 0}}));
}

// Generation 2 from First(): m2 (and node b) gone, m3 appended on node c.
std::shared_ptr<const World> SecondAsDelta() {
  return Shared(MakeWorld(2, {{"m0", "a", 0}, {"m1", "a", 1}, {"m3", "c", 0}}));
}

// A Rendezvous call of `id` (incarnation 1) after generation
// `after_generation`; `answered` counts the calls of its callback.
RendezvousWaiter Waiter(const std::string& id, uint64_t after_generation, bool takes_delta,
                        int* answered = nullptr) {
  RendezvousWaiter w;
  w.member = MemberKey{id, 1};
  w.after_generation = after_generation;
  w.deadline = kT0 + absl::Seconds(600);
  w.takes_delta = takes_delta;
  w.done = [answered](absl::StatusOr<RendezvousResult>) {
    if (answered != nullptr) ++*answered;
  };
  return w;
}

void ExpectRefused(const absl::Status& s) {
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
}

// No arrival deadline runs: none is due, however late.
void ExpectNoArrivalDeadline(const RegroupState& r) {
  EXPECT_EQ(r.arrival_deadline(), absl::InfiniteFuture());
  EXPECT_FALSE(r.ArrivalDue(kT0 + absl::Hours(24)));
}

// The stages, reached the way the coordinator reaches them.
void ToForming(RegroupState* r) { r->Formed(kT0); }

void ToFormingByDeadline(RegroupState* r, absl::Duration window = absl::Seconds(30)) {
  ToForming(r);
  ASSERT_TRUE(r->ArriveWithin(window).ok());
}

void ToCompleted(RegroupState* r, std::shared_ptr<const World> world = First()) {
  ToForming(r);
  ASSERT_TRUE(r->Completed(std::move(world), kT0 + absl::Seconds(1)).ok());
}

void ToPaused(RegroupState* r) { r->Paused(kT0 + absl::Seconds(5)); }

TEST(RegroupStateTest, StartsIdle) {
  RegroupState r(Rules());
  EXPECT_EQ(r.stage(), RegroupStage::kIdle);
  EXPECT_EQ(r.formed_at(), absl::Time());
  EXPECT_EQ(r.paused_since(), absl::InfiniteFuture());
  ExpectNoArrivalDeadline(r);
  EXPECT_FALSE(r.last_call_ends().has_value());
  EXPECT_EQ(r.completed(), nullptr);
  EXPECT_EQ(r.delta_base(), nullptr);
  EXPECT_EQ(r.delta(), nullptr);
  EXPECT_EQ(r.waiters().size(), 0u);
}

// ---------------------------------------------------------------- Formed

TEST(RegroupStateTest, FormedStartsForming) {
  RegroupState r(Rules());
  r.Formed(kT0);
  EXPECT_EQ(r.stage(), RegroupStage::kForming);
  EXPECT_EQ(r.formed_at(), kT0);
  ExpectNoArrivalDeadline(r);
}

TEST(RegroupStateTest, FormedAgainDropsTheArrivalDeadline) {
  RegroupState r(Rules());
  ToFormingByDeadline(&r);
  r.Formed(kT0 + absl::Seconds(2));
  EXPECT_EQ(r.stage(), RegroupStage::kForming);
  EXPECT_EQ(r.formed_at(), kT0 + absl::Seconds(2));
  ExpectNoArrivalDeadline(r);
}

TEST(RegroupStateTest, FormedForgetsTheLastCall) {
  RegroupState r(Rules());
  EXPECT_EQ(r.Decide(/*candidates=*/2, /*preferred=*/2, /*changed=*/true, /*urgent=*/false, kT0,
                     /*first_world=*/false),
            FormDecision::kWait);
  ASSERT_EQ(r.last_call_ends(), kT0 + absl::Milliseconds(500));
  r.Formed(kT0 + absl::Milliseconds(500));
  EXPECT_FALSE(r.last_call_ends().has_value());
  // A later window opens afresh, not from the forgotten one's start.
  const absl::Time later = kT0 + absl::Seconds(10);
  EXPECT_EQ(r.Decide(2, 2, true, false, later, false), FormDecision::kWait);
  EXPECT_EQ(r.last_call_ends(), later + absl::Milliseconds(500));
}

TEST(RegroupStateTest, FormedEndsThePause) {
  RegroupState r(Rules());
  ToPaused(&r);
  r.Formed(kT0 + absl::Seconds(9));
  EXPECT_EQ(r.stage(), RegroupStage::kForming);
  EXPECT_EQ(r.paused_since(), absl::InfiniteFuture());
}

TEST(RegroupStateTest, FormedAfterCompletedKeepsTheCompletedWorld) {
  RegroupState r(Rules());
  const std::shared_ptr<const World> first = First();
  ToCompleted(&r, first);
  r.Formed(kT0 + absl::Seconds(3));
  EXPECT_EQ(r.stage(), RegroupStage::kForming);
  EXPECT_EQ(r.completed(), first);
}

// ---------------------------------------------------------------- ArriveWithin

TEST(RegroupStateTest, ArriveWithinCountsFromWhenTheWorldFormed) {
  RegroupState r(Rules());
  r.Formed(kT0);
  ASSERT_TRUE(r.ArriveWithin(absl::Seconds(30)).ok());
  EXPECT_EQ(r.stage(), RegroupStage::kFormingByDeadline);
  EXPECT_EQ(r.arrival_deadline(), kT0 + absl::Seconds(30));
  EXPECT_FALSE(r.ArrivalDue(kT0 + absl::Seconds(30) - absl::Milliseconds(1)));
  EXPECT_TRUE(r.ArrivalDue(kT0 + absl::Seconds(30)));
}

TEST(RegroupStateTest, ArriveWithinRefusedOutsideForming) {
  RegroupState idle(Rules());
  ExpectRefused(idle.ArriveWithin(absl::Seconds(30)));
  EXPECT_EQ(idle.stage(), RegroupStage::kIdle);
  ExpectNoArrivalDeadline(idle);

  RegroupState twice(Rules());
  ToFormingByDeadline(&twice, absl::Seconds(30));
  ExpectRefused(twice.ArriveWithin(absl::Seconds(5)));
  EXPECT_EQ(twice.arrival_deadline(), kT0 + absl::Seconds(30));

  RegroupState completed(Rules());
  ToCompleted(&completed);
  ExpectRefused(completed.ArriveWithin(absl::Seconds(30)));
  EXPECT_EQ(completed.stage(), RegroupStage::kCompleted);

  RegroupState paused(Rules());
  ToPaused(&paused);
  ExpectRefused(paused.ArriveWithin(absl::Seconds(30)));
  EXPECT_EQ(paused.stage(), RegroupStage::kPaused);
  ExpectNoArrivalDeadline(paused);
}

// ---------------------------------------------------------------- ArrivalMissed

TEST(RegroupStateTest, ArrivalMissedReturnsTheWindowAndGoesBackToForming) {
  RegroupState r(Rules());
  ToFormingByDeadline(&r, absl::Seconds(12));
  absl::StatusOr<absl::Duration> window = r.ArrivalMissed();
  ASSERT_TRUE(window.ok()) << window.status();
  EXPECT_EQ(*window, absl::Seconds(12));
  EXPECT_EQ(r.stage(), RegroupStage::kForming);
  ExpectNoArrivalDeadline(r);
  EXPECT_EQ(r.formed_at(), kT0);
}

TEST(RegroupStateTest, ArrivalMissedRefusedWithoutADeadline) {
  RegroupState forming(Rules());
  ToForming(&forming);
  ExpectRefused(forming.ArrivalMissed().status());
  EXPECT_EQ(forming.stage(), RegroupStage::kForming);

  RegroupState idle(Rules());
  ExpectRefused(idle.ArrivalMissed().status());
  RegroupState completed(Rules());
  ToCompleted(&completed);
  ExpectRefused(completed.ArrivalMissed().status());
  RegroupState paused(Rules());
  ToPaused(&paused);
  ExpectRefused(paused.ArrivalMissed().status());
  EXPECT_EQ(paused.stage(), RegroupStage::kPaused);
}

// ---------------------------------------------------------------- Completed

TEST(RegroupStateTest, CompletedStoresTheWorldAndSaysHowLongItTook) {
  RegroupState r(Rules());
  const std::shared_ptr<const World> first = First();
  r.Formed(kT0);
  absl::StatusOr<RegroupCompletion> done = r.Completed(first, kT0 + absl::Milliseconds(1500));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->took, absl::Milliseconds(1500));
  EXPECT_TRUE(done->answers.empty());
  EXPECT_EQ(r.stage(), RegroupStage::kCompleted);
  EXPECT_EQ(r.completed(), first);
  // The first world completed here: nothing to tell it as a change from.
  EXPECT_EQ(r.delta_base(), nullptr);
  EXPECT_EQ(r.delta(), nullptr);
}

TEST(RegroupStateTest, CompletedFromFormingByDeadlineDropsTheDeadline) {
  RegroupState r(Rules());
  ToFormingByDeadline(&r);
  ASSERT_TRUE(r.Completed(First(), kT0 + absl::Seconds(1)).ok());
  EXPECT_EQ(r.stage(), RegroupStage::kCompleted);
  ExpectNoArrivalDeadline(r);
}

TEST(RegroupStateTest, CompletedAnswersItsWaitersOldestFirstAndLeavesTheOthers) {
  RegroupState r(Rules());
  int m1_answered = 0;
  int m0_answered = 0;
  int m9_answered = 0;
  r.waiters().Add(Waiter("m1", 0, false, &m1_answered));
  r.waiters().Add(Waiter("m9", 0, false, &m9_answered));  // not in the world
  r.waiters().Add(Waiter("m0", 0, false, &m0_answered));
  r.waiters().Add(Waiter("m2", 1, false));  // waits for a world after generation 1
  const std::shared_ptr<const World> first = First();
  r.Formed(kT0);
  absl::StatusOr<RegroupCompletion> done = r.Completed(first, kT0 + absl::Seconds(1));
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->answers.size(), 2u);
  EXPECT_EQ(done->answers[0].second.rank, 1u);  // m1's call came first
  EXPECT_EQ(done->answers[1].second.rank, 0u);
  for (auto& [callback, result] : done->answers) {
    EXPECT_EQ(result.world, first);
    EXPECT_EQ(result.delta, nullptr);
    callback(result);
  }
  EXPECT_EQ(m1_answered, 1);
  EXPECT_EQ(m0_answered, 1);
  EXPECT_EQ(m9_answered, 0);
  EXPECT_EQ(r.waiters().size(), 2u);
  EXPECT_TRUE(r.waiters().MemberIds().contains("m9"));
  EXPECT_TRUE(r.waiters().MemberIds().contains("m2"));
}

TEST(RegroupStateTest, CompletedTellsTheWorldAsAChangeFromTheOneBefore) {
  RegroupState r(Rules());
  const std::shared_ptr<const World> first = First();
  ToCompleted(&r, first);
  r.Formed(kT0 + absl::Seconds(2));
  const std::shared_ptr<const World> second = SecondAsDelta();
  ASSERT_TRUE(r.Completed(second, kT0 + absl::Seconds(3)).ok());
  EXPECT_EQ(r.completed(), second);
  EXPECT_EQ(r.delta_base(), first);
  ASSERT_NE(r.delta(), nullptr);
  EXPECT_EQ(r.delta()->base_generation, 1u);
  EXPECT_EQ(r.delta()->removed_ranks, std::vector<uint32_t>{2});
  EXPECT_EQ(r.delta()->first_appended, 2u);
}

TEST(RegroupStateTest, CompletedWithoutADeltaKeepsTheBase) {
  RegroupState r(Rules());
  const std::shared_ptr<const World> first = First();
  ToCompleted(&r, first);
  r.Formed(kT0 + absl::Seconds(2));
  // m3 joins on node a, among the members that stay: not a delta.
  const std::shared_ptr<const World> second =
      Shared(MakeWorld(2, {{"m0", "a", 0}, {"m1", "a", 1}, {"m3", "a", 2}, {"m2", "b", 0}}));
  ASSERT_TRUE(r.Completed(second, kT0 + absl::Seconds(3)).ok());
  EXPECT_EQ(r.completed(), second);
  EXPECT_EQ(r.delta_base(), first);
  EXPECT_EQ(r.delta(), nullptr);
  EXPECT_EQ(r.ResultFor(MemberKey{"m0", 1}, second, 0, /*takes_delta=*/true).delta, nullptr);
}

TEST(RegroupStateTest, CompletedRefusedOutsideForming) {
  for (void (*to)(RegroupState*) : {+[](RegroupState*) {},
                                     +[](RegroupState* r) { ToCompleted(r); }, &ToPaused}) {
    RegroupState r(Rules());
    to(&r);
    const RegroupStage stage = r.stage();
    const std::shared_ptr<const World> completed = r.completed();
    r.waiters().Add(Waiter("m0", 0, false));
    ExpectRefused(r.Completed(SecondAsDelta(), kT0 + absl::Seconds(9)).status());
    EXPECT_EQ(r.stage(), stage);
    EXPECT_EQ(r.completed(), completed);
    EXPECT_EQ(r.waiters().size(), 1u);
  }
}

TEST(RegroupStateTest, CompletedRefusesANullWorld) {
  RegroupState r(Rules());
  ToForming(&r);
  r.waiters().Add(Waiter("m0", 0, false));
  EXPECT_EQ(r.Completed(nullptr, kT0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.stage(), RegroupStage::kForming);
  EXPECT_EQ(r.waiters().size(), 1u);
}

// ---------------------------------------------------------------- the delta

TEST(RegroupStateTest, TheDeltaGoesOnlyToMembersOfItsBaseThatTakeOne) {
  RegroupState r(Rules());
  ToCompleted(&r, First());
  int answered = 0;
  r.waiters().Add(Waiter("m0", 1, /*takes_delta=*/true, &answered));
  r.waiters().Add(Waiter("m1", 1, /*takes_delta=*/false, &answered));
  r.waiters().Add(Waiter("m3", 1, /*takes_delta=*/true, &answered));  // appended
  r.Formed(kT0 + absl::Seconds(2));
  absl::StatusOr<RegroupCompletion> done = r.Completed(SecondAsDelta(), kT0 + absl::Seconds(3));
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->answers.size(), 3u);
  EXPECT_EQ(done->answers[0].second.delta, r.delta());
  EXPECT_NE(done->answers[0].second.delta, nullptr);
  EXPECT_EQ(done->answers[1].second.delta, nullptr);  // takes none
  EXPECT_EQ(done->answers[2].second.delta, nullptr);  // not in the base
  EXPECT_EQ(done->answers[2].second.rank, 2u);
  for (auto& [callback, result] : done->answers) callback(result);
  EXPECT_EQ(answered, 3);
}

TEST(RegroupStateTest, ResultForGivesTheDeltaOnlyForTheBasesIncarnation) {
  RegroupState r(Rules());
  ToCompleted(&r, First());
  r.Formed(kT0 + absl::Seconds(2));
  const std::shared_ptr<const World> second = SecondAsDelta();
  ASSERT_TRUE(r.Completed(second, kT0 + absl::Seconds(3)).ok());
  EXPECT_EQ(r.ResultFor(MemberKey{"m1", 1}, second, 1, true).delta, r.delta());
  // Another process under m1's id held none of the base.
  EXPECT_EQ(r.ResultFor(MemberKey{"m1", 2}, second, 1, true).delta, nullptr);
  // A rank the delta maps to another member of the base.
  EXPECT_EQ(r.ResultFor(MemberKey{"m0", 1}, second, 1, true).delta, nullptr);
}

TEST(RegroupStateTest, ResultForAnotherWorldThanTheCompletedOneHasNoDelta) {
  RegroupState r(Rules());
  ToCompleted(&r, First());
  r.Formed(kT0 + absl::Seconds(2));
  const std::shared_ptr<const World> second = SecondAsDelta();
  ASSERT_TRUE(r.Completed(second, kT0 + absl::Seconds(3)).ok());
  const std::shared_ptr<const World> copy = Shared(*second);
  const RendezvousResult result = r.ResultFor(MemberKey{"m0", 1}, copy, 0, true);
  EXPECT_EQ(result.world, copy);
  EXPECT_EQ(result.rank, 0u);
  EXPECT_EQ(result.delta, nullptr);
}

// ---------------------------------------------------------------- Paused

TEST(RegroupStateTest, PausedRecordsWhenAndDropsTheArrivalDeadline) {
  RegroupState r(Rules());
  ToFormingByDeadline(&r);
  r.Paused(kT0 + absl::Seconds(4));
  EXPECT_EQ(r.stage(), RegroupStage::kPaused);
  EXPECT_EQ(r.paused_since(), kT0 + absl::Seconds(4));
  ExpectNoArrivalDeadline(r);
}

TEST(RegroupStateTest, PausedFromEveryStage) {
  for (void (*to)(RegroupState*) : {+[](RegroupState*) {},
                                     +[](RegroupState* r) { ToForming(r); },
                                     +[](RegroupState* r) { ToCompleted(r); }, &ToPaused}) {
    RegroupState r(Rules());
    to(&r);
    r.Paused(kT0 + absl::Seconds(7));
    EXPECT_EQ(r.stage(), RegroupStage::kPaused);
    EXPECT_EQ(r.paused_since(), kT0 + absl::Seconds(7));
  }
}

TEST(RegroupStateTest, APauseKeepsTheCompletedWorldAsTheNextBase) {
  RegroupState r(Rules());
  const std::shared_ptr<const World> first = First();
  ToCompleted(&r, first);
  ToPaused(&r);
  EXPECT_EQ(r.completed(), first);
  r.Formed(kT0 + absl::Seconds(8));
  ASSERT_TRUE(r.Completed(SecondAsDelta(), kT0 + absl::Seconds(9)).ok());
  EXPECT_EQ(r.delta_base(), first);
  EXPECT_NE(r.delta(), nullptr);
}

TEST(RegroupStateTest, StageNames) {
  EXPECT_STREQ(RegroupStageName(RegroupStage::kIdle), "idle");
  EXPECT_STREQ(RegroupStageName(RegroupStage::kForming), "forming");
  EXPECT_STREQ(RegroupStageName(RegroupStage::kFormingByDeadline), "forming_by_deadline");
  EXPECT_STREQ(RegroupStageName(RegroupStage::kCompleted), "completed");
  EXPECT_STREQ(RegroupStageName(RegroupStage::kPaused), "paused");
}

}  // namespace
}  // namespace muster
