// GenerationState: one test per transition of the diagram in
// coordinator/generation_state.h, and one per refused transition.
#include "coordinator/generation_state.h"

#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "coordinator/rendezvous.h"
#include "tests/unit/world_of_members.h"

namespace muster {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1'000'000);

// The phases, reached the way the coordinator reaches them; the world has
// the members "m0" and "m1".
void ToForming(GenerationState* g) {
  ASSERT_TRUE(g->Formed(MakeWorld(g->generation() + 1, 2)).ok());
}

void ToRunning(GenerationState* g) {
  ToForming(g);
  ASSERT_TRUE(g->Arrived("m0", 5).ok());
  ASSERT_TRUE(*g->Arrived("m1", 5));
}

void ToRecovering(GenerationState* g) {
  ASSERT_TRUE(g->Loaded(MakeWorld(7, 2), kT0 + absl::Seconds(30)).ok());
}

void ToFinished(GenerationState* g) {
  ToRunning(g);
  ASSERT_TRUE(g->Finished().ok());
}

void ToShuttingDown(GenerationState* g) { ASSERT_TRUE(g->ShuttingDown()); }

void ExpectRefused(const absl::Status& s) {
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
}

TEST(GenerationStateTest, StartsWithNoWorld) {
  GenerationState g;
  EXPECT_EQ(g.phase(), GenerationPhase::kNoWorld);
  EXPECT_EQ(g.job_state(), JobState::kWaiting);
  EXPECT_EQ(g.generation(), 0u);
  EXPECT_EQ(g.world().generation, 0u);
  EXPECT_FALSE(g.world_live());
  EXPECT_FALSE(g.complete());
}

// ---------------------------------------------------------------- Loaded

TEST(GenerationStateTest, LoadedStoredWorldRecovers) {
  GenerationState g;
  ToRecovering(&g);
  EXPECT_EQ(g.phase(), GenerationPhase::kRecovering);
  EXPECT_EQ(g.job_state(), JobState::kRecovering);
  EXPECT_EQ(g.generation(), 7u);
  EXPECT_EQ(g.world().size(), 2u);
  EXPECT_TRUE(g.world_live());
  EXPECT_TRUE(g.complete());
  EXPECT_FALSE(g.RecoveryExpired(kT0 + absl::Seconds(29)));
  EXPECT_TRUE(g.RecoveryExpired(kT0 + absl::Seconds(30)));
}

TEST(GenerationStateTest, LoadedWithoutMembersKeepsOnlyTheCounter) {
  GenerationState g;
  World counter;
  counter.generation = 12;
  ASSERT_TRUE(g.Loaded(counter, kT0).ok());
  EXPECT_EQ(g.phase(), GenerationPhase::kNoWorld);
  EXPECT_EQ(g.generation(), 12u);
  EXPECT_EQ(g.world().generation, 0u);
  EXPECT_FALSE(g.world_live());
  EXPECT_FALSE(g.RecoveryExpired(kT0 + absl::Hours(1)));
}

// A world stored as it paused is kept as the paused one: nobody trained
// in it, so a restart does not wait for its members, and its members come
// back as its incumbents; the next world follows its number.
TEST(GenerationStateTest, LoadedPausedWorldIsKeptWithoutRecovering) {
  World stored = MakeWorld(1, 2);
  stored.paused = true;
  GenerationState g;
  ASSERT_TRUE(g.Loaded(stored, kT0).ok());
  EXPECT_EQ(g.phase(), GenerationPhase::kNoWorld);
  EXPECT_EQ(g.job_state(), JobState::kWaiting);
  EXPECT_EQ(g.generation(), 1u);
  EXPECT_EQ(g.world().size(), 2u);
  EXPECT_FALSE(g.world_live());
  EXPECT_FALSE(g.RecoveryExpired(kT0 + absl::Hours(1)));
  EXPECT_TRUE(g.Formed(MakeWorld(2, 2)).ok());
}

TEST(GenerationStateTest, LoadedRefusedOnceAGenerationExists) {
  GenerationState g;
  ToRunning(&g);
  ExpectRefused(g.Loaded(MakeWorld(7, 2), kT0));
  EXPECT_EQ(g.phase(), GenerationPhase::kRunning);
  EXPECT_EQ(g.generation(), 1u);
}

// ---------------------------------------------------------------- Adopted

TEST(GenerationStateTest, AdoptedRaisesTheCounterWithoutAWorld) {
  GenerationState g;
  ASSERT_TRUE(g.Adopted(40).ok());
  EXPECT_EQ(g.phase(), GenerationPhase::kNoWorld);
  EXPECT_EQ(g.generation(), 40u);
  // The next world follows the adopted number.
  ASSERT_TRUE(g.Formed(MakeWorld(41, 2)).ok());
  EXPECT_EQ(g.generation(), 41u);
}

TEST(GenerationStateTest, AdoptedRefusedWithALiveWorld) {
  GenerationState g;
  ToRunning(&g);
  const absl::Status s = g.Adopted(9);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "after_generation 9 is newer than the current generation 1");
  EXPECT_EQ(g.generation(), 1u);
}

TEST(GenerationStateTest, AdoptedRefusedBeyondTheLargestGeneration) {
  GenerationState g;
  const absl::Status s = g.Adopted(GenerationState::kMaxAdoptedGeneration + 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "is beyond any generation")) << s;
  EXPECT_EQ(g.generation(), 0u);
  EXPECT_TRUE(g.Adopted(GenerationState::kMaxAdoptedGeneration).ok());
}

TEST(GenerationStateTest, AdoptedRefusedWhenNotNewer) {
  GenerationState g;
  ASSERT_TRUE(g.Adopted(5).ok());
  EXPECT_EQ(g.Adopted(5).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g.Adopted(3).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g.generation(), 5u);
}

TEST(GenerationStateTest, AdoptedRefusedWhenFinishedOrShuttingDown) {
  GenerationState finished;
  ToFinished(&finished);
  ExpectRefused(finished.Adopted(9));
  GenerationState down;
  ToShuttingDown(&down);
  ExpectRefused(down.Adopted(9));
  EXPECT_EQ(down.generation(), 0u);
}

// ---------------------------------------------------------------- Formed

TEST(GenerationStateTest, FormedFromNoWorld) {
  GenerationState g;
  ASSERT_TRUE(g.Formed(MakeWorld(1, 2)).ok());
  EXPECT_EQ(g.phase(), GenerationPhase::kForming);
  EXPECT_EQ(g.job_state(), JobState::kRunning);
  EXPECT_EQ(g.generation(), 1u);
  EXPECT_TRUE(g.world_live());
  EXPECT_FALSE(g.complete());
  ASSERT_TRUE(g.CheckGeneration(1).ok());
}

TEST(GenerationStateTest, FormedWhileFormingForgetsTheArrivals) {
  GenerationState g;
  ToForming(&g);
  ASSERT_FALSE(*g.Arrived("m0", 3));
  ASSERT_TRUE(g.Formed(MakeWorld(2, 2)).ok());
  EXPECT_EQ(g.phase(), GenerationPhase::kForming);
  EXPECT_EQ(g.generation(), 2u);
  EXPECT_FALSE(g.has_arrived("m0"));
}

TEST(GenerationStateTest, FormedWhileRunningIsARegroup) {
  GenerationState g;
  ToRunning(&g);
  ASSERT_TRUE(g.Formed(MakeWorld(2, 3)).ok());
  EXPECT_EQ(g.phase(), GenerationPhase::kForming);
  EXPECT_EQ(g.world().size(), 3u);
  EXPECT_EQ(g.CheckGeneration(1).code(), absl::StatusCode::kAborted);
}

TEST(GenerationStateTest, FormedRefusedWhileRecovering) {
  GenerationState g;
  ToRecovering(&g);
  ExpectRefused(g.Formed(MakeWorld(8, 2)));
  EXPECT_EQ(g.phase(), GenerationPhase::kRecovering);
  EXPECT_EQ(g.generation(), 7u);
}

TEST(GenerationStateTest, FormedRefusedWhenFinishedOrShuttingDown) {
  GenerationState finished;
  ToFinished(&finished);
  ExpectRefused(finished.Formed(MakeWorld(2, 2)));
  EXPECT_EQ(finished.phase(), GenerationPhase::kFinished);
  GenerationState down;
  ToShuttingDown(&down);
  ExpectRefused(down.Formed(MakeWorld(1, 2)));
  EXPECT_EQ(down.generation(), 0u);
}

TEST(GenerationStateTest, FormedRefusedForAWorldThatDoesNotFollow) {
  GenerationState g;
  EXPECT_EQ(g.Formed(MakeWorld(2, 2)).code(), absl::StatusCode::kInvalidArgument);
  World empty;
  empty.generation = 1;
  EXPECT_EQ(g.Formed(empty).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g.phase(), GenerationPhase::kNoWorld);
  EXPECT_EQ(g.generation(), 0u);
}

// ---------------------------------------------------------------- Arrived

TEST(GenerationStateTest, ArrivedNotTheLastKeepsForming) {
  GenerationState g;
  ToForming(&g);
  absl::StatusOr<bool> complete = g.Arrived("m1", 4);
  ASSERT_TRUE(complete.ok()) << complete.status();
  EXPECT_FALSE(*complete);
  EXPECT_EQ(g.phase(), GenerationPhase::kForming);
  EXPECT_TRUE(g.has_arrived("m1"));
  EXPECT_FALSE(g.has_arrived("m0"));
  // A second call of the same member is not a second member.
  EXPECT_FALSE(*g.Arrived("m1", 6));
}

TEST(GenerationStateTest, ArrivedTheLastCompletesTheWorld) {
  GenerationState g;
  ASSERT_TRUE(g.Formed(MakeWorld(1, 3)).ok());
  const std::shared_ptr<const World> before = g.Published();
  ASSERT_FALSE(*g.Arrived("m0", 3));
  ASSERT_FALSE(*g.Arrived("m1", 4));
  ASSERT_FALSE(*g.Arrived("m1", 9));  // the later call's step counts
  absl::StatusOr<bool> complete = g.Arrived("m2", 7);
  ASSERT_TRUE(complete.ok()) << complete.status();
  EXPECT_TRUE(*complete);
  EXPECT_EQ(g.phase(), GenerationPhase::kRunning);
  EXPECT_EQ(g.job_state(), JobState::kRunning);
  EXPECT_TRUE(g.complete());
  EXPECT_EQ(g.world().members[0].step, 3);
  EXPECT_EQ(g.world().members[1].step, 9);
  EXPECT_EQ(g.world().members[2].step, 7);
  EXPECT_EQ(g.world().state_source_rank, 1u);
  EXPECT_EQ(g.world().state_step, 9);
  // The published copy is the completed world, not the one before.
  EXPECT_EQ(g.Published()->state_step, 9);
  EXPECT_EQ(before->state_step, 0);
}

TEST(GenerationStateTest, ArrivedRefusedOutsideForming) {
  GenerationState none;
  ExpectRefused(none.Arrived("m0", 1).status());
  GenerationState running;
  ToRunning(&running);
  ExpectRefused(running.Arrived("m0", 1).status());
  EXPECT_EQ(running.world().members[0].step, 5);
  GenerationState recovering;
  ToRecovering(&recovering);
  ExpectRefused(recovering.Arrived("m0", 1).status());
}

TEST(GenerationStateTest, ArrivedRefusedForAStranger) {
  GenerationState g;
  ToForming(&g);
  EXPECT_EQ(g.Arrived("x", 1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(g.has_arrived("x"));
  ASSERT_FALSE(*g.Arrived("m0", 1));
  EXPECT_TRUE(*g.Arrived("m1", 1));  // the stranger did not count
}

// ---------------------------------------------------------------- Paused

TEST(GenerationStateTest, PausedFromRunningKeepsTheWorldReadable) {
  GenerationState g;
  ToRunning(&g);
  ASSERT_TRUE(g.Paused().ok());
  EXPECT_EQ(g.phase(), GenerationPhase::kNoWorld);
  EXPECT_EQ(g.job_state(), JobState::kWaiting);
  EXPECT_FALSE(g.world_live());
  EXPECT_EQ(g.world().generation, 1u);
  EXPECT_EQ(g.world().size(), 2u);
  const absl::Status s = g.CheckGeneration(1);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(s.message(), "generation 1 is over; the current generation is 1 (paused)");
}

TEST(GenerationStateTest, PausedFromFormingForgetsTheArrivals) {
  GenerationState g;
  ToForming(&g);
  ASSERT_FALSE(*g.Arrived("m0", 2));
  ASSERT_TRUE(g.Paused().ok());
  EXPECT_EQ(g.phase(), GenerationPhase::kNoWorld);
  EXPECT_FALSE(g.has_arrived("m0"));
}

TEST(GenerationStateTest, PausedRefusedWithoutALiveWorld) {
  GenerationState none;
  ExpectRefused(none.Paused());
  GenerationState recovering;
  ToRecovering(&recovering);
  ExpectRefused(recovering.Paused());
  EXPECT_EQ(recovering.phase(), GenerationPhase::kRecovering);
  GenerationState finished;
  ToFinished(&finished);
  ExpectRefused(finished.Paused());
  EXPECT_EQ(finished.phase(), GenerationPhase::kFinished);
}

// ---------------------------------------------------------------- Stopped

TEST(GenerationStateTest, StoppedFromEveryPhaseWithAWorldForgetsIt) {
  for (void (*to)(GenerationState*) : {&ToForming, &ToRunning, &ToRecovering}) {
    GenerationState g;
    to(&g);
    const uint64_t generation = g.generation();
    ASSERT_TRUE(g.Stopped().ok());
    EXPECT_EQ(g.phase(), GenerationPhase::kNoWorld);
    EXPECT_FALSE(g.world_live());
    EXPECT_EQ(g.generation(), generation);
    EXPECT_EQ(g.world().generation, generation);
    EXPECT_TRUE(g.world().members.empty());
    EXPECT_EQ(g.Published()->size(), 0u);
    // The next world follows the stopped one's number.
    EXPECT_TRUE(g.Formed(MakeWorld(generation + 1, 2)).ok());
  }
}

TEST(GenerationStateTest, StoppedRefusedWithoutALiveWorld) {
  GenerationState none;
  ExpectRefused(none.Stopped());
  GenerationState paused;
  ToRunning(&paused);
  ASSERT_TRUE(paused.Paused().ok());
  ExpectRefused(paused.Stopped());
  EXPECT_EQ(paused.world().size(), 2u) << "a refused transition changes nothing";
  GenerationState finished;
  ToFinished(&finished);
  ExpectRefused(finished.Stopped());
  EXPECT_EQ(finished.phase(), GenerationPhase::kFinished);
  GenerationState down;
  ToShuttingDown(&down);
  ExpectRefused(down.Stopped());
}

// ---------------------------------------------------------------- Recovered

TEST(GenerationStateTest, RecoveredRunsTheStoredWorld) {
  GenerationState g;
  ToRecovering(&g);
  ASSERT_TRUE(g.Recovered().ok());
  EXPECT_EQ(g.phase(), GenerationPhase::kRunning);
  EXPECT_EQ(g.job_state(), JobState::kRunning);
  EXPECT_EQ(g.generation(), 7u);
  EXPECT_TRUE(g.complete());
  EXPECT_FALSE(g.RecoveryExpired(kT0 + absl::Hours(1)));
  // A regroup may follow.
  EXPECT_TRUE(g.Formed(MakeWorld(8, 2)).ok());
}

TEST(GenerationStateTest, RecoveredRefusedOutsideRecovering) {
  GenerationState none;
  ExpectRefused(none.Recovered());
  GenerationState forming;
  ToForming(&forming);
  ExpectRefused(forming.Recovered());
  EXPECT_EQ(forming.phase(), GenerationPhase::kForming);
}

// ---------------------------------------------------------------- Finished

TEST(GenerationStateTest, FinishedFromEveryPhaseWithAWorld) {
  GenerationState forming;
  ToForming(&forming);
  GenerationState running;
  ToRunning(&running);
  GenerationState recovering;
  ToRecovering(&recovering);
  for (GenerationState* g : {&forming, &running, &recovering}) {
    ASSERT_TRUE(g->Finished().ok());
    EXPECT_EQ(g->phase(), GenerationPhase::kFinished);
    EXPECT_EQ(g->job_state(), JobState::kFinished);
    EXPECT_TRUE(g->world_live());
    EXPECT_TRUE(g->CheckGeneration(g->generation()).ok());
  }
}

TEST(GenerationStateTest, FinishedAgainStaysFinished) {
  GenerationState g;
  ToFinished(&g);
  ASSERT_TRUE(g.Finished().ok());
  EXPECT_EQ(g.phase(), GenerationPhase::kFinished);
}

TEST(GenerationStateTest, FinishedRefusedWithoutAWorldOrShuttingDown) {
  GenerationState none;
  ExpectRefused(none.Finished());
  GenerationState paused;
  ToRunning(&paused);
  ASSERT_TRUE(paused.Paused().ok());
  ExpectRefused(paused.Finished());
  GenerationState down;
  ToRunning(&down);
  ToShuttingDown(&down);
  ExpectRefused(down.Finished());
  EXPECT_EQ(down.phase(), GenerationPhase::kShuttingDown);
}

// ---------------------------------------------------------------- ShuttingDown

TEST(GenerationStateTest, ShuttingDownFromEveryPhase) {
  GenerationState none;
  GenerationState forming;
  ToForming(&forming);
  GenerationState running;
  ToRunning(&running);
  GenerationState recovering;
  ToRecovering(&recovering);
  GenerationState finished;
  ToFinished(&finished);
  for (GenerationState* g : {&none, &forming, &running, &recovering, &finished}) {
    const bool live = g->world_live();
    EXPECT_TRUE(g->ShuttingDown());
    EXPECT_EQ(g->phase(), GenerationPhase::kShuttingDown);
    EXPECT_EQ(g->job_state(), JobState::kShuttingDown);
    // The world members trained in stays as it was.
    EXPECT_EQ(g->world_live(), live);
    EXPECT_FALSE(g->complete());
    EXPECT_FALSE(g->RecoveryExpired(kT0 + absl::Hours(1)));
  }
}

TEST(GenerationStateTest, ShuttingDownTwiceIsRefused) {
  GenerationState g;
  ToRunning(&g);
  ASSERT_TRUE(g.ShuttingDown());
  EXPECT_FALSE(g.ShuttingDown());
  EXPECT_EQ(g.phase(), GenerationPhase::kShuttingDown);
  EXPECT_TRUE(g.world_live());
}

// ---------------------------------------------------------------- queries

TEST(GenerationStateTest, CheckGenerationSaysWhoRetries) {
  GenerationState g;
  ToRunning(&g);
  ASSERT_TRUE(g.Formed(MakeWorld(2, 2)).ok());
  EXPECT_TRUE(g.CheckGeneration(2).ok());
  const absl::Status old = g.CheckGeneration(1);
  EXPECT_EQ(old.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(old.message(), "generation 1 is over; the current generation is 2");
  const absl::Status future = g.CheckGeneration(3);
  EXPECT_EQ(future.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(future.message(), "generation 3 does not exist; the current one is 2");
}

TEST(GenerationStateTest, PublishedIsMadeOncePerWorld) {
  GenerationState g;
  ToForming(&g);
  const std::shared_ptr<const World> first = g.Published();
  EXPECT_EQ(g.Published(), first);
  ASSERT_TRUE(g.Paused().ok());
  EXPECT_EQ(g.Published(), first);  // pausing does not change the world
  ASSERT_TRUE(g.Formed(MakeWorld(2, 2)).ok());
  EXPECT_NE(g.Published(), first);
  EXPECT_EQ(g.Published()->generation, 2u);
}

TEST(GenerationStateTest, Names) {
  EXPECT_STREQ(JobStateName(JobState::kWaiting), "waiting");
  EXPECT_STREQ(JobStateName(JobState::kRunning), "running");
  EXPECT_STREQ(JobStateName(JobState::kRecovering), "recovering");
  EXPECT_STREQ(JobStateName(JobState::kFinished), "finished");
  EXPECT_STREQ(JobStateName(JobState::kShuttingDown), "shutting_down");
  EXPECT_STREQ(GenerationPhaseName(GenerationPhase::kNoWorld), "no_world");
  EXPECT_STREQ(GenerationPhaseName(GenerationPhase::kForming), "forming");
}

}  // namespace
}  // namespace muster
