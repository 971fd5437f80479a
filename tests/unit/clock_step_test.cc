// Two clocks (common/clock.h): durations and deadlines run on the monotonic
// Now(), which a wall clock step (NTP, a VM resume) does not move; records
// take WallNow(). The coordinator's heartbeat expiry is driven through a
// FakeClock whose wall reading steps while its monotonic one does not.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/fake_clock.h"
#include "coordinator/coordinator.h"

namespace muster {
namespace {

TEST(FakeClockTest, StepWallMovesOnlyTheWallReading) {
  FakeClock clock;
  const absl::Time start = clock.Now();
  EXPECT_EQ(clock.WallNow(), start);
  clock.StepWall(-absl::Seconds(60));
  EXPECT_EQ(clock.Now(), start);
  EXPECT_EQ(clock.WallNow(), start - absl::Seconds(60));
  clock.Advance(absl::Seconds(2));
  EXPECT_EQ(clock.Now(), start + absl::Seconds(2));
  EXPECT_EQ(clock.WallNow(), start - absl::Seconds(58));
}

TEST(RealClockTest, NowNeverGoesBackAndStartsNearTheWallClock) {
  RealClock* clock = RealClock::Get();
  absl::Time last = clock->Now();
  // Anchored to the wall clock once: plausible, though not a date.
  EXPECT_LT(absl::AbsDuration(last - absl::Now()), absl::Hours(1));
  for (int i = 0; i < 1000; ++i) {
    const absl::Time now = clock->Now();
    ASSERT_GE(now, last);
    last = now;
  }
}

TEST(RemainingTest, IsNeverNegativeAndInfiniteForNoDeadline) {
  FakeClock clock;
  EXPECT_EQ(Remaining(clock.Now() + absl::Seconds(3), &clock), absl::Seconds(3));
  EXPECT_EQ(Remaining(clock.Now() - absl::Seconds(3), &clock), absl::ZeroDuration());
  EXPECT_EQ(Remaining(absl::InfiniteFuture(), &clock), absl::InfiniteDuration());
  // A wall step changes nothing of what is left.
  const absl::Time deadline = clock.Now() + absl::Seconds(3);
  clock.StepWall(absl::Hours(1));
  EXPECT_EQ(Remaining(deadline, &clock), absl::Seconds(3));
}

TEST(SystemDeadlineTest, IsTheSystemClockPlusWhatIsLeft) {
  FakeClock clock;
  clock.StepWall(-absl::Hours(5));  // the fake wall reading plays no part
  const auto before = std::chrono::system_clock::now();
  const auto deadline = SystemDeadline(clock.Now() + absl::Seconds(10), &clock);
  const auto after = std::chrono::system_clock::now();
  EXPECT_GE(deadline, before + std::chrono::seconds(10));
  EXPECT_LE(deadline, after + std::chrono::seconds(10));
  const auto past = SystemDeadline(clock.Now() - absl::Seconds(10), &clock);
  EXPECT_LE(past, std::chrono::system_clock::now());
  EXPECT_EQ(SystemDeadline(absl::InfiniteFuture(), &clock),
            std::chrono::system_clock::time_point::max());
}

// Members a and b (heartbeat timeout 5 s) in generation 1 of a coordinator
// on `clock_`.
class CoordinatorClockStepTest : public ::testing::Test {
 protected:
  struct Sink : SessionSink {
    void Push(const MemberEvent& e) override { events.push_back(e); }
    void Close(const absl::Status&) override { closed = true; }
    std::vector<MemberEvent> events;
    bool closed = false;
  };
  struct Member {
    MemberKey key;
    std::shared_ptr<Sink> sink = std::make_shared<Sink>();
    uint64_t session = 0;
  };

  void SetUp() override {
    store_ = std::move(OpenSqliteStateStore(":memory:")).value();
    CoordinatorOptions o;
    o.rules.min_members = 1;
    o.rules.max_members = 2;
    o.rules.last_call = absl::Seconds(100);
    o.heartbeat_interval = absl::Seconds(1);
    o.heartbeat_timeout = absl::Seconds(5);
    o.clock = &clock_;
    c_ = std::move(Coordinator::Create(o, store_.get())).value();
    for (Member* m : {&a_, &b_}) {
      m->key = {m == &a_ ? "a" : "b", 1};
      JoinSpec spec;
      spec.key = m->key;
      spec.node = "n";
      ASSERT_TRUE(c_->Join(spec).ok());
      m->session = *c_->OpenSession(m->key, m->sink);
    }
    std::optional<absl::StatusOr<RendezvousResult>> world;
    for (Member* m : {&a_, &b_}) {
      c_->Rendezvous(m->key, 0, 0, absl::Seconds(30), [&](auto r) { world = r; });
    }
    ASSERT_TRUE(world && world->ok());
  }

  // One second passes; `who` heartbeat, then the coordinator ticks.
  void Second(const std::vector<Member*>& who) {
    clock_.Advance(absl::Seconds(1));
    for (Member* m : who) ASSERT_TRUE(c_->Heartbeat(m->session, {1}).ok());
    c_->Tick();
  }

  FakeClock clock_;
  std::unique_ptr<StateStore> store_;
  std::unique_ptr<Coordinator> c_;
  Member a_, b_;
};

TEST_F(CoordinatorClockStepTest, ASilentMemberExpiresOnTimeThoughTheWallClockSteppedBack) {
  Second({&a_});
  Second({&a_});
  clock_.StepWall(-absl::Seconds(60));  // NTP sets the wall clock back
  Second({&a_});
  Second({&a_});
  EXPECT_FALSE(b_.sink->closed) << "b expired after 4 s of silence";
  clock_.Advance(absl::Milliseconds(1500));  // b silent for 5.5 s
  c_->Tick();
  EXPECT_TRUE(b_.sink->closed) << "the wall step hid b's silence";
  ASSERT_EQ(a_.sink->events.size(), 1u);
  EXPECT_EQ(c_->GetStatus().world_size, 1u);
}

TEST_F(CoordinatorClockStepTest, AWallStepForwardExpiresNoHealthyMember) {
  Second({&a_, &b_});
  clock_.StepWall(absl::Seconds(60));  // a VM resumes, or NTP jumps ahead
  c_->Tick();
  for (int i = 0; i < 10; ++i) Second({&a_, &b_});
  EXPECT_FALSE(a_.sink->closed);
  EXPECT_FALSE(b_.sink->closed);
  EXPECT_TRUE(a_.sink->events.empty()) << a_.sink->events[0].reason;
  const StatusSnapshot s = c_->GetStatus();
  EXPECT_EQ(s.generation, 1u);
  for (const MemberRow& row : s.members) {
    EXPECT_EQ(s.now - row.info.last_seen, absl::ZeroDuration()) << row.info.key.id;
  }
}

// Records take the wall clock: after a step of an hour their times move by
// the hour, while ages and the heartbeat expiry do not.
TEST_F(CoordinatorClockStepTest, RecordsTakeTheWallClockAndExpiryDoesNot) {
  clock_.StepWall(absl::Hours(1));
  const absl::Time wall = clock_.WallNow();
  ASSERT_EQ(wall, clock_.Now() + absl::Hours(1));
  const StatusSnapshot s = c_->GetStatus();
  EXPECT_EQ(s.wall_now, wall);
  EXPECT_EQ(s.now, clock_.Now());

  const uint64_t id = *c_->BeginCheckpoint(1, a_.key, 10);
  EXPECT_EQ(*c_->BeginCheckpoint(1, b_.key, 10), id);
  EXPECT_FALSE(*c_->ReportShard(id, a_.key, {}));
  EXPECT_TRUE(*c_->ReportShard(id, b_.key, {}));
  const std::vector<CheckpointRecord> committed = c_->ListCheckpoints(/*all=*/false);
  ASSERT_EQ(committed.size(), 1u);
  EXPECT_EQ(committed[0].created, wall);
  EXPECT_EQ(committed[0].committed, wall);

  absl::StatusOr<std::vector<JobEvent>> events = c_->RecentEvents(100);
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_FALSE(events->empty());
  EXPECT_EQ(events->front().kind, "start");
  EXPECT_EQ(absl::ToUnixMillis(events->front().time), absl::ToUnixMillis(s.now))
      << "recorded before the step";
  EXPECT_EQ(events->back().kind, "checkpoint");
  EXPECT_EQ(absl::ToUnixMillis(events->back().time), absl::ToUnixMillis(wall));

  // b stays silent: it expires 5 s after its last sign of life by the
  // monotonic clock, the hour of the wall step notwithstanding.
  Second({&a_});
  Second({&a_});
  Second({&a_});
  Second({&a_});
  EXPECT_FALSE(b_.sink->closed);
  clock_.Advance(absl::Milliseconds(1500));
  c_->Tick();
  EXPECT_TRUE(b_.sink->closed);
}

}  // namespace
}  // namespace muster
