// The lease on a state dir (coordinator/lease.h, StateStore's lease calls):
// two coordinators as two connections to one real SQLite file; time is
// what the test passes to Poll.
#include "coordinator/lease.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/fake_clock.h"
#include "coordinator/state_store.h"

namespace muster {
namespace {

class LeaseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = absl::StrCat(::testing::TempDir(), "/lease", ::getpid(), "_",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name(), ".db");
    ::unlink(path_.c_str());
    a_ = std::move(OpenSqliteStateStore(path_)).value();
    b_ = std::move(OpenSqliteStateStore(path_)).value();
  }
  void TearDown() override { ::unlink(path_.c_str()); }

  std::string path_;
  std::unique_ptr<StateStore> a_, b_;
  const absl::Time t0_ = absl::FromUnixSeconds(1000);
  const absl::Duration timeout_ = absl::Seconds(3);
};

TEST_F(LeaseTest, TheFirstCoordinatorTakesItAtOnceAndAStandbyWaitsWhileItBeats) {
  LeaseClaim primary(a_.get(), "node0:29400", timeout_);
  absl::StatusOr<std::optional<Lease>> held = primary.Poll(t0_);
  ASSERT_TRUE(held.ok()) << held.status();
  ASSERT_TRUE(held->has_value());
  EXPECT_EQ((*held)->epoch, 1u);

  LeaseClaim standby(b_.get(), "node1:29400", timeout_);
  for (int i = 0; i < 10; ++i) {
    // The holder beats every second; the standby never sees them stop.
    ASSERT_TRUE(a_->RenewLease(1).ok());
    absl::StatusOr<std::optional<Lease>> got = standby.Poll(t0_ + absl::Seconds(i));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_FALSE(got->has_value()) << "taken at " << i << " s";
  }
  EXPECT_EQ(standby.seen().holder, "node0:29400");
  EXPECT_EQ(b_->ReadLease()->epoch, 1u);
}

TEST_F(LeaseTest, BeatsThatStopLetTheStandbyTakeOverAndFenceTheOldHolder) {
  LeaseClaim primary(a_.get(), "node0:29400", timeout_);
  ASSERT_TRUE(primary.Poll(t0_).ok());
  ASSERT_TRUE(a_->SaveCheckpoint(CheckpointRecord{}).ok());  // writes while it holds it

  LeaseClaim standby(b_.get(), "node1:29400", timeout_);
  EXPECT_FALSE(standby.Poll(t0_)->has_value());
  EXPECT_FALSE(standby.Poll(t0_ + timeout_ - absl::Milliseconds(1))->has_value());
  absl::StatusOr<std::optional<Lease>> taken = standby.Poll(t0_ + timeout_);
  ASSERT_TRUE(taken.ok()) << taken.status();
  ASSERT_TRUE(taken->has_value());
  EXPECT_EQ((*taken)->epoch, 2u);
  EXPECT_EQ((*taken)->holder, "node1:29400");

  // The old holder wakes up: it can neither renew nor write anything.
  const absl::Status renew = a_->RenewLease(1);
  EXPECT_EQ(renew.code(), absl::StatusCode::kAborted) << renew;
  EXPECT_NE(renew.message().find("node1:29400"), std::string::npos) << renew;
  CheckpointRecord late;
  late.id = 7;
  late.step = 700;
  EXPECT_EQ(a_->SaveCheckpoint(late).code(), absl::StatusCode::kAborted);
  World world;
  world.generation = 99;
  EXPECT_EQ(a_->SaveWorld(world).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(a_->AppendEvents({JobEvent{t0_, "late", "from the old holder"}}).code(),
            absl::StatusCode::kAborted);
  // Nothing of it reached the state; the new holder writes.
  EXPECT_EQ(b_->LoadCheckpoints()->size(), 1u);
  EXPECT_EQ(b_->LoadWorld()->generation, 0u);
  EXPECT_TRUE(b_->SaveCheckpoint(late).ok());
  EXPECT_TRUE(b_->RenewLease(2).ok());
}

TEST_F(LeaseTest, AReleasedLeaseOrOnesOwnIsTakenAtOnce) {
  LeaseClaim first(a_.get(), "node0:29400", timeout_);
  ASSERT_TRUE(first.Poll(t0_)->has_value());
  ASSERT_TRUE(a_->ReleaseLease(1).ok());
  LeaseClaim next(b_.get(), "node1:29400", timeout_);
  absl::StatusOr<std::optional<Lease>> taken = next.Poll(t0_);
  ASSERT_TRUE(taken.ok() && taken->has_value());
  EXPECT_EQ((*taken)->epoch, 2u);
  // Releasing an epoch that moved on changes nothing.
  ASSERT_TRUE(a_->ReleaseLease(1).ok());
  EXPECT_EQ(b_->ReadLease()->holder, "node1:29400");

  // node1 restarted (same address): no wait, a new epoch.
  auto restarted = std::move(OpenSqliteStateStore(path_)).value();
  LeaseClaim again(restarted.get(), "node1:29400", timeout_);
  taken = again.Poll(t0_);
  ASSERT_TRUE(taken.ok() && taken->has_value());
  EXPECT_EQ((*taken)->epoch, 3u);
  EXPECT_EQ(b_->RenewLease(2).code(), absl::StatusCode::kAborted);
}

// The standby times the holder's silence on its monotonic clock (the
// server polls with Clock::Now()): a wall step forward does not cut the
// wait short.
TEST_F(LeaseTest, AWallStepForwardDoesNotLetTheStandbyTakeOverEarly) {
  FakeClock clock;
  LeaseClaim primary(a_.get(), "node0:29400", timeout_);
  ASSERT_TRUE(primary.Poll(clock.Now())->has_value());
  LeaseClaim standby(b_.get(), "node1:29400", timeout_);
  EXPECT_FALSE(standby.Poll(clock.Now())->has_value());
  clock.StepWall(absl::Hours(1));
  clock.Advance(timeout_ - absl::Milliseconds(1));
  EXPECT_FALSE(standby.Poll(clock.Now())->has_value()) << "taken over by the wall step";
  clock.Advance(absl::Milliseconds(1));
  EXPECT_TRUE(standby.Poll(clock.Now())->has_value());
}

// The holder's side: it beats every quarter of the timeout and stays sure
// of its lease while a beat succeeded within the timeout, by its monotonic
// clock; wall steps either way change neither.
TEST(LeaseRenewalTest, BeatsEveryQuarterAndAWallStepNeitherExpiresNorExtendsIt) {
  FakeClock clock;
  const absl::Duration timeout = absl::Seconds(4);
  LeaseRenewal lease(timeout, clock.Now());
  EXPECT_FALSE(lease.BeatDue(clock.Now()));
  clock.StepWall(absl::Hours(1));
  EXPECT_FALSE(lease.BeatDue(clock.Now())) << "a wall step made a beat due";
  EXPECT_TRUE(lease.Sure(clock.Now())) << "a wall step made the holder doubt its lease";
  clock.Advance(absl::Seconds(1));
  EXPECT_TRUE(lease.BeatDue(clock.Now()));
  EXPECT_FALSE(lease.BeatDue(clock.Now())) << "due twice";
  lease.Renewed(clock.Now());
  // The beats fail from now on; the wall clock steps back meanwhile.
  clock.StepWall(-absl::Hours(2));
  clock.Advance(timeout);
  EXPECT_TRUE(lease.Sure(clock.Now()));
  clock.Advance(absl::Milliseconds(1));
  EXPECT_FALSE(lease.Sure(clock.Now())) << "a wall step back kept an unrenewed lease";
  lease.Renewed(clock.Now());
  EXPECT_TRUE(lease.Sure(clock.Now()));
}

// A holder whose disk stalls inside a beat's sync for longer than the
// lease timeout (or a holder that hangs there, stopped) must not keep its
// standby out. The sync comes after SQLite's write lock is given back: the
// standby sees the beat, times its silence and takes over while the holder
// still waits on its disk. With the sync inside the commit, the standby
// could write nothing until the sync ended (a Slurm standby test that
// stopped the primary in its sync never saw a takeover).
TEST_F(LeaseTest, AHolderStalledInItsSyncDoesNotKeepTheStandbyOut) {
  LeaseClaim primary(a_.get(), "node0:29400", timeout_);
  ASSERT_TRUE(primary.Poll(t0_)->has_value());
  // The holder's own file, through a disk whose every sync takes 3 s.
  const absl::Duration stall = absl::Seconds(3);
  std::unique_ptr<StateStore> stalled = std::move(OpenSqliteStateStore(path_, stall)).value();
  std::atomic<bool> beat_returned{false};
  absl::Status beat;
  std::thread holder([&] {
    beat = stalled->RenewLease(1);
    beat_returned = true;
  });
  // Until the beat is in the log (a reader sees it), then its silence.
  LeaseClaim standby(b_.get(), "node1:29400", timeout_);
  for (int i = 0; i < 300 && b_->ReadLease()->beats == 0; ++i) {  // 1.5 s at most
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_FALSE(standby.Poll(t0_)->has_value());
  absl::StatusOr<std::optional<Lease>> taken = standby.Poll(t0_ + timeout_);
  const bool during_the_stall = !beat_returned;
  holder.join();
  ASSERT_TRUE(taken.ok()) << taken.status();
  ASSERT_TRUE(taken->has_value()) << "the standby did not take over";
  EXPECT_EQ((*taken)->epoch, 2u);
  EXPECT_TRUE(during_the_stall) << "taken over only once the holder's sync ended";
  // The holder's beat was committed before the takeover; its next one finds it.
  EXPECT_TRUE(beat.ok()) << beat;
  EXPECT_EQ(a_->RenewLease(1).code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(b_->RenewLease(2).ok());
}

// A primary and its standby start together on a new state dir: both open
// (and set up) the same new file at once, and both must get a store.
TEST(LeaseStartTest, TwoCoordinatorsOpeningANewStateFileAtOnceBothSucceed) {
  for (int round = 0; round < 20; ++round) {
    const std::string path =
        absl::StrCat(::testing::TempDir(), "/together", ::getpid(), "_", round, ".db");
    ::unlink(path.c_str());
    absl::StatusOr<std::unique_ptr<StateStore>> first, second;
    std::thread a([&] { first = OpenSqliteStateStore(path); });
    std::thread b([&] { second = OpenSqliteStateStore(path); });
    a.join();
    b.join();
    ASSERT_TRUE(first.ok()) << "round " << round << ": " << first.status();
    ASSERT_TRUE(second.ok()) << "round " << round << ": " << second.status();
    first->reset();
    second->reset();
    ::unlink(path.c_str());
  }
}

}  // namespace
}  // namespace muster
