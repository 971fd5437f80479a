// Coordinator state machine driven by a FakeClock: rendezvous rules,
// failures, joins, drains, KV and catalog across generations, restart.
#include "coordinator/coordinator.h"

#include <unistd.h>

#include <thread>
#include <utility>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

#include "common/fake_clock.h"
#include "coordinator/lease.h"

namespace muster {
namespace {

// Records what a member's session was sent. Thread-safe enough for tests
// that call the coordinator from one thread.
class RecordingSink : public SessionSink {
 public:
  void Push(const MemberEvent& e) override { events.push_back(e); }
  void Close(const absl::Status& s) override {
    closed = true;
    close_status = s;
  }
  void CloseHung(const absl::Status& s) override {
    Close(s);
    hung = true;
  }
  std::vector<MemberEvent> events;
  bool closed = false;
  bool hung = false;  // closed as hung: the agent ends the process
  absl::Status close_status;
};

struct Member {
  MemberKey key;
  std::shared_ptr<RecordingSink> sink = std::make_shared<RecordingSink>();
  uint64_t session = 0;
  std::optional<absl::StatusOr<RendezvousResult>> world;
};

class CoordinatorTest : public ::testing::Test {
 protected:
  void Start(uint32_t min, uint32_t max, absl::Duration last_call = absl::Seconds(1),
             StateStore* store = nullptr) {
    // A coordinator of an earlier Start writes to its store from its own
    // thread until it is destroyed: destroy it before the store it uses.
    c_.reset();
    if (store == nullptr) {
      store_ = std::move(OpenSqliteStateStore(":memory:")).value();
      store = store_.get();
    }
    CoordinatorOptions o;
    o.rules.min_members = min;
    o.rules.max_members = max;
    o.rules.last_call = last_call;
    o.rules.join_timeout = absl::Seconds(60);
    o.heartbeat_interval = absl::Seconds(1);
    o.heartbeat_timeout = absl::Seconds(5);
    o.reattach_grace = absl::Seconds(10);
    o.silence_hold = silence_hold_;
    o.pause_timeout = pause_timeout_;
    o.own_work_limit = own_work_limit_;
    o.clock = &clock_;
    c_ = std::move(Coordinator::Create(o, store)).value();
  }

  // Starts a 2..2 coordinator on a fresh SQLite file whose fsyncs take
  // `sync_delay` (its schema is created at full speed); returns the path.
  std::string StartOnSlowDisk(const std::string& name, absl::Duration sync_delay) {
    const std::string path = absl::StrCat(::testing::TempDir(), "/", name, ::getpid(), ".db");
    std::remove(path.c_str());
    OpenSqliteStateStore(path).value();
    stores_.push_back(std::move(OpenSqliteStateStore(path, sync_delay)).value());
    Start(2, 2, absl::Seconds(1), stores_.back().get());
    return path;
  }

  Member& Add(const std::string& id, const std::string& node, uint64_t inc = 1,
              bool spare = false) {
    auto m = std::make_unique<Member>();
    m->key = {id, inc};
    JoinSpec spec;
    spec.key = m->key;
    spec.node = node;
    spec.spare = spare;
    EXPECT_TRUE(c_->Join(spec).ok());
    m->session = *c_->OpenSession(m->key, m->sink);
    members_.push_back(std::move(m));
    return *members_.back();
  }

  void Rendezvous(Member& m, uint64_t after, int64_t step = 0,
                  absl::Duration timeout = absl::Seconds(30)) {
    m.world.reset();
    c_->Rendezvous(m.key, after, step, timeout,
                   [&m](absl::StatusOr<RendezvousResult> r) { m.world = r; });
  }

  // A new state file named after `tag`, kept until the test ends.
  StateStore* NewStateFile(const std::string& tag) {
    const std::string path = ::testing::TempDir() + "/" + tag + std::to_string(getpid()) + ".db";
    ::unlink(path.c_str());
    stores_.push_back(std::move(OpenSqliteStateStore(path)).value());
    return stores_.back().get();
  }

  // Members a (node n) and b (node m) form generation 1 of a job of two on
  // `store`.
  std::pair<Member*, Member*> WorldOfTwo(StateStore* store) {
    Start(2, 2, absl::Seconds(1), store);
    Member& a = Add("a", "n");
    Member& b = Add("b", "m");
    Rendezvous(a, 0);
    Rendezvous(b, 0);
    EXPECT_TRUE(a.world.has_value() && a.world->ok());
    EXPECT_EQ(c_->GetStatus().generation, 1u);
    return {&a, &b};
  }

  // Members a and b (node n) form generation 1 of a job of two to three.
  std::pair<Member*, Member*> WorldOfTwoOfThree() {
    Start(2, 3, absl::Seconds(1));
    Member& a = Add("a", "n");
    Member& b = Add("b", "n");
    Rendezvous(a, 0);
    Rendezvous(b, 0);
    Advance(absl::Milliseconds(1100));
    EXPECT_TRUE(a.world.has_value() && a.world->ok());
    EXPECT_EQ(c_->GetStatus().generation, 1u);
    return {&a, &b};
  }

  // Members a (node n) and b (node `b_node`) form generation 1 at step 5 on
  // a new state file named after `tag`; then the coordinator restarts on it
  // (recovering, nobody back yet).
  void RestartWithAStoredWorld(const std::string& tag, const std::string& b_node) {
    StateStore* store = NewStateFile(tag);
    Start(1, 2, absl::Seconds(100), store);
    Member& a = Add("a", "n");
    Member& b = Add("b", b_node);
    Rendezvous(a, 0, 5);
    Rendezvous(b, 0, 5);
    c_.reset();
    Start(1, 2, absl::Seconds(100), store);
    ASSERT_EQ(c_->GetStatus().job_state, JobState::kRecovering);
  }

  void Advance(absl::Duration d) {
    clock_.Advance(d);
    c_->Tick();
  }

  // Generation 1 of members a, b (node n0) and c (n1) at step 5, under
  // min_members 2.
  void WorldOfThree() {
    Start(2, 3, absl::Seconds(100));
    Member& a = Add("a", "n0");
    Member& b = Add("b", "n0");
    Member& c = Add("c", "n1");
    for (Member* m : {&a, &b, &c}) Rendezvous(*m, 0, 5);
    ASSERT_TRUE(a.world && a.world->ok());
  }

  // A coordinator holding the lease of a new state file named after `tag`
  // forms generation 1 of members a, b (node n0) and c (n1) under
  // `min_members`; then a standby on the same file takes the lease over.
  // Returns the file's path; the standby's store is standby_store_.
  std::string TakeOverAfterAWorldOfThree(const std::string& tag, uint32_t min_members) {
    const std::string path = absl::StrCat(::testing::TempDir(), "/", tag, ::getpid(), ".db");
    ::unlink(path.c_str());
    stores_.push_back(std::move(OpenSqliteStateStore(path)).value());
    standby_store_ = std::move(OpenSqliteStateStore(path)).value();
    const absl::Time t0 = absl::FromUnixSeconds(1000);
    LeaseClaim primary(stores_.back().get(), "primary:1", absl::Seconds(3));
    EXPECT_TRUE(primary.Poll(t0)->has_value());
    Start(min_members, 3, absl::Seconds(1), stores_.back().get());
    Member& a = Add("a", "n0");
    Member& b = Add("b", "n0");
    Member& c = Add("c", "n1");
    for (Member* m : {&a, &b, &c}) Rendezvous(*m, 0);
    EXPECT_TRUE(a.world && a.world->ok());
    EXPECT_EQ(*c_->Heartbeat(a.session, {1}), 1u);
    LeaseClaim standby(standby_store_.get(), "standby:1", absl::Seconds(3));
    EXPECT_FALSE(standby.Poll(t0)->has_value());
    EXPECT_TRUE(standby.Poll(t0 + absl::Seconds(3))->has_value());
    return path;
  }

  FakeClock clock_;
  absl::Duration silence_hold_ = absl::ZeroDuration();  // CoordinatorOptions::silence_hold
  absl::Duration pause_timeout_ = absl::ZeroDuration();
  absl::Duration own_work_limit_ = absl::Minutes(10);  // CoordinatorOptions::own_work_limit
  std::unique_ptr<StateStore> store_;
  // Stores opened by a test; they outlive the coordinator.
  std::vector<std::unique_ptr<StateStore>> stores_;
  std::unique_ptr<StateStore> standby_store_;
  std::unique_ptr<Coordinator> c_;
  std::vector<std::unique_ptr<Member>> members_;
};

TEST_F(CoordinatorTest, WorldFormsAfterLastCall) {
  Start(2, 4);
  Member& a = Add("a", "n1");
  Member& b = Add("b", "n0");
  Rendezvous(a, 0);
  EXPECT_FALSE(a.world.has_value());
  Rendezvous(b, 0);
  EXPECT_FALSE(a.world.has_value());  // last call is running
  Advance(absl::Milliseconds(999));
  EXPECT_FALSE(a.world.has_value());
  Advance(absl::Milliseconds(1));
  ASSERT_TRUE(a.world && a.world->ok());
  ASSERT_TRUE(b.world && b.world->ok());
  EXPECT_EQ((*a.world)->world->generation, 1u);
  EXPECT_EQ((*a.world)->world->size(), 2u);
  EXPECT_EQ((*b.world)->rank, 0u);  // node n0 sorts first
  EXPECT_EQ((*a.world)->rank, 1u);
  EXPECT_EQ(c_->GetStatus().job_state, JobState::kRunning);
}

TEST_F(CoordinatorTest, MaxMembersFormsAtOnce) {
  Start(1, 2, absl::Seconds(100));
  Member& a = Add("a", "n");
  Member& b = Add("b", "n");
  Rendezvous(a, 0);
  Rendezvous(b, 0);
  ASSERT_TRUE(a.world && a.world->ok());
  EXPECT_EQ((*a.world)->world->size(), 2u);
}

// Waiters that arrive during a last call join the world it forms, without
// moving its end; the one that fills the world forms it at once.
TEST_F(CoordinatorTest, WaitersDuringLastCallJoinItsWorld) {
  Start(2, 4);
  Member& a = Add("a", "n");
  Member& b = Add("b", "n");
  Member& c = Add("c", "n");
  Rendezvous(a, 0);
  Rendezvous(b, 0);
  Advance(absl::Milliseconds(600));
  Rendezvous(c, 0);
  EXPECT_FALSE(c.world.has_value());
  Advance(absl::Milliseconds(400));
  ASSERT_TRUE(c.world && c.world->ok());
  EXPECT_EQ((*c.world)->world->size(), 3u);
  ASSERT_TRUE(a.world && a.world->ok());

  Start(2, 4);
  std::vector<Member*> ms;
  for (const char* id : {"p", "q", "r", "s"}) ms.push_back(&Add(id, "n"));
  for (int i = 0; i < 3; ++i) Rendezvous(*ms[i], 0);
  EXPECT_FALSE(ms[0]->world.has_value());
  Rendezvous(*ms[3], 0);
  ASSERT_TRUE(ms[0]->world && ms[0]->world->ok());
  EXPECT_EQ((*ms[0]->world)->world->size(), 4u);
}

TEST_F(CoordinatorTest, StreamBreakRegroupsSurvivorsAtOnce) {
  Start(2, 3, absl::Seconds(100));
  Member& a = Add("a", "n0");
  Member& b = Add("b", "n0");
  Member& d = Add("d", "n1");
  Rendezvous(a, 0, 5);
  Rendezvous(b, 0, 5);
  Rendezvous(d, 0, 5);
  ASSERT_TRUE(a.world && a.world->ok());
  ASSERT_EQ((*a.world)->world->size(), 3u);

  c_->SessionClosed(d.session, "connection reset");
  ASSERT_EQ(a.sink->events.size(), 1u);
  EXPECT_TRUE(a.sink->events[0].abort);
  EXPECT_EQ(a.sink->events[0].generation, 2u);
  EXPECT_NE(a.sink->events[0].reason.find("d failed"), std::string::npos);
  // Survivors rendezvous into generation 2 with their steps; b is ahead.
  Rendezvous(a, 1, 7);
  EXPECT_FALSE(a.world.has_value());
  Rendezvous(b, 1, 8);
  ASSERT_TRUE(a.world && a.world->ok());
  const World& w = *(*a.world)->world;
  EXPECT_EQ(w.generation, 2u);
  EXPECT_EQ(w.size(), 2u);
  EXPECT_EQ(w.RankOf("d"), -1);
  EXPECT_EQ(w.state_source_rank, static_cast<uint32_t>(w.RankOf("b")));
  EXPECT_EQ(w.state_step, 8);
  // The failed incarnation is fenced.
  EXPECT_EQ(c_->Heartbeat(d.session, {1}).status().code(), absl::StatusCode::kNotFound);
  Rendezvous(d, 0);
  EXPECT_EQ(d.world->status().code(), absl::StatusCode::kAborted);
}

// A member waiting while the world is full is a spare: it changes nothing
// (no new generation) until a member fails, and then it takes the place in
// that very generation.
TEST_F(CoordinatorTest, ASpareWaitsOutsideAFullWorldAndReplacesAFailedMember) {
  Start(2, 2, absl::Seconds(100));
  Member& a = Add("a", "n0");
  Member& b = Add("b", "n1");
  Rendezvous(a, 0, 5);
  Rendezvous(b, 0, 5);
  ASSERT_TRUE(a.world && a.world->ok());
  Member& s = Add("s", "n0");
  Rendezvous(s, 0);
  EXPECT_FALSE(s.world.has_value());
  EXPECT_TRUE(a.sink->events.empty()) << "a spare must not start a new generation";
  EXPECT_EQ(c_->GetStatus().generation, 1u);
  const StatusSnapshot status = c_->GetStatus();
  for (const MemberRow& row : status.members) {
    EXPECT_EQ(row.spare, row.info.key.id == "s") << row.info.key.id;
  }
  c_->SessionClosed(b.session, "connection reset");
  ASSERT_EQ(a.sink->events.size(), 1u);
  EXPECT_EQ(a.sink->events[0].generation, 2u);
  Rendezvous(a, 1, 7);
  ASSERT_TRUE(a.world && a.world->ok());
  ASSERT_TRUE(s.world && s.world->ok());
  const World& w = *(*a.world)->world;
  EXPECT_EQ(w.generation, 2u);
  EXPECT_EQ(w.size(), 2u);
  EXPECT_GE(w.RankOf("s"), 0);
  EXPECT_EQ(w.state_source_rank, static_cast<uint32_t>(w.RankOf("a")));
  // The events say that s waited as a spare and which place it took.
  std::vector<std::string> spare_events;
  absl::StatusOr<std::vector<JobEvent>> events = c_->RecentEvents(100);
  ASSERT_TRUE(events.ok()) << events.status();
  for (const JobEvent& e : *events) {
    if (e.kind == "spare" || absl::StrContains(e.detail, "spare")) spare_events.push_back(e.detail);
  }
  ASSERT_EQ(spare_events.size(), 2u) << absl::StrJoin(spare_events, "\n");
  EXPECT_EQ(spare_events[0], "s incarnation 1 on n0 local rank 0 (a spare: the world is full)");
  EXPECT_EQ(spare_events[1], absl::StrCat("s takes rank ", w.RankOf("s"), " in generation 2"));
}

// A spare renews its wait in slices (ElasticWorld's spare_poll): a member
// that fails just as a slice ran out, before the renewal arrives, still
// has its place taken by the spare, which arrives with that renewal. The
// world did not shrink to the survivors alone.
TEST_F(CoordinatorTest, AFailureBetweenTwoOfASparesWaitsStillSeatsTheSpare) {
  Start(1, 2, absl::Seconds(100));
  Member& a = Add("a", "n0");
  Member& b = Add("b", "n1");
  Rendezvous(a, 0, 5);
  Rendezvous(b, 0, 5);
  ASSERT_TRUE(a.world && a.world->ok());
  Member& s = Add("s", "n0");
  Rendezvous(s, 0, 0, absl::Seconds(2));
  Advance(absl::Milliseconds(2100));
  ASSERT_TRUE(s.world.has_value());
  ASSERT_EQ(s.world->status().code(), absl::StatusCode::kDeadlineExceeded);
  // b fails before s's renewal arrives.
  Advance(absl::Milliseconds(50));
  c_->SessionClosed(b.session, "connection reset");
  Rendezvous(a, 1, 7);
  Rendezvous(s, 0);
  ASSERT_TRUE(a.world.has_value());
  ASSERT_TRUE(a.world->ok()) << a.world->status();
  const World& w = *(*a.world)->world;
  EXPECT_EQ(w.generation, 2u);
  ASSERT_EQ(w.size(), 2u) << "the world shrank to the survivor";
  ASSERT_TRUE(s.world.has_value());
  ASSERT_TRUE(s.world->ok()) << s.world->status();
  EXPECT_GE(w.RankOf("s"), 0);
  // Past the grace, a member whose wait ran out is not taken for waiting.
  Member& t = Add("t", "n1");
  Rendezvous(t, 0, 0, absl::Seconds(1));
  Advance(absl::Milliseconds(1100));
  ASSERT_TRUE(t.world.has_value());
  ASSERT_EQ(t.world->status().code(), absl::StatusCode::kDeadlineExceeded);
  Advance(Coordinator::kRenewGrace + absl::Milliseconds(100));
  c_->SessionClosed(s.session, "connection reset");
  Rendezvous(a, 2, 9);
  ASSERT_TRUE(a.world.has_value());
  ASSERT_TRUE(a.world->ok()) << a.world->status();
  EXPECT_EQ((*a.world)->world->size(), 1u) << "a member that stopped renewing was seated";
}

// Members started as spares (a spare node's agent) that arrive first do not
// take the places of the trainers meant for the world: the world forms when
// those are there, and the spares wait outside it.
TEST_F(CoordinatorTest, MembersStartedAsSparesWaitForTheOthersToFormTheWorld) {
  Start(2, 2, absl::Seconds(100));
  Member& s0 = Add("s0", "spares", 1, /*spare=*/true);
  Member& s1 = Add("s1", "spares", 1, /*spare=*/true);
  Rendezvous(s0, 0);
  Rendezvous(s1, 0);
  Member& a = Add("a", "n0");
  Rendezvous(a, 0);
  EXPECT_FALSE(a.world.has_value()) << "two spares and one trainer must not form a world";
  Member& b = Add("b", "n0");
  Rendezvous(b, 0);
  ASSERT_TRUE(a.world && a.world->ok());
  const World& w = *(*a.world)->world;
  EXPECT_GE(w.RankOf("a"), 0);
  EXPECT_GE(w.RankOf("b"), 0);
  EXPECT_FALSE(s0.world.has_value());
  for (const MemberRow& row : c_->GetStatus().members) {
    EXPECT_EQ(row.spare, row.info.key.id[0] == 's') << row.info.key.id;
  }
  // Without enough other members, last call ends with the spares in.
  c_->SessionClosed(b.session, "connection reset");
  Rendezvous(a, 1);
  ASSERT_TRUE(s0.world && s0.world->ok());
  EXPECT_GE((*s0.world)->world->RankOf("s0"), 0);
}

// The state file's fsyncs take 300 ms (a slow shared file system). A world
// is written outside the coordinator's lock: heartbeats meanwhile are
// answered at once, and the members hear of the world only once it is on
// disk (a restarted coordinator could otherwise hand out its generation
// again).
TEST_F(CoordinatorTest, HeartbeatsDoNotWaitForASlowWriteAndAWorldIsAnnouncedOnlyWhenDurable) {
  const std::string path = StartOnSlowDisk("slow", absl::Milliseconds(300));
  Member& a = Add("a", "n0");
  Member& b = Add("b", "n0");
  Rendezvous(a, 0);
  auto reader = OpenSqliteStateStore(path);
  ASSERT_TRUE(reader.ok());
  uint64_t durable_when_answered = 0;
  std::thread former([&] {
    c_->Rendezvous(b.key, 0, 0, absl::Seconds(30), [&](absl::StatusOr<RendezvousResult> r) {
      ASSERT_TRUE(r.ok()) << r.status();
      durable_when_answered = (*reader)->LoadWorld()->generation;
      b.world = r;
    });
  });
  absl::SleepFor(absl::Milliseconds(50));  // the world is formed; its write is in its fsyncs
  const absl::Time t0 = absl::Now();
  const absl::StatusOr<uint64_t> told = c_->Heartbeat(a.session, {1});
  const absl::Duration heartbeat = absl::Now() - t0;
  former.join();
  ASSERT_TRUE(told.ok()) << told.status();
  EXPECT_LT(heartbeat, absl::Milliseconds(100)) << "a heartbeat waited for the disk";
  EXPECT_EQ(*told, 0u) << "a heartbeat named a generation before it was on disk";
  EXPECT_EQ(*c_->Heartbeat(a.session, {1}), 1u);
  ASSERT_TRUE(b.world && b.world->ok());
  EXPECT_EQ((*b.world)->world->generation, 1u);
  EXPECT_EQ(durable_when_answered, 1u) << "the world was announced before it was on disk";
}

// The lease is taken over; the old coordinator then decides a regroup that
// cannot become durable. Nobody may hear of that generation: the successor
// never knew it, and members told of it would wait for a world after their
// own for ever. A coordinator that stopped serving acknowledges nothing.
TEST_F(CoordinatorTest, AGenerationDecidedAfterTheLeaseWasTakenIsNeverAcknowledged) {
  const std::string path = TakeOverAfterAWorldOfThree("fenced", /*min_members=*/1);
  Member& a = *members_[0];
  Member& b = *members_[1];
  Member& c = *members_[2];
  c_->SessionClosed(c.session, "stream ended");  // decides generation 2: fenced
  EXPECT_EQ(c_->GetStatus().job_state, JobState::kShuttingDown);

  const absl::StatusOr<uint64_t> single = c_->Heartbeat(a.session, {2});
  EXPECT_FALSE(single.ok()) << "acknowledged generation " << *single;
  std::vector<bool> ok;
  const absl::StatusOr<uint64_t> node = c_->Heartbeats({b.session}, {MemberProgress{2}}, &ok);
  ASSERT_FALSE(node.ok()) << "a node was acknowledged generation " << *node;
  EXPECT_EQ(node.status().code(), absl::StatusCode::kUnavailable) << node.status();
  for (Member* m : {&a, &b}) {
    EXPECT_TRUE(m->sink->closed);
    EXPECT_EQ(m->sink->close_status.code(), absl::StatusCode::kUnavailable);
    for (const MemberEvent& e : m->sink->events) {
      EXPECT_LT(e.generation, 2u) << "told of a generation that is not on disk";
    }
  }
  EXPECT_EQ(standby_store_->LoadWorld()->generation, 1u);
  c_.reset();
  ::unlink(path.c_str());
}

// A pause is pushed only after a write the lease fences. A coordinator
// frozen past the lease timeout, woken, found a node's stream gone and told
// the remaining members their world paused before it learned that its lease
// was taken: they aborted and waited for a world the successor, which still
// ran theirs, never formed (the Slurm standby test, 5 runs in 12).
TEST_F(CoordinatorTest, APauseDecidedAfterTheLeaseWasTakenIsNeverPushed) {
  const std::string path = TakeOverAfterAWorldOfThree("fencedpause", /*min_members=*/3);
  Member& a = *members_[0];
  Member& b = *members_[1];
  Member& c = *members_[2];
  c_->SessionClosed(c.session, "stream ended");  // below min_members: a pause
  EXPECT_EQ(c_->GetStatus().job_state, JobState::kShuttingDown);
  for (Member* m : {&a, &b}) {
    for (const MemberEvent& e : m->sink->events) {
      EXPECT_FALSE(e.paused) << m->key.id << " was told: " << e.reason;
    }
  }
  c_.reset();
  ::unlink(path.c_str());
}

// Only the trainers see a broken link or a collective past its deadline: a
// member's report regroups its world once, whoever reports first.
TEST_F(CoordinatorTest, ABrokenWorldReportRegroupsItOnce) {
  WorldOfThree();
  Member& a = *members_[0];
  Member& b = *members_[1];
  Member& c = *members_[2];

  // Without a report, a member asking for the next world waits: nothing
  // tells the coordinator that the world broke.
  Rendezvous(a, 1, 5);
  Advance(absl::Seconds(2));
  EXPECT_FALSE(a.world.has_value());
  EXPECT_EQ(c_->GetStatus().generation, 1u);

  ASSERT_TRUE(c_->ReportBroken(a.key, {1, "gloo: Read error: Connection reset",
                                       absl::Seconds(5), {}})
                  .ok());
  EXPECT_EQ(c_->GetStatus().generation, 2u);
  for (Member* m : {&a, &b, &c}) {
    ASSERT_EQ(m->sink->events.size(), 1u) << m->key.id;
    const MemberEvent& e = m->sink->events[0];
    EXPECT_TRUE(e.abort);
    EXPECT_EQ(e.generation, 2u);
    EXPECT_TRUE(absl::StrContains(e.reason, "reports that generation 1 broke")) << e.reason;
    EXPECT_TRUE(absl::StrContains(e.reason, "Connection reset")) << e.reason;
  }
  // The same world reported again, or an older one: nothing changes.
  const absl::Status again = c_->ReportBroken(b.key, {1, "deadline", absl::Seconds(5), {}});
  EXPECT_EQ(again.code(), absl::StatusCode::kAborted) << again;
  EXPECT_EQ(c_->GetStatus().generation, 2u);
  EXPECT_EQ(c_->ReportBroken(b.key, {9, "?", absl::Seconds(5), {}}).code(),
            absl::StatusCode::kFailedPrecondition);
  Rendezvous(b, 1, 5);
  Rendezvous(c, 1, 5);
  for (Member* m : {&a, &b, &c}) {
    ASSERT_TRUE(m->world && m->world->ok()) << m->key.id;
    EXPECT_EQ((*m->world)->world->generation, 2u);
    EXPECT_EQ((*m->world)->world->size(), 3u);
    EXPECT_EQ(m->sink->events.size(), 1u) << m->key.id;
  }
}

// Two nodes that still reach the coordinator but not each other: a report
// that names the unreachable ranks leaves a node out (the one with fewer
// members) instead of forming the same world again. Its member waits,
// alive, and is let back when the hold ends; if the link still fails, the
// next report holds it out twice as long.
TEST_F(CoordinatorTest, AReportOfUnreachablePeersLeavesTheirNodeOutForAHold) {
  WorldOfThree();
  Member& a = *members_[0];
  Member& b = *members_[1];
  Member& c = *members_[2];
  ASSERT_TRUE(c_->ReportBroken(c.key, {1, "gloo collective passed its deadline",
                                       absl::Seconds(5), {0, 1}})
                  .ok());
  EXPECT_EQ(c_->GetStatus().generation, 2u);
  for (Member* m : {&a, &b, &c}) Rendezvous(*m, 1, 6);
  ASSERT_TRUE(a.world && a.world->ok());
  EXPECT_EQ((*a.world)->world->size(), 2u);
  EXPECT_EQ((*a.world)->world->RankOf("c"), -1);
  EXPECT_FALSE(c.world.has_value()) << "the held member waits";
  const auto held = [&] {
    for (const MemberRow& row : c_->GetStatus().members) {
      if (row.info.key.id == "c") return row.info.state;
    }
    return MemberState::kLeft;
  };
  EXPECT_EQ(held(), MemberState::kWaiting);
  auto events = c_->RecentEvents(20);
  ASSERT_TRUE(events.ok());
  std::string log;
  for (const JobEvent& e : *events) log += e.kind + ": " + e.detail + "\n";
  EXPECT_TRUE(absl::StrContains(log, "partition: node n1 left out for 10s: rank 2 (c) cannot "
                                     "reach ranks 0, 1 of generation 1"))
      << log;
  // The hold ends: c joins again at the next step boundary. Every member
  // beats meanwhile.
  const auto wait = [&](int seconds) {
    for (int i = 0; i < seconds; ++i) {
      for (Member* m : {&a, &b, &c}) c_->Heartbeat(m->session, {7}).IgnoreError();
      Advance(absl::Seconds(1));
    }
  };
  wait(9);
  EXPECT_EQ(c_->GetStatus().generation, 2u);
  wait(1);
  EXPECT_EQ(c_->GetStatus().generation, 3u);
  Rendezvous(a, 2, 7);
  Rendezvous(b, 2, 7);
  Rendezvous(c, 1, 7);
  ASSERT_TRUE(c.world && c.world->ok());
  EXPECT_EQ((*c.world)->world->size(), 3u);
  // Still cut: the world that took it back reports it again.
  ASSERT_TRUE(c_->ReportBroken(a.key, {3, "generation 3 did not start: cannot reach",
                                       absl::Seconds(5), {2}})
                  .ok());
  events = c_->RecentEvents(40);
  ASSERT_TRUE(events.ok());
  log.clear();
  for (const JobEvent& e : *events) log += e.kind + ": " + e.detail + "\n";
  EXPECT_TRUE(absl::StrContains(log, "node n1 left out for 20s")) << log;
  EXPECT_EQ(c_->GetStatus().world_size, 2u);
}

// A member whose session lives but which does not come to the regroup that
// follows a report (its training thread is stuck) is fenced as hung when
// the report's deadline passes; the others go on without it.
TEST_F(CoordinatorTest, AMemberThatDoesNotComeToTheRegroupIsFencedAsHung) {
  WorldOfThree();
  Member& a = *members_[0];
  Member& b = *members_[1];
  Member& c = *members_[2];

  ASSERT_TRUE(c_->ReportBroken(a.key, {1, "gloo collective passed its deadline",
                                       absl::Seconds(2), {}})
                  .ok());
  Rendezvous(a, 1, 5);
  Rendezvous(b, 1, 5);
  Advance(absl::Milliseconds(1900));
  EXPECT_FALSE(a.world.has_value());
  EXPECT_FALSE(c.sink->closed);
  Advance(absl::Milliseconds(100));
  EXPECT_TRUE(c.sink->closed);
  EXPECT_TRUE(c.sink->hung);
  EXPECT_EQ(c.sink->close_status.code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(absl::StrContains(c.sink->close_status.message(), "hung")) << c.sink->close_status;
  for (Member* m : {&a, &b}) {
    ASSERT_TRUE(m->world && m->world->ok()) << m->key.id;
    EXPECT_EQ((*m->world)->world->generation, 3u);
    EXPECT_EQ((*m->world)->world->size(), 2u);
    EXPECT_EQ((*m->world)->world->RankOf("c"), -1);
  }
  EXPECT_EQ(c_->GetStatus().job_state, JobState::kRunning);
}

// Heartbeats say how long each training thread has made no progress. A
// member still stalled when its peers' collective deadline passed is stuck:
// it is left out of the regroup at once, not after a second deadline. A
// peer whose newest heartbeat is from before it began to wait (it was
// computing) also said "stalled"; it is not taken for stuck.
TEST_F(CoordinatorTest, AMemberStalledWhenItsPeersDeadlinePassedIsLeftOutAtOnce) {
  WorldOfThree();
  Member& a = *members_[0];
  Member& b = *members_[1];
  Member& c = *members_[2];
  auto beat = [&](Member& m, absl::Duration stalled) {
    ASSERT_TRUE(c_->Heartbeat(m.session, {5, 0, stalled}).ok()) << m.key.id;
  };
  // All three compute step 6; a enters its all-reduce after 50 ms, c
  // freezes, and b's heartbeats stop reaching the coordinator (its newest
  // one, from while it computed, says 40 ms without progress).
  beat(a, absl::Milliseconds(40));
  beat(b, absl::Milliseconds(40));
  beat(c, absl::Milliseconds(40));
  Advance(absl::Milliseconds(10));
  for (int i = 1; i <= 4; ++i) {
    Advance(absl::Milliseconds(500));
    beat(a, absl::ZeroDuration());
    beat(c, absl::Milliseconds(50 + 500 * i));
  }
  ASSERT_TRUE(c_->ReportBroken(a.key, {1, "gloo collective passed its deadline",
                                       absl::Seconds(2), {}})
                  .ok());
  EXPECT_TRUE(c.sink->closed);
  EXPECT_TRUE(c.sink->hung);
  EXPECT_TRUE(absl::StrContains(
      c.sink->close_status.message(),
      "made no progress and did not run for 2s (after step 5) while its peers' collective "
      "deadline (2s) passed"))
      << c.sink->close_status;
  EXPECT_FALSE(b.sink->closed) << b.sink->close_status;
  Rendezvous(a, 1, 5);
  Rendezvous(b, 1, 5);
  for (Member* m : {&a, &b}) {
    ASSERT_TRUE(m->world && m->world->ok()) << m->key.id;
    EXPECT_EQ((*m->world)->world->generation, 2u) << "the stuck member was waited for";
    EXPECT_EQ((*m->world)->world->size(), 2u);
    EXPECT_EQ((*m->world)->world->RankOf("c"), -1);
  }
}

// The first world aborts nothing and is told at no boundary: its event
// says neither; a regroup after a report says "abort".
TEST_F(CoordinatorTest, OnlyARegroupOfALiveWorldSaysHowItsMembersAreTold) {
  WorldOfThree();
  ASSERT_TRUE(c_->ReportBroken(members_[0]->key,
                               {1, "gloo collective passed its deadline", absl::Seconds(2), {}})
                  .ok());
  const absl::StatusOr<std::vector<JobEvent>> events = c_->RecentEvents(40);
  ASSERT_TRUE(events.ok());
  std::vector<std::string> regroups;
  for (const JobEvent& e : *events) {
    if (e.kind == "regroup") regroups.push_back(e.detail);
  }
  ASSERT_EQ(regroups.size(), 2u);
  EXPECT_TRUE(absl::StartsWith(regroups[0], "generation 1: 3 members on 2 nodes (")) << regroups[0];
  EXPECT_TRUE(absl::EndsWith(regroups[0], "join)")) << regroups[0];
  EXPECT_TRUE(absl::EndsWith(regroups[1], "deadline, abort)")) << regroups[1];
}

// In a WorldOfThree, c works in the program's own code after step 5 (its
// heartbeats: stalled, its thread running; or, with in_call_, running
// inside one of muster's calls, where no stall shows) while a and b wait
// for it in step 6; half a second at a time from the start of c's stall.
class OwnWorkTest : public CoordinatorTest {
 protected:
  // Advances `seconds` in beats of 500 ms: a and b made progress, c has
  // been stalled since the start, or runs in a call (no beat from c once
  // it is fenced).
  void Beats(double seconds) {
    Member& c = *members_[2];
    for (const absl::Time end = Now() + absl::Seconds(seconds); Now() < end;) {
      Advance(absl::Milliseconds(500));
      for (int m : {0, 1}) ASSERT_TRUE(c_->Heartbeat(members_[m]->session, {5, 0}).ok());
      if (c.sink->closed) continue;
      const absl::Duration stalled = in_call_ ? absl::ZeroDuration() : Now() - start_;
      ASSERT_TRUE(c_->Heartbeat(c.session, MemberProgress(5, 0, stalled, absl::ZeroDuration(),
                                                          /*working=*/true))
                      .ok());
    }
  }
  // 2 s into c's stall, a reports that generation 1 broke (its deadline:
  // 2 s), and a and b come to the regroup.
  void PeersGiveUpWaiting() {
    WorldOfThree();
    start_ = Now();
    Beats(2);
    ASSERT_TRUE(c_->ReportBroken(members_[0]->key,
                                 {1, "gloo collective passed its deadline", absl::Seconds(2), {}})
                    .ok());
    Rendezvous(*members_[0], 1, 5);
    Rendezvous(*members_[1], 1, 5);
  }
  absl::Time Now() { return clock_.Now(); }

  absl::Time start_;
  bool in_call_ = false;
};

// A member whose training thread runs while its peers' deadline passes is
// in the program's own work (an evaluation on one rank alone): the regroup
// waits for it, window after window, while its heartbeats say it runs, and
// it comes to the world with the others.
TEST_F(OwnWorkTest, AMemberInTheProgramsOwnWorkIsWaitedFor) {
  PeersGiveUpWaiting();
  Member& a = *members_[0];
  Member& c = *members_[2];
  EXPECT_FALSE(c.sink->closed) << c.sink->close_status;
  Beats(10);  // five arrival windows
  EXPECT_FALSE(c.sink->closed) << c.sink->close_status;
  EXPECT_FALSE(a.world.has_value());
  Rendezvous(c, 1, 5);
  for (int m : {0, 1, 2}) {
    ASSERT_TRUE(members_[m]->world && members_[m]->world->ok()) << m;
    EXPECT_EQ((*members_[m]->world)->world->size(), 3u);
  }
  const absl::StatusOr<std::vector<JobEvent>> events = c_->RecentEvents(40);
  ASSERT_TRUE(events.ok());
  std::string log;
  for (const JobEvent& e : *events) log += e.kind + ": " + e.detail + "\n";
  EXPECT_TRUE(absl::StrContains(log, "waiting: rank 2 (c) is in the program's own work")) << log;
}

// Past the coordinator's --own-work-limit, counted from the start of its
// stall, a member in its own work is fenced as hung like a stuck one.
TEST_F(OwnWorkTest, AMemberInItsOwnWorkPastTheLimitIsFenced) {
  own_work_limit_ = absl::Seconds(5);
  PeersGiveUpWaiting();
  Member& a = *members_[0];
  Member& c = *members_[2];
  Beats(2);  // the first window ends 4 s into its stall
  EXPECT_FALSE(c.sink->closed) << c.sink->close_status;
  Beats(2);  // the second, past 5 s
  EXPECT_TRUE(c.sink->closed);
  EXPECT_TRUE(c.sink->hung);
  EXPECT_TRUE(absl::StrContains(c.sink->close_status.message(),
                                "in the program's own work past the coordinator's "
                                "--own-work-limit (5s)"))
      << c.sink->close_status;
  ASSERT_TRUE(a.world && a.world->ok());
  EXPECT_EQ((*a.world)->world->size(), 2u);
}

// A member whose thread runs inside one of muster's calls (no stall: a
// collective that spins on a hung device) is not in the program's own
// work: it is fenced when the arrival window passes, as before.
TEST_F(OwnWorkTest, AMemberRunningInsideMustersCallsIsNotWaitedFor) {
  in_call_ = true;
  PeersGiveUpWaiting();
  Member& a = *members_[0];
  Member& c = *members_[2];
  EXPECT_FALSE(c.sink->closed) << c.sink->close_status;
  Beats(2);  // the arrival window
  EXPECT_TRUE(c.sink->closed);
  EXPECT_TRUE(c.sink->hung);
  ASSERT_TRUE(a.world && a.world->ok());
  EXPECT_EQ((*a.world)->world->size(), 2u);
}

// A member that computes, but not for as long as its peers' deadline, is
// waited for within the arrival window (a straggler, not a stuck rank).
TEST_F(CoordinatorTest, AStragglerIsWaitedFor) {
  WorldOfThree();
  Member& a = *members_[0];
  Member& b = *members_[1];
  Member& c = *members_[2];
  Advance(absl::Seconds(2));
  ASSERT_TRUE(c_->Heartbeat(a.session, {5, 0, absl::ZeroDuration()}).ok());
  ASSERT_TRUE(c_->Heartbeat(b.session, {5, 0, absl::ZeroDuration()}).ok());
  ASSERT_TRUE(c_->Heartbeat(c.session, {5, 0, absl::Milliseconds(1500)}).ok());
  ASSERT_TRUE(c_->ReportBroken(a.key, {1, "gloo collective passed its deadline",
                                       absl::Seconds(2), {}})
                  .ok());
  EXPECT_FALSE(c.sink->closed) << c.sink->close_status;
  Rendezvous(a, 1, 5);
  Rendezvous(b, 1, 5);
  Rendezvous(c, 1, 5);
  ASSERT_TRUE(a.world && a.world->ok());
  EXPECT_EQ((*a.world)->world->size(), 3u);
}

// A failure the coordinator sees itself (a stream that breaks) sets no
// arrival deadline: a member that is slow to come is waited for.
TEST_F(CoordinatorTest, AKillRegroupWaitsForSlowMembers) {
  WorldOfThree();
  Member& a = *members_[0];
  Member& b = *members_[1];
  Member& c = *members_[2];
  c_->SessionClosed(c.session, "connection reset");
  Rendezvous(a, 1, 5);
  Advance(absl::Seconds(4));
  EXPECT_FALSE(b.sink->closed);
  Rendezvous(b, 1, 5);
  ASSERT_TRUE(a.world && a.world->ok());
  EXPECT_EQ((*a.world)->world->generation, 2u);
}

// "Committed" is said only once the record is on disk, and the catalog's
// slow writes do not hold up heartbeats either.
TEST_F(CoordinatorTest, ACheckpointIsReportedCommittedOnlyOnceItIsDurable) {
  const std::string path = StartOnSlowDisk("slowckpt", absl::Milliseconds(200));
  Member& a = Add("a", "n0");
  Member& b = Add("b", "n0");
  Rendezvous(a, 0);
  Rendezvous(b, 0);
  ASSERT_TRUE(a.world && a.world->ok());
  const uint64_t id = *c_->BeginCheckpoint(1, a.key, 10);
  ASSERT_EQ(*c_->BeginCheckpoint(1, b.key, 10), id);
  ASSERT_FALSE(*c_->ReportShard(id, a.key, {}));
  absl::Duration heartbeat;
  std::thread beat([&] {
    absl::SleepFor(absl::Milliseconds(50));
    const absl::Time t0 = absl::Now();
    EXPECT_TRUE(c_->Heartbeat(a.session, {10}).ok());
    heartbeat = absl::Now() - t0;
  });
  ASSERT_TRUE(*c_->ReportShard(id, b.key, {}));
  beat.join();
  auto reader = OpenSqliteStateStore(path);
  ASSERT_TRUE(reader.ok());
  auto records = (*reader)->LoadCheckpoints();
  ASSERT_TRUE(records.ok());
  ASSERT_EQ(records->size(), 1u);
  EXPECT_EQ((*records)[0].state, CheckpointState::kCommitted);
  EXPECT_LT(heartbeat, absl::Milliseconds(100)) << "a heartbeat waited for the disk";
}

TEST_F(CoordinatorTest, HeartbeatTimeoutFailsHungMember) {
  Start(1, 2, absl::Seconds(100));
  Member& a = Add("a", "n");
  Member& b = Add("b", "n");
  Rendezvous(a, 0);
  Rendezvous(b, 0);
  ASSERT_TRUE(a.world->ok());
  for (int i = 0; i < 4; ++i) {
    Advance(absl::Seconds(1));
    ASSERT_TRUE(c_->Heartbeat(a.session, {i, 64 * i}).ok());
  }
  EXPECT_TRUE(a.sink->events.empty());
  for (const MemberRow& row : c_->GetStatus().members) {  // what the status page shows
    if (row.info.key.id != "a") continue;
    EXPECT_EQ(row.info.step, 3);
    EXPECT_EQ(row.info.samples, 192);
  }
  Advance(absl::Milliseconds(1500));  // b silent for 5.5 s
  ASSERT_EQ(a.sink->events.size(), 1u);
  EXPECT_TRUE(a.sink->events[0].abort);
  EXPECT_TRUE(b.sink->closed);
  EXPECT_EQ(b.sink->close_status.code(), absl::StatusCode::kAborted);
  auto status = c_->GetStatus();
  EXPECT_EQ(status.generation, 2u);
  EXPECT_EQ(status.world_size, 1u);
}

TEST_F(CoordinatorTest, NoOneHeardOnAnyOfTwoNodesIsAHoldThatFailsNobody) {
  silence_hold_ = absl::Seconds(10);
  WorldOfThree();  // a, b on n0; c on n1; heartbeat every 1 s, timeout 5 s
  Member& a = *members_[0];
  Member& b = *members_[1];
  Advance(absl::Seconds(2));
  EXPECT_EQ(c_->Unheard(), absl::ZeroDuration());
  ASSERT_TRUE(c_->Heartbeat(a.session, {6}).ok());  // n0 heard; n1 silent for 2 s
  ASSERT_TRUE(c_->Heartbeat(b.session, {6}).ok());
  Advance(absl::Seconds(2));
  EXPECT_EQ(c_->Unheard(), absl::ZeroDuration());  // 2 s: under half the timeout
  Advance(absl::Seconds(1));
  EXPECT_EQ(c_->Unheard(), absl::Seconds(3));  // nobody heard for 3 s
  // Past the heartbeat timeout of every member: the hold fails nobody.
  Advance(absl::Seconds(4));
  for (auto& m : members_) EXPECT_FALSE(m->sink->closed);
  EXPECT_EQ(c_->GetStatus().generation, 1u);
  // Heard again: a and b come back now, c gets a timeout to come back too.
  ASSERT_TRUE(c_->Heartbeat(a.session, {7}).ok());
  ASSERT_TRUE(c_->Heartbeat(b.session, {7}).ok());
  EXPECT_EQ(c_->Unheard(), absl::ZeroDuration());
  for (int i = 0; i < 4; ++i) {
    Advance(absl::Seconds(1));
    ASSERT_TRUE(c_->Heartbeat(a.session, {8 + i}).ok());
    ASSERT_TRUE(c_->Heartbeat(b.session, {8 + i}).ok());
  }
  EXPECT_FALSE(members_[2]->sink->closed);
  Advance(absl::Milliseconds(1100));  // the timeout after the hold has passed
  EXPECT_TRUE(members_[2]->sink->closed);
  EXPECT_FALSE(a.sink->closed);
  EXPECT_FALSE(b.sink->closed);
}

// Members cut off from a coordinator that hears nobody give up on their
// streams to reconnect: a stream that ends during the hold fails nobody.
// The member that comes back goes on; the one that stays away is failed
// once the timeout after the hold has passed.
TEST_F(CoordinatorTest, AStreamThatEndsDuringAHoldFailsNobodyUnlessItsMemberStaysAway) {
  silence_hold_ = absl::Seconds(10);
  WorldOfThree();  // a, b on n0; c on n1; heartbeat every 1 s, timeout 5 s
  Member& a = *members_[0];
  Member& b = *members_[1];
  Member& c = *members_[2];
  Advance(absl::Seconds(3));
  ASSERT_GT(c_->Unheard(), absl::ZeroDuration());
  c_->SessionClosed(a.session, "stream ended");
  c_->SessionClosed(c.session, "stream ended");
  Advance(absl::Seconds(1));
  EXPECT_EQ(c_->GetStatus().generation, 1u) << "a member was failed during the hold";
  for (auto& m : members_) EXPECT_FALSE(m->sink->closed);
  // a reconnects; with b it is heard again, which ends the hold.
  auto reopened = c_->OpenSession(a.key, a.sink);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  a.session = *reopened;
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(c_->Heartbeat(a.session, {7 + i}).ok());
    ASSERT_TRUE(c_->Heartbeat(b.session, {7 + i}).ok());
    Advance(absl::Seconds(1));
  }
  EXPECT_EQ(c_->GetStatus().generation, 1u);
  Advance(absl::Milliseconds(1100));  // the timeout after the hold has passed
  const auto status = c_->GetStatus();
  EXPECT_EQ(status.generation, 2u) << "c, which stayed away, was not failed";
  EXPECT_EQ(status.world_size, 2u);
  EXPECT_FALSE(a.sink->closed);
}

TEST_F(CoordinatorTest, AHoldEndsWhereNoStandbyTookOverAndTheSilentAreFailed) {
  silence_hold_ = absl::Seconds(4);
  WorldOfThree();
  Advance(absl::Seconds(3));
  EXPECT_GT(c_->Unheard(), absl::ZeroDuration());
  Advance(absl::Seconds(3));  // silent 6 s, held 3 s
  for (auto& m : members_) EXPECT_FALSE(m->sink->closed);
  Advance(absl::Milliseconds(1100));  // held past 4 s
  EXPECT_EQ(c_->Unheard(), absl::ZeroDuration());
  for (auto& m : members_) EXPECT_TRUE(m->sink->closed);
}

TEST_F(CoordinatorTest, ANodesBeatWithNoMemberInItIsStillWordFromTheNetwork) {
  silence_hold_ = absl::Seconds(10);
  WorldOfThree();
  clock_.Advance(absl::Seconds(3));
  EXPECT_GT(c_->Unheard(), absl::ZeroDuration());
  c_->Heard();  // an agent's beat whose trainers all went silent
  EXPECT_EQ(c_->Unheard(), absl::ZeroDuration());
}

TEST_F(CoordinatorTest, WithoutAHoldTimeTheCoordinatorNeverHolds) {
  WorldOfThree();  // silence_hold 0: no lease, no standby to take over
  clock_.Advance(absl::Seconds(3));
  EXPECT_EQ(c_->Unheard(), absl::ZeroDuration());
}

TEST_F(CoordinatorTest, ASilentSingleNodeIsThatNodesOwnSilence) {
  silence_hold_ = absl::Seconds(10);
  Start(1, 2, absl::Seconds(100));
  Member& a = Add("a", "n");
  Member& b = Add("b", "n");
  Rendezvous(a, 0);
  Rendezvous(b, 0);
  ASSERT_TRUE(a.world->ok());
  clock_.Advance(absl::Seconds(4));
  EXPECT_EQ(c_->Unheard(), absl::ZeroDuration());
}

TEST_F(CoordinatorTest, AStoredWorldWaitingForItsMembersIsNotASilence) {
  silence_hold_ = absl::Seconds(10);
  RestartWithAStoredWorld("unheard", "m");
  clock_.Advance(absl::Seconds(4));
  EXPECT_EQ(c_->Unheard(), absl::ZeroDuration());
}

TEST(IsolatedAfterTest, HalfTheTimeoutAndAtLeastTwoBeatsButAlwaysShortOfTheTimeout) {
  CoordinatorOptions o;
  o.heartbeat_timeout = absl::Seconds(5);
  EXPECT_EQ(IsolatedAfter(absl::Seconds(1), o), absl::Milliseconds(2500));
  EXPECT_EQ(IsolatedAfter(absl::Seconds(4), o), absl::Milliseconds(4500));
  // Beats stretched to a third of the timeout (HeartbeatIntervalFor): 3.33 s.
  EXPECT_NEAR(absl::ToDoubleSeconds(IsolatedAfter(absl::Seconds(5) / 3, o)), 10.0 / 3, 1e-6);
  o.heartbeat_timeout = absl::Seconds(2);
  EXPECT_EQ(IsolatedAfter(absl::Milliseconds(200), o), absl::Seconds(1));
  o.heartbeat_timeout = absl::Seconds(10);
  EXPECT_EQ(IsolatedAfter(absl::Seconds(2), o), absl::Seconds(5));
}

TEST_F(CoordinatorTest, BelowMinPausesThenResumes) {
  Start(2, 4, absl::ZeroDuration());
  Member& a = Add("a", "n");
  Member& b = Add("b", "n");
  Rendezvous(a, 0);
  Rendezvous(b, 0);
  ASSERT_TRUE(a.world->ok());
  c_->SessionClosed(b.session, "killed");
  ASSERT_EQ(a.sink->events.size(), 1u);
  EXPECT_TRUE(a.sink->events[0].abort);
  EXPECT_NE(a.sink->events[0].reason.find("min_members"), std::string::npos);
  EXPECT_EQ(c_->GetStatus().job_state, JobState::kWaiting);
  Rendezvous(a, 1, 50);
  EXPECT_FALSE(a.world.has_value());
  Member& b2 = Add("b", "n", /*inc=*/2);
  Rendezvous(b2, 0, 0);
  ASSERT_TRUE(a.world && a.world->ok());
  EXPECT_EQ((*a.world)->world->generation, 2u);
  EXPECT_EQ((*b2.world)->world->state_step, 50);
}

TEST_F(CoordinatorTest, JoinDuringTrainingRegroupsAtStepBoundary) {
  Start(1, 4, absl::Seconds(1));
  Member& a = Add("a", "n");
  Rendezvous(a, 0);
  Advance(absl::Seconds(1));
  ASSERT_TRUE(a.world && a.world->ok());
  Member& b = Add("b", "n");
  Rendezvous(b, 0);
  Advance(absl::Seconds(1));
  ASSERT_EQ(a.sink->events.size(), 1u);
  EXPECT_FALSE(a.sink->events[0].abort);
  EXPECT_EQ(a.sink->events[0].generation, 2u);
  EXPECT_FALSE(b.world.has_value());  // waits for a to reach the boundary
  Rendezvous(a, 1, 12);
  ASSERT_TRUE(b.world && b.world->ok());
  EXPECT_EQ((*b.world)->world->size(), 2u);
  EXPECT_EQ((*b.world)->world->state_step, 12);
}

TEST_F(CoordinatorTest, DrainAndFinish) {
  Start(1, 2, absl::Seconds(100));
  Member& a = Add("a", "n0");
  Member& b = Add("b", "n1");
  Rendezvous(a, 0);
  Rendezvous(b, 0);
  EXPECT_EQ(c_->Drain("nowhere").status().code(), absl::StatusCode::kNotFound);
  ASSERT_EQ(*c_->Drain("n1"), 1u);
  ASSERT_EQ(b.sink->events.size(), 1u);
  EXPECT_TRUE(b.sink->events[0].leave);
  EXPECT_FALSE(b.sink->events[0].abort);
  ASSERT_EQ(a.sink->events.size(), 1u);
  EXPECT_FALSE(a.sink->events[0].leave);
  ASSERT_TRUE(c_->Leave(b.key, LeaveReason::kGraceful, 20).ok());
  Rendezvous(a, 1, 20);
  ASSERT_TRUE(a.world->ok());
  EXPECT_EQ((*a.world)->world->size(), 1u);
  ASSERT_TRUE(c_->Leave(a.key, LeaveReason::kFinished, 30).ok());
  EXPECT_EQ(c_->GetStatus().job_state, JobState::kFinished);
  EXPECT_EQ(c_->Counters().failures, 0u);
}

TEST_F(CoordinatorTest, RestartedIncarnationReplacesItsFormerSelf) {
  Start(1, 2, absl::Seconds(100));
  Member& a = Add("a", "n");
  Member& b = Add("b", "n");
  Rendezvous(a, 0);
  Rendezvous(b, 0);
  Add("b", "n", /*inc=*/2);
  EXPECT_TRUE(b.sink->closed);
  ASSERT_EQ(a.sink->events.size(), 1u);
  EXPECT_TRUE(a.sink->events[0].abort);
}

TEST_F(CoordinatorTest, KvIsNamespacedByGeneration) {
  Start(1, 2, absl::Seconds(100));
  Member& a = Add("a", "n");
  Member& b = Add("b", "n");
  Rendezvous(a, 0);
  Rendezvous(b, 0);
  ASSERT_TRUE(c_->KvSet(1, "nccl_id", "abc").ok());
  EXPECT_EQ(c_->KvSet(2, "x", "y").code(), absl::StatusCode::kFailedPrecondition);
  std::optional<absl::StatusOr<std::vector<std::string>>> got, waiting;
  c_->KvGet(1, {"nccl_id"}, absl::ZeroDuration(), [&](auto r) { got = r; });
  ASSERT_TRUE(got && got->ok());
  EXPECT_EQ((**got)[0], "abc");
  c_->KvGet(1, {"later"}, absl::Seconds(10), [&](auto r) { waiting = r; });
  EXPECT_FALSE(waiting.has_value());
  c_->SessionClosed(b.session, "gone");  // generation 2 forms
  ASSERT_TRUE(waiting.has_value());
  EXPECT_EQ(waiting->status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(c_->KvSet(1, "k", "v").code(), absl::StatusCode::kAborted);
  c_->KvGet(2, {"nccl_id"}, absl::ZeroDuration(), [&](auto r) { got = r; });
  EXPECT_EQ(got->status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CoordinatorTest, BarrierAndCatalogAcrossAFailure) {
  Start(1, 2, absl::Seconds(100));
  Member& a = Add("a", "n");
  Member& b = Add("b", "n");
  Rendezvous(a, 0);
  Rendezvous(b, 0);
  std::optional<absl::Status> ba, bb;
  c_->Barrier(1, a.key, "init", absl::Seconds(5), [&](absl::Status s) { ba = s; });
  EXPECT_FALSE(ba.has_value());
  c_->Barrier(1, b.key, "init", absl::Seconds(5), [&](absl::Status s) { bb = s; });
  ASSERT_TRUE(ba && ba->ok() && bb && bb->ok());

  uint64_t id = *c_->BeginCheckpoint(1, a.key, 100);
  EXPECT_EQ(*c_->BeginCheckpoint(1, b.key, 100), id);
  ShardReport r;
  r.files = {{"", "/ck/100/model.safetensors", 10, "0123456789abcdef"}};
  EXPECT_FALSE(*c_->ReportShard(id, a.key, r));
  EXPECT_TRUE(*c_->ReportShard(id, b.key, {}));
  ASSERT_EQ(c_->ListCheckpoints(false).size(), 1u);

  uint64_t id2 = *c_->BeginCheckpoint(1, a.key, 200);
  ASSERT_FALSE(*c_->ReportShard(id2, a.key, r));
  c_->SessionClosed(b.session, "killed mid-checkpoint");
  auto all = c_->ListCheckpoints(true);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].state, CheckpointState::kAborted);  // never commits
  EXPECT_EQ(c_->ListCheckpoints(false)[0].step, 100);
  EXPECT_EQ(c_->BeginCheckpoint(1, a.key, 300).status().code(), absl::StatusCode::kAborted);
}

TEST_F(CoordinatorTest, RendezvousDeadline) {
  Start(2, 4);
  Member& a = Add("a", "n");
  Rendezvous(a, 0, 0, absl::Seconds(2));
  for (int i = 0; i < 2; ++i) {
    Advance(absl::Seconds(1));
    ASSERT_TRUE(c_->Heartbeat(a.session, {0}).ok());
  }
  ASSERT_TRUE(a.world.has_value());
  EXPECT_EQ(a.world->status().code(), absl::StatusCode::kDeadlineExceeded);
}

// Found by muster-fault's partition scenario: a member that rejoined while
// the others finished waited for a world that would never form.
TEST_F(CoordinatorTest, FinishingTheJobAnswersMembersWaitingForAWorld) {
  Start(1, 4);
  Member& a = Add("a", "n");
  Rendezvous(a, 0);
  Advance(absl::Milliseconds(1100));  // past last call
  ASSERT_TRUE(a.world.has_value() && a.world->ok());
  Member& b = Add("b", "m");
  Rendezvous(b, 0);  // waits for the next generation (last call)
  ASSERT_FALSE(b.world.has_value());
  ASSERT_TRUE(c_->Leave(a.key, LeaveReason::kFinished, 100).ok());
  ASSERT_TRUE(b.world.has_value());
  EXPECT_EQ(b.world->status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(b.world->status().message(), "the job has finished");
}

// Found by muster-bench recovery: a killed trainer's restart joined while
// the survivor ran the job's last steps. The generation that took the
// restart in waited for the survivor, which finished instead of entering
// it, and the restart waited for that world for ever.
TEST_F(CoordinatorTest, AMemberThatFinishesEndsTheJobForAWorldWaitingForIt) {
  Start(1, 2);
  Member& a = Add("a", "n");
  Rendezvous(a, 0);
  Advance(absl::Milliseconds(1100));  // past last call
  ASSERT_TRUE(a.world.has_value() && a.world->ok());
  Member& b = Add("b", "m", /*inc=*/2);
  Rendezvous(b, 0);  // the world is full at 2: generation 2 forms, at a step boundary
  Advance(absl::Milliseconds(1100));
  ASSERT_EQ(c_->GetStatus().generation, 2u);
  ASSERT_FALSE(b.world.has_value()) << "b waits for a to arrive in generation 2";
  ASSERT_TRUE(c_->Leave(a.key, LeaveReason::kFinished, 600).ok());
  ASSERT_TRUE(b.world.has_value());
  EXPECT_EQ(b.world->status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(b.world->status().message(), "the job has finished");
  EXPECT_EQ(c_->GetStatus().job_state, JobState::kFinished);
}

// Members finish one at a time; a spare that renews its wait in between
// saw too few members left (the finished ones, below min_members) and the
// world paused, so the job never finished for the spare: found by
// LibraryTest.ASpareTakesTheKilledTrainersPlaceAndItsRestartIsTheNextSpare,
// which hung at its end.
TEST_F(CoordinatorTest, AWorldThatBeganFinishingNeitherPausesNorRegroupsAndEndsForItsSpare) {
  Start(3, 3);
  std::vector<Member*> world;
  for (const char* id : {"a", "b", "c"}) world.push_back(&Add(id, "n"));
  for (Member* m : world) Rendezvous(*m, 0);
  ASSERT_TRUE(world[0]->world.has_value() && world[0]->world->ok());
  const uint64_t generation = c_->GetStatus().generation;
  Member& spare = Add("s", "m", /*inc=*/1, /*spare=*/true);
  Rendezvous(spare, 0);
  ASSERT_TRUE(c_->Leave(world[0]->key, LeaveReason::kFinished, 100).ok());
  ASSERT_TRUE(c_->Leave(world[1]->key, LeaveReason::kFinished, 100).ok());
  Rendezvous(spare, 0);  // it renews its wait: one of the world and a spare remain
  Advance(absl::Milliseconds(1100));  // past last call
  EXPECT_FALSE(spare.world.has_value()) << "no world forms for the spare";
  EXPECT_EQ(c_->GetStatus().generation, generation);
  EXPECT_EQ(c_->GetStatus().job_state, JobState::kRunning) << "not paused";
  ASSERT_TRUE(c_->Leave(world[2]->key, LeaveReason::kFinished, 100).ok());
  EXPECT_EQ(c_->GetStatus().job_state, JobState::kFinished);
  ASSERT_TRUE(spare.world.has_value());
  EXPECT_EQ(spare.world->status().message(), "the job has finished");
}

// A member of a finishing world that fails has nothing left to train: the
// job ends when the others finished.
TEST_F(CoordinatorTest, AMemberThatFailsAfterTheOthersFinishedEndsTheJob) {
  Start(2, 2);
  Member& a = Add("a", "n");
  Member& b = Add("b", "n");
  Rendezvous(a, 0);
  Rendezvous(b, 0);
  ASSERT_TRUE(a.world.has_value() && a.world->ok());
  ASSERT_TRUE(c_->Leave(a.key, LeaveReason::kFinished, 100).ok());
  EXPECT_EQ(c_->GetStatus().job_state, JobState::kRunning);
  c_->SessionClosed(b.session, "connection reset");
  EXPECT_EQ(c_->GetStatus().job_state, JobState::kFinished);
}

// A job stopped by every member at one step (a checkpoint to stop, then a
// requeue) neither regroups nor pauses as each stops, and its world is
// forgotten once all did: a coordinator restarted on the same state waits
// for none of them, and the requeued job's world, of other members, forms
// at once as a first world. Stopped members used to count as failed, and
// a restart waited its reattach grace for members that were gone.
TEST_F(CoordinatorTest, AJobStoppedByEveryMemberIsForgottenAndARestartWaitsForNobody) {
  StateStore* store = NewStateFile("stop");
  const auto [a, b] = WorldOfTwo(store);
  ASSERT_TRUE(c_->Leave(a->key, LeaveReason::kStopped, 60).ok());
  EXPECT_EQ(c_->GetStatus().job_state, JobState::kRunning) << "b stops at the same step";
  EXPECT_TRUE(b->sink->events.empty()) << "no regroup, no pause";
  ASSERT_TRUE(c_->Leave(b->key, LeaveReason::kStopped, 60).ok());
  StatusSnapshot s = c_->GetStatus();
  EXPECT_EQ(s.job_state, JobState::kWaiting);
  EXPECT_EQ(s.generation, 1u);
  EXPECT_EQ(s.world_size, 0u);
  c_.reset();
  Start(1, 1, absl::Seconds(1), store);
  s = c_->GetStatus();
  EXPECT_EQ(s.job_state, JobState::kWaiting) << "not recovering: nobody to wait for";
  EXPECT_EQ(s.generation, 1u);
  Member& c = Add("c", "n");
  Rendezvous(c, 0);
  ASSERT_TRUE(c.world.has_value());
  ASSERT_TRUE(c.world->ok()) << c.world->status();
  EXPECT_EQ((*c.world)->world->generation, 2u);
  EXPECT_EQ(c_->GetStatus().job_state, JobState::kRunning);
}

// A world that paused below min_members is stored as paused: a
// coordinator restarted on it does not wait its reattach grace for members
// nobody trained with (the killed job's, say), and the requeued members
// form the next world as soon as there are enough.
TEST_F(CoordinatorTest, ARestartAfterAPauseWaitsForNobody) {
  StateStore* store = NewStateFile("pause");
  const auto [a, b] = WorldOfTwo(store);
  c_->SessionClosed(b->session, "connection reset");
  c_->SessionClosed(a->session, "connection reset");
  ASSERT_EQ(c_->GetStatus().job_state, JobState::kWaiting);
  c_.reset();
  pause_timeout_ = absl::Seconds(60);
  Start(2, 2, absl::Seconds(1), store);
  EXPECT_EQ(c_->GetStatus().job_state, JobState::kWaiting) << "not recovering";
  EXPECT_EQ(c_->GetStatus().generation, 1u);
  // Still paused: --pause-timeout counts from the restart.
  Advance(absl::Seconds(61));
  EXPECT_NE(c_->JobEnded().find("--pause-timeout"), std::string::npos) << c_->JobEnded();
  Member& a2 = Add("a", "n", /*inc=*/2);
  Member& c = Add("c", "m");
  Rendezvous(a2, 0);
  Rendezvous(c, 0);
  ASSERT_TRUE(a2.world.has_value());
  ASSERT_TRUE(a2.world->ok()) << a2.world->status();
  EXPECT_EQ((*a2.world)->world->generation, 2u);
}

// A joiner seated in the world formed at the step the others stopped at
// (a stop wins over a newer world) is not left in a forming world that
// never completes: it only waits, as in a paused job, and the world is
// forgotten once the others stopped.
TEST_F(CoordinatorTest, AJoinerOfTheWorldFormedAsTheOthersStoppedWaitsAsInAPause) {
  const auto [a, b] = WorldOfTwoOfThree();
  Member& c = Add("c", "n");
  Rendezvous(c, 0);
  Advance(absl::Milliseconds(1100));  // past last call: generation 2 of three forms
  ASSERT_EQ(c_->GetStatus().generation, 2u);
  ASSERT_EQ(c_->GetStatus().world_size, 3u);
  ASSERT_TRUE(c_->Leave(a->key, LeaveReason::kStopped, 40).ok());
  ASSERT_TRUE(c_->Leave(b->key, LeaveReason::kStopped, 40).ok());
  const StatusSnapshot s = c_->GetStatus();
  EXPECT_EQ(s.job_state, JobState::kWaiting);
  EXPECT_EQ(s.world_size, 0u);
  EXPECT_FALSE(c.world.has_value()) << "no world of c alone was formed for it";
}

// A member whose session closes after the others stopped with the job
// (its own Leave never came) ends the world as they did: no regroup of the
// one left, no pause, the world forgotten.
TEST_F(CoordinatorTest, AMemberLostAfterTheOthersStoppedEndsTheWorldAsAStop) {
  Start(1, 3);
  std::vector<Member*> world;
  for (const char* id : {"a", "b", "c"}) world.push_back(&Add(id, "n"));
  for (Member* m : world) Rendezvous(*m, 0);
  ASSERT_TRUE(world[0]->world.has_value() && world[0]->world->ok());
  ASSERT_TRUE(c_->Leave(world[0]->key, LeaveReason::kStopped, 80).ok());
  ASSERT_TRUE(c_->Leave(world[1]->key, LeaveReason::kStopped, 80).ok());
  c_->SessionClosed(world[2]->session, "connection reset");
  const StatusSnapshot s = c_->GetStatus();
  EXPECT_EQ(s.job_state, JobState::kWaiting);
  EXPECT_EQ(s.generation, 1u) << "no world formed for the one left";
  EXPECT_EQ(s.world_size, 0u);
  EXPECT_TRUE(world[2]->sink->events.empty());
}

// Found by tests/fuzz/coordinator_fuzz: adopting 2^64-1 made the next world
// generation 0.
TEST_F(CoordinatorTest, AfterGenerationCannotWrapTheCounter) {
  Start(1, 1);
  Member& a = Add("a", "n");
  Rendezvous(a, ~uint64_t{0});
  ASSERT_TRUE(a.world.has_value());
  EXPECT_EQ(a.world->status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c_->GetStatus().generation, 0u);
  Rendezvous(a, uint64_t{1} << 62);  // still adopted: a world after it forms
  ASSERT_TRUE(a.world.has_value());
  ASSERT_TRUE(a.world->ok()) << a.world->status();
  EXPECT_EQ((*a.world)->world->generation, (uint64_t{1} << 62) + 1);
}

// A generation adopted from a member (the coordinator had lost its state)
// is stored: a restart before any world formed does not go back below it.
TEST_F(CoordinatorTest, AnAdoptedGenerationSurvivesARestart) {
  const std::string path = ::testing::TempDir() + "/adopt" + std::to_string(getpid()) + ".db";
  ::unlink(path.c_str());
  auto store = std::move(OpenSqliteStateStore(path)).value();
  Start(2, 2, absl::Seconds(100), store.get());
  Member& a = Add("a", "n");
  Rendezvous(a, 41);
  EXPECT_FALSE(a.world.has_value());  // one of two: no world
  EXPECT_EQ(c_->GetStatus().generation, 41u);
  c_.reset();
  Start(2, 2, absl::Seconds(100), store.get());
  EXPECT_EQ(c_->GetStatus().generation, 41u);
  EXPECT_EQ(c_->GetStatus().job_state, JobState::kWaiting);
  c_.reset();  // before the store it writes to
}

TEST_F(CoordinatorTest, RestartKeepsGenerationWhenAllReattach) {
  const std::string path = ::testing::TempDir() + "/restart" + std::to_string(getpid()) + ".db";
  ::unlink(path.c_str());
  auto store = std::move(OpenSqliteStateStore(path)).value();
  Start(1, 2, absl::Seconds(100), store.get());
  Member& a = Add("a", "n");
  Member& b = Add("b", "n");
  Rendezvous(a, 0, 3);
  Rendezvous(b, 0, 3);
  uint64_t id = *c_->BeginCheckpoint(1, a.key, 3);
  ASSERT_TRUE(c_->ReportShard(id, a.key, {}).ok());
  ASSERT_TRUE(c_->ReportShard(id, b.key, {}).ok());
  c_.reset();
  store.reset();

  stores_.push_back(std::move(OpenSqliteStateStore(path)).value());
  Start(1, 2, absl::Seconds(100), stores_.back().get());
  EXPECT_EQ(c_->GetStatus().job_state, JobState::kRecovering);
  EXPECT_EQ(c_->ListCheckpoints(false).size(), 1u);
  Member& a2 = Add("a", "n");  // same incarnation
  EXPECT_EQ(c_->GetStatus().job_state, JobState::kRecovering);
  Member& b2 = Add("b", "n");
  auto s = c_->GetStatus();
  EXPECT_EQ(s.job_state, JobState::kRunning);
  EXPECT_EQ(s.generation, 1u);
  EXPECT_EQ(s.world_size, 2u);
  EXPECT_TRUE(a2.sink->events.empty());
  EXPECT_TRUE(b2.sink->events.empty());
  EXPECT_TRUE(c_->KvSet(1, "k", "v").ok());  // generation 1 is still live
}

// A muster-agent reopens its trainers' sessions after a restart without
// joining them again: a member of the stored world may attach as it was; a
// stranger, or another incarnation, is still told to join.
TEST_F(CoordinatorTest, AfterARestartTheStoredWorldsMembersReattachByOpeningASession) {
  RestartWithAStoredWorld("reopen", "m");
  if (HasFatalFailure()) return;
  auto sink = std::make_shared<RecordingSink>();
  EXPECT_EQ(c_->OpenSession({"c", 1}, sink).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(c_->OpenSession({"a", 2}, sink).status().code(), absl::StatusCode::kNotFound);
  // A node session from another node is no way back either.
  EXPECT_EQ(c_->OpenSession({"a", 1}, sink, "m").status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(c_->OpenSession({"a", 1}, sink, "n").ok());
  EXPECT_EQ(c_->GetStatus().job_state, JobState::kRecovering);
  ASSERT_TRUE(c_->OpenSession({"b", 1}, std::make_shared<RecordingSink>(), "m").ok());
  const StatusSnapshot s = c_->GetStatus();
  EXPECT_EQ(s.job_state, JobState::kRunning);
  EXPECT_EQ(s.generation, 1u);
  EXPECT_EQ(s.world_size, 2u);
  for (const MemberRow& row : s.members) EXPECT_EQ(row.info.state, MemberState::kActive);
  EXPECT_TRUE(sink->events.empty());
}

// After a takeover a member's first call may be a checkpoint, before its
// session reopened: a member of the stored world is known from it.
TEST_F(CoordinatorTest, AfterARestartAStoredMembersFirstCallMayComeBeforeItsSession) {
  RestartWithAStoredWorld("first", "n");
  if (HasFatalFailure()) return;
  absl::StatusOr<uint64_t> id = c_->BeginCheckpoint(1, {"a", 1}, 160);
  EXPECT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(c_->BeginCheckpoint(1, {"stranger", 1}, 160).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(CoordinatorTest, RestartGraceExpiresWithoutAMember) {
  const std::string path = ::testing::TempDir() + "/grace" + std::to_string(getpid()) + ".db";
  ::unlink(path.c_str());
  stores_.push_back(std::move(OpenSqliteStateStore(path)).value());
  StateStore* store = stores_.back().get();
  Start(1, 2, absl::Seconds(100), store);
  Member& a = Add("a", "n");
  Member& b = Add("b", "n");
  Rendezvous(a, 0);
  Rendezvous(b, 0);
  c_.reset();
  Start(1, 2, absl::Seconds(100), store);
  Member& a2 = Add("a", "n");
  Advance(absl::Seconds(5));
  ASSERT_TRUE(c_->Heartbeat(a2.session, {1}).ok());
  Advance(absl::Seconds(5));
  ASSERT_EQ(a2.sink->events.size(), 1u);
  EXPECT_TRUE(a2.sink->events[0].abort);
  EXPECT_EQ(a2.sink->events[0].generation, 2u);
  EXPECT_EQ(c_->GetStatus().world_size, 1u);
}

TEST_F(CoordinatorTest, ShutdownStopsEveryone) {
  Start(2, 4);
  Member& a = Add("a", "n");
  Rendezvous(a, 0);
  EXPECT_TRUE(c_->Shutdown("done").ok());
  EXPECT_TRUE(c_->Shutdown("again").ok()) << "a second Shutdown is a no-op";
  ASSERT_TRUE(a.world.has_value());
  EXPECT_EQ(a.world->status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_FALSE(a.sink->events.empty());
  EXPECT_EQ(a.sink->events.back().kind, MemberEvent::Kind::kStop);
  EXPECT_TRUE(a.sink->closed);
  JoinSpec spec;
  spec.key = {"z", 1};
  spec.node = "n";
  EXPECT_EQ(c_->Join(spec).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(HeartbeatIntervalTest, GrowsWithTheStreamsUpToAThirdOfTheTimeout) {
  CoordinatorOptions o;
  o.heartbeat_interval = absl::Seconds(1);
  o.heartbeat_timeout = absl::Seconds(60);
  o.max_heartbeat_rate = 5000;
  EXPECT_EQ(HeartbeatIntervalFor(0, o), absl::Seconds(1));
  EXPECT_EQ(HeartbeatIntervalFor(1250, o), absl::Seconds(1));
  EXPECT_EQ(HeartbeatIntervalFor(5000, o), absl::Seconds(1));
  EXPECT_EQ(HeartbeatIntervalFor(12500, o), absl::Milliseconds(2500));
  EXPECT_EQ(HeartbeatIntervalFor(10'000'000, o), absl::Seconds(20));  // a third of 60 s
  o.heartbeat_timeout = absl::Seconds(5);
  EXPECT_EQ(HeartbeatIntervalFor(12500, o), absl::Seconds(5) / 3);
  // A timeout shorter than three intervals never shortens the interval.
  o.heartbeat_timeout = absl::Seconds(2);
  EXPECT_EQ(HeartbeatIntervalFor(12500, o), absl::Seconds(1));
  // No bound: the configured interval whatever the streams.
  o.heartbeat_timeout = absl::Seconds(60);
  o.max_heartbeat_rate = 0;
  EXPECT_EQ(HeartbeatIntervalFor(12500, o), absl::Seconds(1));
}

}  // namespace
}  // namespace muster
