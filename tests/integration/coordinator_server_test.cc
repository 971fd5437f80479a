// The real coordinator service over real gRPC on loopback, with many
// members as threads: rendezvous rounds, last call, joins during training,
// failures by stream break and by heartbeat timeout, KV waits, catalog.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <regex>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "coordinator/limits.h"
#include "coordinator/server.h"
#include "nlohmann/json.hpp"
#include "rpc/credentials.h"
#include "tests/integration/subprocess.h"
#include "tests/integration/test_member.h"

namespace muster {
namespace {

constexpr char kToken[] = "integration-token";

class ServerTest : public ::testing::Test {
 protected:
  void Start(uint32_t min, uint32_t max, absl::Duration last_call = absl::Milliseconds(200),
             absl::Duration heartbeat_timeout = absl::Milliseconds(800),
             absl::Duration pause_timeout = absl::ZeroDuration()) {
    ServerOptions o;
    o.token = kToken;
    o.coordinator.rules.min_members = min;
    o.coordinator.rules.max_members = max;
    o.coordinator.rules.last_call = last_call;
    o.coordinator.heartbeat_interval = absl::Milliseconds(100);
    o.coordinator.heartbeat_timeout = heartbeat_timeout;
    o.coordinator.pause_timeout = pause_timeout;
    o.coordinator.max_heartbeat_rate = max_heartbeat_rate_;
    o.metrics_listen = "127.0.0.1:0";
    server_ = std::move(CoordinatorServer::Start(o)).value();
    channel_ = *MakeChannel("127.0.0.1:" + std::to_string(server_->port()), {});
  }

  std::unique_ptr<TestMember> NewMember(const std::string& id, const std::string& node,
                                        uint64_t inc = 1) {
    auto m = std::make_unique<TestMember>(channel_, kToken, id, node, inc);
    EXPECT_TRUE(m->Join().ok());
    EXPECT_TRUE(m->OpenSession().ok());
    return m;
  }

  // Members a and b form a world of two; b's session breaks, and a receives
  // the regroup that leaves the job below min_members (2). Returns a.
  std::unique_ptr<TestMember> PauseATwoMemberJob(absl::StatusOr<v1::RegroupEvent>* regroup) {
    auto a = NewMember("a", "n");
    auto b = NewMember("b", "n");
    for (const auto& r : RendezvousAll({a.get(), b.get()}, 0)) EXPECT_TRUE(r.ok());
    b->BreakSession();
    *regroup = a->WaitRegroup(absl::Seconds(5));
    return a;
  }

  // Runs Rendezvous on every member concurrently; returns the responses.
  std::vector<absl::StatusOr<v1::RendezvousResponse>> RendezvousAll(
      const std::vector<TestMember*>& ms, uint64_t after) {
    std::vector<absl::StatusOr<v1::RendezvousResponse>> out(ms.size(),
                                                            absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (size_t i = 0; i < ms.size(); ++i) {
      threads.emplace_back([&, i] { out[i] = ms[i]->Rendezvous(after, 0); });
    }
    for (auto& t : threads) t.join();
    return out;
  }

  uint32_t max_heartbeat_rate_ = 5000;
  std::unique_ptr<CoordinatorServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(ServerTest, DozensOfMembersRendezvousIntoOneWorld) {
  constexpr int kMembers = 32;
  Start(kMembers, kMembers);
  std::vector<std::unique_ptr<TestMember>> owned;
  std::vector<TestMember*> ms;
  for (int i = 0; i < kMembers; ++i) {
    owned.push_back(NewMember("m" + std::to_string(i), "node" + std::to_string(i % 4)));
    ms.push_back(owned.back().get());
  }
  auto results = RendezvousAll(ms, 0);
  std::set<uint32_t> ranks;
  std::set<uint64_t> digests;
  for (size_t i = 0; i < results.size(); ++i) {
    const auto& r = results[i];
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->world().generation(), 1u);
    EXPECT_EQ(r->world().world_size(), static_cast<uint32_t>(kMembers));
    EXPECT_EQ(r->world().node_count(), 4u);
    EXPECT_EQ(r->world().node_sizes().size(), 1);
    EXPECT_EQ(r->world().node_sizes(0), 8u);
    ranks.insert(r->rank());
    digests.insert(r->world().digest());
    // Each member hears of itself and its node, not of the whole world.
    EXPECT_EQ(r->self().member().member_id(), "m" + std::to_string(i));
    EXPECT_EQ(r->self().rank(), r->rank());
    ASSERT_EQ(r->node_members_size(), 8);
    for (int l = 0; l < 8; ++l) {
      EXPECT_EQ(r->node_members(l).node(), r->self().node());
      EXPECT_EQ(r->node_members(l).local_rank(), static_cast<uint32_t>(l));
    }
    EXPECT_EQ(r->world().state_source().rank(), r->world().state_source_rank());
  }
  EXPECT_EQ(ranks.size(), static_cast<size_t>(kMembers));
  EXPECT_EQ(digests.size(), 1u);
  EXPECT_GT(ms[0]->acks(), 0);
}

TEST_F(ServerTest, GetWorldPagesThroughTheMembership) {
  constexpr int kMembers = 10;
  Start(kMembers, kMembers);
  std::vector<std::unique_ptr<TestMember>> owned;
  std::vector<TestMember*> ms;
  for (int i = 0; i < kMembers; ++i) {
    owned.push_back(NewMember("m" + std::to_string(i), "node" + std::to_string(i % 3)));
    ms.push_back(owned.back().get());
  }
  v1::GetWorldResponse none;
  EXPECT_EQ(ms[0]->stub()->GetWorld(ms[0]->Context().get(), v1::GetWorldRequest(), &none)
                .error_code(),
            grpc::StatusCode::NOT_FOUND);
  auto results = RendezvousAll(ms, 0);
  ASSERT_TRUE(results[0].ok()) << results[0].status();
  const v1::World& world = results[0]->world();
  std::vector<v1::Assignment> all;
  uint32_t next = 0;
  while (next < world.world_size()) {
    v1::GetWorldRequest req;
    req.set_start_rank(next);
    req.set_max_members(4);
    v1::GetWorldResponse page;
    grpc::Status s = ms[0]->stub()->GetWorld(ms[0]->Context().get(), req, &page);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(page.world().digest(), world.digest());
    ASSERT_LE(page.members_size(), 4);
    ASSERT_GT(page.next_rank(), next);
    for (const v1::Assignment& a : page.members()) all.push_back(a);
    next = page.next_rank();
  }
  ASSERT_EQ(all.size(), world.world_size());
  for (size_t r = 0; r < all.size(); ++r) EXPECT_EQ(all[r].rank(), r);
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(all[r->rank()].member().member_id(), r->self().member().member_id());
  }
  v1::GetWorldRequest stale;
  stale.set_generation(world.generation() + 1);
  v1::GetWorldResponse unused;
  EXPECT_EQ(ms[0]->stub()->GetWorld(ms[0]->Context().get(), stale, &unused).error_code(),
            grpc::StatusCode::NOT_FOUND);
  v1::GetWorldRequest beyond;
  beyond.set_start_rank(world.world_size() + 1);
  EXPECT_EQ(ms[0]->stub()->GetWorld(ms[0]->Context().get(), beyond, &unused).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(ServerTest, LastCallCollectsLateJoiners) {
  Start(2, 8, absl::Milliseconds(600));
  auto a = NewMember("a", "n");
  auto b = NewMember("b", "n");
  std::vector<absl::StatusOr<v1::RendezvousResponse>> r(3, absl::UnknownError(""));
  std::thread ta([&] { r[0] = a->Rendezvous(0, 0); });
  std::thread tb([&] { r[1] = b->Rendezvous(0, 0); });
  absl::SleepFor(absl::Milliseconds(200));  // inside the last call window
  auto c = NewMember("c", "n");
  r[2] = c->Rendezvous(0, 0);
  ta.join();
  tb.join();
  for (const auto& x : r) {
    ASSERT_TRUE(x.ok()) << x.status();
    EXPECT_EQ(x->world().world_size(), 3u);
    EXPECT_EQ(x->world().generation(), 1u);
  }
}

// A member whose session breaks is failed at once, not when its heartbeats
// time out: with a heartbeat timeout of 30 s the survivors hear the regroup
// well within it, with the session's close as its reason.
TEST_F(ServerTest, StreamBreakRegroupsSurvivorsWithinMilliseconds) {
  Start(3, 4, absl::Milliseconds(200), /*heartbeat_timeout=*/absl::Seconds(30));
  std::vector<std::unique_ptr<TestMember>> owned;
  std::vector<TestMember*> ms;
  for (int i = 0; i < 4; ++i) {
    owned.push_back(NewMember("m" + std::to_string(i), "n" + std::to_string(i / 2)));
    ms.push_back(owned.back().get());
  }
  for (const auto& r : RendezvousAll(ms, 0)) ASSERT_TRUE(r.ok());
  const auto killed = std::chrono::steady_clock::now();  // a duration: the monotonic clock
  ms[3]->BreakSession();
  for (int i = 0; i < 3; ++i) {
    auto ev = ms[i]->WaitRegroup(absl::Seconds(5));
    ASSERT_TRUE(ev.ok()) << ev.status();
    EXPECT_TRUE(ev->abort());
    EXPECT_EQ(ev->generation(), 2u);
    EXPECT_TRUE(absl::StrContains(ev->reason(), "session closed")) << ev->reason();
  }
  // Typically a few milliseconds; the bound leaves room for a loaded host.
  EXPECT_LT(std::chrono::steady_clock::now() - killed, std::chrono::seconds(3));
  std::vector<TestMember*> survivors(ms.begin(), ms.begin() + 3);
  for (const auto& r : RendezvousAll(survivors, 1)) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->world().world_size(), 3u);
  }
  // A replacement joins at the next step boundary (no abort).
  auto replacement = NewMember("m3", "n1", /*inc=*/2);
  absl::StatusOr<v1::RendezvousResponse> rr;
  std::thread t([&] { rr = replacement->Rendezvous(0, 0); });
  for (int i = 0; i < 3; ++i) {
    auto ev = ms[i]->WaitRegroup(absl::Seconds(5));
    ASSERT_TRUE(ev.ok()) << ev.status();
    EXPECT_FALSE(ev->abort());
  }
  for (const auto& r : RendezvousAll(survivors, 2)) ASSERT_TRUE(r.ok()) << r.status();
  t.join();
  ASSERT_TRUE(rr.ok()) << rr.status();
  EXPECT_EQ(rr->world().world_size(), 4u);
  EXPECT_EQ(rr->world().generation(), 3u);
}

// A node session: one stream carries the sessions of a node's members.
class NodeStream {
 public:
  // `batches`: the node takes SessionEvent.batch; `grouped`: it takes one
  // event for several members (both as muster-agent does).
  NodeStream(TestMember* any, const std::string& node, bool batches = false,
             bool grouped = false)
      : ctx_(any->Context(absl::Seconds(60))), stream_(any->stub()->Session(ctx_.get())) {
    v1::SessionRequest hello;
    hello.mutable_node_hello()->set_node(node);
    hello.mutable_node_hello()->set_batches(batches);
    hello.mutable_node_hello()->set_grouped(grouped);
    EXPECT_TRUE(stream_->Write(hello));
  }
  void Attach(const v1::MemberRef& ref) {
    v1::SessionRequest msg;
    *msg.mutable_attach() = ref;
    EXPECT_TRUE(stream_->Write(msg));
  }
  void Detach(const v1::MemberRef& ref, const std::string& reason) {
    v1::SessionRequest msg;
    *msg.mutable_detach()->mutable_member() = ref;
    msg.mutable_detach()->set_reason(reason);
    EXPECT_TRUE(stream_->Write(msg));
  }
  void Beat(const std::vector<std::string>& ids, uint64_t sequence) {
    v1::SessionRequest msg;
    msg.mutable_heartbeat()->set_sequence(sequence);
    for (const std::string& id : ids) {
      v1::MemberStep* m = msg.mutable_heartbeat()->add_members();
      m->set_member_id(id);
      m->set_step(5);
    }
    EXPECT_TRUE(stream_->Write(msg));
  }
  void Rendezvous(const v1::MemberRef& ref, uint64_t call, uint64_t after) {
    EXPECT_TRUE(stream_->Write(RendezvousRequest(ref, call, after)));
  }
  // Several members' calls as one message (SessionRequest.batch), call
  // numbers first_call, first_call + 1, ...
  void RendezvousBatch(const std::vector<v1::MemberRef>& refs, uint64_t first_call,
                       uint64_t after, bool takes_delta = false) {
    v1::SessionRequest msg;
    for (size_t i = 0; i < refs.size(); ++i) {
      *msg.add_batch() = RendezvousRequest(refs[i], first_call + i, after);
      msg.mutable_batch()->rbegin()->mutable_rendezvous()->mutable_request()->set_takes_delta(
          takes_delta);
    }
    EXPECT_TRUE(stream_->Write(msg));
  }
  // The next message that is not an acknowledgement alone, as it came.
  v1::SessionEvent NextMessage() {
    v1::SessionEvent ev;
    while (stream_->Read(&ev)) {
      if (!ev.has_ack()) return ev;
    }
    return ev;
  }
  // The next event that is not an acknowledgement.
  v1::SessionEvent NextEvent() {
    v1::SessionEvent ev;
    while (stream_->Read(&ev)) {
      if (!ev.has_ack()) return ev;
    }
    return ev;
  }
  v1::HeartbeatAck NextAck() {
    v1::SessionEvent ev;
    while (stream_->Read(&ev)) {
      if (ev.has_ack()) return ev.ack();
    }
    return v1::HeartbeatAck();
  }
  void Break() { ctx_->TryCancel(); }

 private:
  static v1::SessionRequest RendezvousRequest(const v1::MemberRef& ref, uint64_t call,
                                              uint64_t after) {
    v1::SessionRequest msg;
    msg.mutable_rendezvous()->set_call(call);
    *msg.mutable_rendezvous()->mutable_request()->mutable_member() = ref;
    msg.mutable_rendezvous()->mutable_request()->set_after_generation(after);
    msg.mutable_rendezvous()->mutable_request()->set_timeout_ms(10'000);
    return msg;
  }

  std::unique_ptr<grpc::ClientContext> ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::SessionRequest, v1::SessionEvent>> stream_;
};

TEST_F(ServerTest, ANodeSessionCarriesItsMembersAndFailsThemWhenItBreaks) {
  // A long heartbeat timeout: every failure below must come from the node
  // session itself.
  Start(3, 3, absl::ZeroDuration(), absl::Seconds(30));
  // Three members on node n0 without sessions of their own; one elsewhere.
  std::vector<std::unique_ptr<TestMember>> ms;
  for (int i = 0; i < 3; ++i) {
    ms.push_back(std::make_unique<TestMember>(channel_, kToken, "m" + std::to_string(i), "n0"));
    ASSERT_TRUE(ms.back()->Join().ok());
  }
  TestMember other(channel_, kToken, "x", "n1");
  ASSERT_TRUE(other.Join().ok());
  NodeStream node(ms[0].get(), "n0");
  for (const auto& m : ms) node.Attach(m->ref());
  node.Attach(other.ref());
  v1::SessionEvent refused = node.NextEvent();
  ASSERT_TRUE(refused.has_closed()) << refused.ShortDebugString();
  EXPECT_EQ(refused.member_id(), "x");
  EXPECT_EQ(refused.closed().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  // One heartbeat for the node refreshes every member it names.
  node.Beat({"m0", "m1", "m2"}, 7);
  const v1::HeartbeatAck ack = node.NextAck();
  EXPECT_EQ(ack.sequence(), 7u);
  // The period the node's agent is to keep (the coordinator's).
  EXPECT_EQ(ack.heartbeat_interval_ms(), 100u);
  for (const MemberRow& row : server_->coordinator()->GetStatus().members) {
    if (row.info.node == "n0") {
      EXPECT_EQ(row.info.step, 5) << row.info.key.id;
    }
  }
  // The members' Rendezvous calls ride on the node's stream; each answer
  // echoes its call and is tagged with its member. A member the coordinator
  // does not know is answered with the rpc's error, and the stream goes on.
  v1::MemberRef ghost;
  ghost.set_member_id("ghost");
  ghost.set_incarnation(1);
  node.Rendezvous(ghost, 99, 0);
  v1::SessionEvent unknown = node.NextEvent();
  ASSERT_TRUE(unknown.has_rendezvous()) << unknown.ShortDebugString();
  EXPECT_EQ(unknown.rendezvous().call(), 99u);
  EXPECT_EQ(unknown.member_id(), "ghost");
  EXPECT_EQ(unknown.rendezvous().code(), static_cast<int>(absl::StatusCode::kNotFound))
      << unknown.ShortDebugString();
  for (int i = 0; i < 3; ++i) node.Rendezvous(ms[i]->ref(), 10 + i, 0);
  std::set<uint32_t> ranks;
  for (int i = 0; i < 3; ++i) {
    v1::SessionEvent ev = node.NextEvent();
    ASSERT_TRUE(ev.has_rendezvous()) << ev.ShortDebugString();
    const v1::RendezvousAnswer& a = ev.rendezvous();
    ASSERT_EQ(a.code(), 0) << a.message();
    ASSERT_GE(a.call(), 10u);
    ASSERT_LT(a.call(), 13u);
    EXPECT_EQ(ev.member_id(), ms[a.call() - 10]->ref().member_id());
    EXPECT_EQ(a.response().self().member().member_id(), ev.member_id());
    EXPECT_EQ(a.response().world().world_size(), 3u);
    EXPECT_EQ(a.response().node_members_size(), 3);
    ranks.insert(a.response().rank());
  }
  EXPECT_EQ(ranks, (std::set<uint32_t>{0, 1, 2}));
  // A detached member fails at once, with the agent's reason; the others
  // hear of the regroup on the node's stream, each event tagged.
  node.Detach(ms[2]->ref(), "exited on signal 9");
  std::set<std::string> told;
  for (int i = 0; i < 2; ++i) {
    v1::SessionEvent ev = node.NextEvent();
    ASSERT_TRUE(ev.has_regroup()) << ev.ShortDebugString();
    EXPECT_TRUE(ev.regroup().abort());
    EXPECT_NE(ev.regroup().reason().find("exited on signal 9"), std::string::npos);
    told.insert(ev.member_id());
  }
  EXPECT_EQ(told, (std::set<std::string>{"m0", "m1"}));
  // The stream breaks (the node is lost): both remaining members fail.
  node.Break();
  for (int i = 0; i < 50; ++i) {
    int failed = 0;
    for (const MemberRow& row : server_->coordinator()->GetStatus().members) {
      failed += row.info.node == "n0" && row.info.state == MemberState::kFailed ? 1 : 0;
    }
    if (failed == 3) break;
    absl::SleepFor(absl::Milliseconds(20));
    ASSERT_LT(i, 49) << failed << " of 3 members failed";
  }
}

// A node that takes batches hears what one decision tells its members as
// one message: the answers of a completed rendezvous, the regroup after a
// failure. Its members' calls sent as one message are each answered.
TEST_F(ServerTest, ANodeThatTakesBatchesHearsEachDecisionAsOneMessage) {
  // The first world waits (last call) for all three; the failure regroups
  // the two left at once.
  Start(2, 3, absl::Seconds(10), absl::Seconds(30));
  std::vector<std::unique_ptr<TestMember>> ms;
  std::vector<v1::MemberRef> refs;
  for (int i = 0; i < 3; ++i) {
    ms.push_back(std::make_unique<TestMember>(channel_, kToken, "m" + std::to_string(i), "n0"));
    ASSERT_TRUE(ms.back()->Join().ok());
    refs.push_back(ms.back()->ref());
  }
  NodeStream node(ms[0].get(), "n0", /*batches=*/true);
  for (const auto& m : ms) node.Attach(m->ref());
  node.RendezvousBatch(refs, 10, 0);
  v1::SessionEvent answers = node.NextMessage();
  ASSERT_EQ(answers.batch_size(), 3) << answers.ShortDebugString();
  std::set<uint32_t> ranks;
  for (const v1::SessionEvent& ev : answers.batch()) {
    ASSERT_TRUE(ev.has_rendezvous()) << ev.ShortDebugString();
    ASSERT_EQ(ev.rendezvous().code(), 0) << ev.rendezvous().message();
    EXPECT_EQ(ev.member_id(), refs[ev.rendezvous().call() - 10].member_id());
    EXPECT_EQ(ev.epoch(), answers.epoch());
    EXPECT_EQ(ev.rendezvous().response().world().world_size(), 3u);
    ranks.insert(ev.rendezvous().response().rank());
  }
  EXPECT_EQ(ranks, (std::set<uint32_t>{0, 1, 2}));

  node.Detach(ms[2]->ref(), "exited on signal 9");
  v1::SessionEvent regroup = node.NextMessage();
  std::set<std::string> told;
  for (const v1::SessionEvent& ev : regroup.batch()) {
    if (ev.has_ack()) continue;
    ASSERT_TRUE(ev.has_regroup()) << ev.ShortDebugString();
    EXPECT_EQ(ev.regroup().generation(), 2u);
    told.insert(ev.member_id());
  }
  EXPECT_EQ(told, (std::set<std::string>{"m0", "m1"})) << regroup.ShortDebugString();
  node.RendezvousBatch({refs[0], refs[1]}, 20, 1);
  v1::SessionEvent again = node.NextMessage();
  ASSERT_EQ(again.batch_size(), 2) << again.ShortDebugString();
  for (const v1::SessionEvent& ev : again.batch()) {
    EXPECT_EQ(ev.rendezvous().response().world().world_size(), 2u) << ev.ShortDebugString();
  }
}

TEST_F(ServerTest, ANodeThatTakesGroupsHearsEachAnswerAndRegroupOnceForAllItsMembers) {
  Start(3, 4, absl::Seconds(10), absl::Seconds(30));
  std::vector<std::unique_ptr<TestMember>> ms;
  std::vector<v1::MemberRef> refs;
  for (int i = 0; i < 4; ++i) {
    ms.push_back(std::make_unique<TestMember>(channel_, kToken, "m" + std::to_string(i), "n0"));
    ASSERT_TRUE(ms.back()->Join().ok());
    refs.push_back(ms.back()->ref());
  }
  NodeStream node(ms[0].get(), "n0", /*batches=*/true, /*grouped=*/true);
  for (const auto& m : ms) node.Attach(m->ref());
  // The first world's answers in full: the node's members once, each
  // member's own assignment among them (not sent on its own).
  node.RendezvousBatch(refs, 10, 0, /*takes_delta=*/true);
  v1::SessionEvent first = node.NextMessage();
  ASSERT_TRUE(first.has_rendezvous()) << first.ShortDebugString();
  ASSERT_EQ(first.member_ids_size(), 4);
  ASSERT_EQ(first.rendezvous().calls_size(), 4);
  const v1::RendezvousResponse& full = first.rendezvous().response();
  EXPECT_FALSE(full.has_self());
  EXPECT_FALSE(full.has_delta());
  ASSERT_EQ(full.node_members_size(), 4);
  std::set<std::string> named;
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(first.member_ids(i), refs[first.rendezvous().calls(i) - 10].member_id());
    named.insert(first.member_ids(i));
  }
  std::set<std::string> assigned;
  for (const v1::Assignment& a : full.node_members()) assigned.insert(a.member().member_id());
  EXPECT_EQ(named, assigned);

  node.Detach(ms[3]->ref(), "exited on signal 9");
  v1::SessionEvent regroup = node.NextMessage();
  if (regroup.batch_size() > 0) {  // an acknowledgement may share the message
    for (const v1::SessionEvent& ev : regroup.batch()) {
      if (!ev.has_ack()) regroup = ev;
    }
  }
  ASSERT_TRUE(regroup.has_regroup()) << regroup.ShortDebugString();
  EXPECT_EQ(regroup.regroup().generation(), 2u);
  EXPECT_TRUE(regroup.member_id().empty());
  EXPECT_EQ(std::set<std::string>(regroup.member_ids().begin(), regroup.member_ids().end()),
            (std::set<std::string>{"m0", "m1", "m2"}));

  // The survivors' answers are the same delta: one event naming the three
  // members and, in the same order, their calls.
  node.RendezvousBatch({refs[0], refs[1], refs[2]}, 20, 1, /*takes_delta=*/true);
  v1::SessionEvent again = node.NextMessage();
  ASSERT_EQ(again.batch_size(), 0) << again.ShortDebugString();
  ASSERT_TRUE(again.has_rendezvous()) << again.ShortDebugString();
  const v1::RendezvousAnswer& answer = again.rendezvous();
  ASSERT_EQ(answer.code(), 0) << answer.message();
  ASSERT_EQ(again.member_ids_size(), 3);
  ASSERT_EQ(answer.calls_size(), 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(again.member_ids(i), refs[answer.calls(i) - 20].member_id());
  }
  EXPECT_TRUE(answer.response().has_delta());
  ASSERT_EQ(answer.response().delta().removed_ranks_size(), 1);
  EXPECT_EQ(answer.response().delta().removed_ranks(0), 3u);
  EXPECT_EQ(answer.response().world().world_size(), 3u);
}

TEST_F(ServerTest, MoreStreamsAreAskedToBeatLessOftenButThriceWithinTheTimeout) {
  // At most 20 beats a second; 100 ms asked of few streams, and never more
  // than 300 ms (a third of the timeout).
  max_heartbeat_rate_ = 20;
  Start(1, 8, absl::Milliseconds(200), absl::Milliseconds(900));
  TestMember any(channel_, kToken, "m", "n");
  ASSERT_TRUE(any.Join().ok());
  std::vector<std::unique_ptr<NodeStream>> nodes;
  uint64_t seq = 0;
  auto asked = [&](size_t streams) {
    while (nodes.size() < streams) {
      nodes.push_back(std::make_unique<NodeStream>(&any, "n" + std::to_string(nodes.size())));
    }
    // A stream that was answered is open (counted): the server may take
    // new streams on other threads in any order, so every one is answered
    // first, then one more beat asks.
    ++seq;
    for (size_t i = 0; i < nodes.size(); ++i) nodes[i]->Beat({}, seq);
    for (size_t i = 0; i < nodes.size(); ++i) nodes[i]->NextAck();
    nodes[0]->Beat({}, ++seq);
    return nodes[0]->NextAck().heartbeat_interval_ms();
  };
  EXPECT_EQ(asked(1), 100u);
  EXPECT_EQ(asked(4), 200u);  // 4 streams at 20 beats a second
  EXPECT_EQ(asked(8), 300u);  // 400 ms would let a silent one go past the timeout
  // Streams that end are not counted any more.
  for (size_t i = 1; i < nodes.size(); ++i) nodes[i]->Break();
  nodes.resize(1);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  uint32_t ms = 0;
  while (absl::Now() < deadline && ms != 100u) {
    nodes[0]->Beat({}, ++seq);
    ms = nodes[0]->NextAck().heartbeat_interval_ms();
  }
  EXPECT_EQ(ms, 100u);
}

TEST_F(ServerTest, BelowMinMembersTheJobPausesAndResumes) {
  Start(2, 2);
  absl::StatusOr<v1::RegroupEvent> ev;
  auto a = PauseATwoMemberJob(&ev);
  ASSERT_FALSE(HasFailure());
  ASSERT_TRUE(ev.ok());
  EXPECT_TRUE(ev->abort());
  EXPECT_EQ(ev->generation(), 1u);  // no new world: paused
  absl::StatusOr<v1::RendezvousResponse> ra;
  std::thread t([&] { ra = a->Rendezvous(1, 7); });
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(server_->coordinator()->GetStatus().job_state, JobState::kWaiting);
  auto b2 = NewMember("b", "n", /*inc=*/2);
  auto rb = b2->Rendezvous(0, 0);
  t.join();
  ASSERT_TRUE(ra.ok() && rb.ok());
  EXPECT_EQ(rb->world().generation(), 2u);
  EXPECT_EQ(rb->world().state_step(), 7);
}

TEST_F(ServerTest, AJobPausedLongerThanThePauseTimeoutEndsWithItsReason) {
  Start(2, 2, absl::Milliseconds(50), absl::Milliseconds(800), absl::Milliseconds(400));
  absl::StatusOr<v1::RegroupEvent> ev;
  auto a = PauseATwoMemberJob(&ev);
  ASSERT_FALSE(HasFailure());
  ASSERT_TRUE(ev.ok());
  ASSERT_TRUE(ev->paused());
  const absl::Time paused = absl::Now();
  // a waits for a world that cannot form; the job ends instead.
  absl::StatusOr<v1::RendezvousResponse> ra = a->Rendezvous(1, 0);
  EXPECT_EQ(ra.status().code(), absl::StatusCode::kFailedPrecondition) << ra.status();
  EXPECT_NE(ra.status().message().find("--pause-timeout"), std::string::npos) << ra.status();
  EXPECT_GE(absl::Now() - paused, absl::Milliseconds(300));
  server_->Wait();
  EXPECT_NE(server_->ended().find("below min_members (2)"), std::string::npos)
      << server_->ended();
}

TEST(ServerRebuildTest, RebuildCatalogFillsAnEmptyCatalogOnly) {
  const std::string dir = ::testing::TempDir() + "/rebuild-" + std::to_string(::getpid());
  ASSERT_EQ(std::system(("rm -rf " + dir + " && mkdir -p " + dir + "/ckpt/step-50 " + dir +
                         "/state")
                            .c_str()),
            0);
  std::ofstream(dir + "/ckpt/step-50/model.safetensors") << "0123456789";
  std::ofstream(dir + "/ckpt/step-50/manifest.json")
      << R"({"format": "muster-checkpoint-1", "step": 50, "epoch": 0, "sample_offset": 1600,)"
      << R"( "generation": 9, "world_size": 2,)"
      << R"( "files": {"model.safetensors": {"bytes": 10, "xxh3": "00000000000000ab"}}})";
  ServerOptions o;
  o.listen = "127.0.0.1:0";
  o.state_dir = dir + "/state";
  o.rebuild_catalog = dir + "/ckpt";
  {
    auto server = CoordinatorServer::Start(o);
    ASSERT_TRUE(server.ok()) << server.status();
    std::vector<CheckpointRecord> committed = (*server)->coordinator()->ListCheckpoints(false);
    ASSERT_EQ(committed.size(), 1u);
    EXPECT_EQ(committed[0].step, 50);
    // New generations come after the checkpoints' own.
    EXPECT_GE((*server)->coordinator()->GetStatus().generation, 9u);
  }
  // Never over a catalog that holds records.
  auto again = CoordinatorServer::Start(o);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition) << again.status();
  EXPECT_NE(again.status().message().find("move coordinator.db aside"), std::string::npos);
}

TEST(ServerIdleTest, SocketsThatNeverSpeakHttp2AreClosedSoon) {
  ServerOptions o;
  o.listen = "127.0.0.1:0";
  o.token = kToken;
  o.handshake_timeout = absl::Milliseconds(300);
  auto server = CoordinatorServer::Start(o);
  ASSERT_TRUE(server.ok()) << server.status();
  // Connections from anyone who can reach the port, sending nothing.
  std::vector<int> fds;
  for (int i = 0; i < 20; ++i) {
    const int fd = ConnectLoopback((*server)->port());
    ASSERT_GE(fd, 0);
    fds.push_back(fd);
  }
  // The coordinator closes each (read sees the end) well before gRPC's
  // default two minutes.
  const absl::Time start = absl::Now();
  for (int fd : fds) {
    // The server's own HTTP/2 settings come first; then the end.
    bool closed = false;
    while (!closed && absl::Now() - start < absl::Seconds(5)) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 100) != 1) continue;
      char buf[4096];
      closed = ::recv(fd, buf, sizeof(buf), 0) <= 0;
    }
    EXPECT_TRUE(closed) << "connection still open after 5 s";
    ::close(fd);
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST_F(ServerTest, TheStatusPageNeedsTheTokenAndNeverPutsItInAUrl) {
  ServerOptions o;
  o.listen = "127.0.0.1:0";
  o.token = kToken;
  o.http_listen = "127.0.0.1:" + std::to_string(FreeLoopbackPort());
  o.coordinator.rules.min_members = 2;
  o.coordinator.rules.max_members = 2;
  server_ = std::move(CoordinatorServer::Start(o)).value();
  channel_ = *MakeChannel("127.0.0.1:" + std::to_string(server_->port()), {});
  const int port = server_->http_port();
  ASSERT_GT(port, 0);
  auto a = NewMember("a", "n0");
  auto b = NewMember("b", "n1");
  for (const auto& r : RendezvousAll({a.get(), b.get()}, 0)) ASSERT_TRUE(r.ok());

  // Without the token: 401 for the data, the login form for the page.
  std::string r = HttpExchange(port, "GET /api/status HTTP/1.0\r\n\r\n");
  EXPECT_EQ(r.rfind("HTTP/1.1 401", 0), 0u) << r;
  EXPECT_EQ(r.find("\"members\""), std::string::npos) << r;
  r = HttpExchange(port, "GET / HTTP/1.0\r\n\r\n");
  EXPECT_EQ(r.rfind("HTTP/1.1 303", 0), 0u) << r;
  EXPECT_NE(r.find("Location: /login"), std::string::npos) << r;
  r = HttpExchange(port, "GET /api/status HTTP/1.0\r\nAuthorization: Bearer wrong\r\n\r\n");
  EXPECT_EQ(r.rfind("HTTP/1.1 401", 0), 0u) << r;

  // With it: the world's members, the events, the catalog.
  r = HttpExchange(port, std::string("GET /api/status HTTP/1.0\r\nAuthorization: Bearer ") + kToken +
                     "\r\n\r\n");
  EXPECT_EQ(r.rfind("HTTP/1.1 200", 0), 0u) << r;
  EXPECT_NE(r.find("\"id\":\"a\""), std::string::npos) << r;
  EXPECT_NE(r.find("\"state\":\"active\""), std::string::npos) << r;
  EXPECT_NE(r.find("\"kind\":\"complete\""), std::string::npos) << r;
  EXPECT_NE(r.find("\"world_size\":2"), std::string::npos) << r;

  // The login form posts the token in the body; the session is a cookie.
  r = HttpExchange(port, "GET /login HTTP/1.0\r\n\r\n");
  EXPECT_NE(r.find("method=\"post\""), std::string::npos) << r;
  const std::string wrong = "token=nope";
  r = HttpExchange(port, "POST /login HTTP/1.0\r\nContent-Type: application/x-www-form-urlencoded\r\n"
                 "Content-Length: " + std::to_string(wrong.size()) + "\r\n\r\n" + wrong);
  EXPECT_EQ(r.rfind("HTTP/1.1 401", 0), 0u) << r;
  EXPECT_EQ(r.find("Set-Cookie"), std::string::npos) << r;
  const std::string right = std::string("token=") + kToken;
  r = HttpExchange(port, "POST /login HTTP/1.0\r\nContent-Type: application/x-www-form-urlencoded\r\n"
                 "Content-Length: " + std::to_string(right.size()) + "\r\n\r\n" + right);
  EXPECT_EQ(r.rfind("HTTP/1.1 303", 0), 0u) << r;
  EXPECT_NE(r.find("Location: /\r\n"), std::string::npos) << r;
  EXPECT_EQ(r.find(kToken), std::string::npos) << "the token came back: " << r;
  const size_t at = r.find("Set-Cookie: muster_session=");
  ASSERT_NE(at, std::string::npos) << r;
  EXPECT_NE(r.find("HttpOnly", at), std::string::npos);
  EXPECT_NE(r.find("SameSite=Strict", at), std::string::npos);
  const size_t start = at + std::string("Set-Cookie: ").size();
  const std::string cookie = r.substr(start, r.find(';', start) - start);
  r = HttpExchange(port, "GET / HTTP/1.0\r\nCookie: " + cookie + "\r\n\r\n");
  EXPECT_EQ(r.rfind("HTTP/1.1 200", 0), 0u) << r;
  EXPECT_NE(r.find("<title>muster</title>"), std::string::npos) << r;
  r = HttpExchange(port, "GET /api/status HTTP/1.0\r\nCookie: " + cookie + "\r\n\r\n");
  EXPECT_EQ(r.rfind("HTTP/1.1 200", 0), 0u) << r;
  // Logging out ends the session.
  r = HttpExchange(port, "POST /logout HTTP/1.0\r\nCookie: " + cookie + "\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(r.rfind("HTTP/1.1 303", 0), 0u) << r;
  r = HttpExchange(port, "GET /api/status HTTP/1.0\r\nCookie: " + cookie + "\r\n\r\n");
  EXPECT_EQ(r.rfind("HTTP/1.1 401", 0), 0u) << r;
}

TEST_F(ServerTest, HeartbeatTimeoutFencesAHungMember) {
  Start(2, 3, absl::Seconds(30));
  auto a = NewMember("a", "n");
  auto b = NewMember("b", "n");
  auto c = NewMember("c", "n");
  for (const auto& r : RendezvousAll({a.get(), b.get(), c.get()}, 0)) ASSERT_TRUE(r.ok());
  const absl::Time hung = absl::Now();
  c->PauseHeartbeats();
  auto ev = a->WaitRegroup(absl::Seconds(5));
  ASSERT_TRUE(ev.ok()) << ev.status();
  EXPECT_TRUE(ev->abort());
  EXPECT_GE(absl::Now() - hung, absl::Milliseconds(700));
  EXPECT_NE(ev->reason().find("no heartbeat"), std::string::npos);
  auto end = c->WaitSessionEnd(absl::Seconds(5));
  ASSERT_TRUE(end.ok());
  EXPECT_EQ(end->error_code(), grpc::StatusCode::ABORTED);
  auto fenced = c->Rendezvous(1, 0);
  EXPECT_EQ(fenced.status().code(), absl::StatusCode::kAborted);
  for (const auto& r : RendezvousAll({a.get(), b.get()}, 1)) {
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->world().world_size(), 2u);
  }
}

TEST_F(ServerTest, JoinDuringTrainingRegroupsWithoutAbort) {
  Start(2, 4, absl::Milliseconds(100));
  auto a = NewMember("a", "n0");
  auto b = NewMember("b", "n1");
  for (const auto& r : RendezvousAll({a.get(), b.get()}, 0)) ASSERT_TRUE(r.ok());
  auto c = NewMember("c", "n1");
  absl::StatusOr<v1::RendezvousResponse> rc;
  std::thread t([&] { rc = c->Rendezvous(0, 0); });
  auto ev = a->WaitRegroup(absl::Seconds(5));
  ASSERT_TRUE(ev.ok());
  EXPECT_FALSE(ev->abort());
  for (const auto& r : RendezvousAll({a.get(), b.get()}, 1)) {
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->world().world_size(), 3u);
  }
  t.join();
  ASSERT_TRUE(rc.ok());
  EXPECT_EQ(rc->world().generation(), 2u);
}

TEST_F(ServerTest, CancelledWaitsAreReleasedAtOnceAndEachCallerHasACap) {
  Start(2, 2);
  auto a = NewMember("a", "n");
  auto b = NewMember("b", "n");
  auto rs = RendezvousAll({a.get(), b.get()}, 0);
  ASSERT_TRUE(rs[0].ok());
  v1::KvGetRequest get;
  get.set_generation(rs[0]->world().generation());
  get.add_keys("never-set");
  get.set_wait_ms(60'000);
  const int cap = Limits().max_waits_per_caller;
  struct Call {
    grpc::ClientContext ctx;
    v1::KvGetResponse resp;
    absl::Notification done;
    grpc::Status status;
  };
  auto start = [&](Call* c) {
    AttachToken(&c->ctx, kToken);
    b->stub()->async()->KvGet(&c->ctx, &get, &c->resp, [c](grpc::Status s) {
      c->status = s;
      c->done.Notify();
    });
  };
  // One connection fills its cap; the next wait is refused at once.
  std::vector<std::unique_ptr<Call>> waiting;
  for (int i = 0; i < cap; ++i) {
    waiting.push_back(std::make_unique<Call>());
    start(waiting.back().get());
  }
  absl::SleepFor(absl::Milliseconds(300));
  Call over;
  start(&over);
  ASSERT_TRUE(over.done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_EQ(over.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << over.status.error_message();
  // The client gives up on all of them: the coordinator lets them go at
  // once, not when their minute is up, and the connection may wait again.
  for (auto& c : waiting) c->ctx.TryCancel();
  for (auto& c : waiting) ASSERT_TRUE(c->done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  bool accepted = false;
  for (int i = 0; i < 50 && !accepted; ++i) {
    Call again;
    get.set_wait_ms(100);
    start(&again);
    ASSERT_TRUE(again.done.WaitForNotificationWithTimeout(absl::Seconds(5)));
    accepted = again.status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
    if (!accepted) absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_TRUE(accepted) << "cancelled waits still count against the connection's cap";
}

TEST_F(ServerTest, KvWaitBarrierAndCatalog) {
  Start(2, 2);
  auto a = NewMember("a", "n");
  auto b = NewMember("b", "n");
  auto rs = RendezvousAll({a.get(), b.get()}, 0);
  const uint64_t gen = rs[0]->world().generation();

  v1::KvGetRequest get;
  get.set_generation(gen);
  get.add_keys("unique_id");
  get.set_wait_ms(5000);
  v1::KvGetResponse got;
  grpc::Status get_status;
  std::thread waiter([&] { get_status = b->stub()->KvGet(b->Context().get(), get, &got); });
  absl::SleepFor(absl::Milliseconds(100));
  v1::KvSetRequest set;
  set.set_generation(gen);
  set.set_key("unique_id");
  set.set_value(std::string("\x00\x01\x02", 3));
  v1::KvSetResponse set_resp;
  ASSERT_TRUE(a->stub()->KvSet(a->Context().get(), set, &set_resp).ok());
  waiter.join();
  ASSERT_TRUE(get_status.ok()) << get_status.error_message();
  EXPECT_EQ(got.values(0), std::string("\x00\x01\x02", 3));

  get.set_keys(0, "never");
  get.set_wait_ms(200);
  EXPECT_EQ(b->stub()->KvGet(b->Context().get(), get, &got).error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);

  v1::BeginCheckpointRequest begin;
  begin.set_generation(gen);
  begin.set_step(10);
  v1::BeginCheckpointResponse ids[2];
  for (int i = 0; i < 2; ++i) {
    TestMember* m = i == 0 ? a.get() : b.get();
    *begin.mutable_member() = m->ref();
    ASSERT_TRUE(m->stub()->BeginCheckpoint(m->Context().get(), begin, &ids[i]).ok());
  }
  EXPECT_EQ(ids[0].checkpoint_id(), ids[1].checkpoint_id());
  for (int i = 0; i < 2; ++i) {
    TestMember* m = i == 0 ? a.get() : b.get();
    v1::ReportShardRequest rep;
    rep.set_checkpoint_id(ids[0].checkpoint_id());
    *rep.mutable_member() = m->ref();
    v1::ShardFile* f = rep.add_files();
    f->set_path("/ckpt/10/rank" + std::to_string(i) + ".safetensors");
    f->set_bytes(1000);
    f->set_checksum("00112233445566ff");
    v1::ReportShardResponse rr;
    ASSERT_TRUE(m->stub()->ReportShard(m->Context().get(), rep, &rr).ok());
    EXPECT_EQ(rr.committed(), i == 1);
  }
  v1::ListCheckpointsResponse list;
  ASSERT_TRUE(
      a->stub()->ListCheckpoints(a->Context().get(), v1::ListCheckpointsRequest(), &list).ok());
  ASSERT_EQ(list.checkpoints_size(), 1);
  EXPECT_EQ(list.checkpoints(0).total_bytes(), 2000u);
  EXPECT_EQ(list.checkpoints(0).state(), v1::Checkpoint::COMMITTED);
}

TEST_F(ServerTest, MetricsEndpointServesPrometheusText) {
  Start(1, 1);
  auto a = NewMember("a", "n");
  ASSERT_TRUE(a->Rendezvous(0, 0).ok());
  server_->metrics()->Update(server_->coordinator()->Counters());
  const std::string text = server_->metrics()->Render();
  EXPECT_NE(text.find("muster_generation 1"), std::string::npos) << text;
  EXPECT_NE(text.find("muster_rpcs_total{code=\"OK\",method=\"Rendezvous\"}"), std::string::npos);
  EXPECT_NE(text.find("muster_members{state=\"active\"} 1"), std::string::npos);
  EXPECT_GT(server_->metrics_port(), 0);
}

// The metrics the dashboard needs: world size, regroup and checkpoint
// durations, checkpoint bytes.
TEST_F(ServerTest, MetricsCarryRegroupAndCheckpointFigures) {
  Start(1, 1);
  auto a = NewMember("a", "n");
  auto world = a->Rendezvous(0, 0);
  ASSERT_TRUE(world.ok());
  v1::BeginCheckpointRequest begin;
  begin.set_generation(world->world().generation());
  begin.set_step(10);
  *begin.mutable_member() = a->ref();
  v1::BeginCheckpointResponse id;
  ASSERT_TRUE(a->stub()->BeginCheckpoint(a->Context().get(), begin, &id).ok());
  v1::ReportShardRequest rep;
  rep.set_checkpoint_id(id.checkpoint_id());
  *rep.mutable_member() = a->ref();
  v1::ShardFile* f = rep.add_files();
  f->set_path("/ckpt/10/rank0.safetensors");
  f->set_bytes(4096);
  f->set_checksum("00112233445566ff");
  v1::ReportShardResponse rr;
  ASSERT_TRUE(a->stub()->ReportShard(a->Context().get(), rep, &rr).ok());
  ASSERT_TRUE(rr.committed());
  server_->metrics()->Update(server_->coordinator()->Counters());
  server_->metrics()->Update(server_->coordinator()->Counters());  // nothing counted twice
  const std::string text = server_->metrics()->Render();
  EXPECT_NE(text.find("muster_world_size 1"), std::string::npos) << text;
  EXPECT_NE(text.find("muster_regroup_duration_seconds_count 1"), std::string::npos) << text;
  EXPECT_NE(text.find("muster_checkpoint_duration_seconds_count 1"), std::string::npos) << text;
  EXPECT_NE(text.find("muster_checkpoint_bytes_total 4096"), std::string::npos) << text;

  // Prometheus' own linter finds nothing (names, units, _total on counters,
  // HELP and TYPE lines). deploy/dev setup unpacks it into .deps/.
  const std::string promtool =
      std::string(MUSTER_SOURCE_DIR) + "/.deps/prometheus/usr/bin/promtool";
  if (::access(promtool.c_str(), X_OK) != 0) {
    GTEST_SKIP() << "no promtool (deploy/dev setup unpacks it into .deps/)";
  }
  const std::string path = ::testing::TempDir() + "/metrics" + std::to_string(::getpid()) + ".txt";
  std::ofstream(path) << text;
  int code = -1;
  const std::string lint = RunShell(promtool + " check metrics < " + path, &code);
  EXPECT_EQ(code, 0) << lint << "\n" << text;
  std::remove(path.c_str());
}

// deploy/grafana/muster.json queries only metrics the coordinator exports.
TEST_F(ServerTest, TheGrafanaDashboardQueriesOnlyExportedMetrics) {
  Start(1, 1);
  auto a = NewMember("a", "n");
  ASSERT_TRUE(a->Rendezvous(0, 0).ok());
  server_->metrics()->Update(server_->coordinator()->Counters());
  const std::string text = server_->metrics()->Render();
  std::ifstream in(std::string(MUSTER_SOURCE_DIR) + "/deploy/grafana/muster.json");
  ASSERT_TRUE(in) << "deploy/grafana/muster.json is missing";
  const nlohmann::json dashboard = nlohmann::json::parse(in);
  ASSERT_TRUE(dashboard.contains("panels"));
  std::set<std::string> queried;
  int exprs = 0;
  const std::regex metric("muster_[a-z0-9_]+");
  for (const auto& panel : dashboard["panels"]) {
    for (const auto& target : panel["targets"]) {
      const std::string expr = target["expr"].get<std::string>();
      ++exprs;
      for (auto it = std::sregex_iterator(expr.begin(), expr.end(), metric);
           it != std::sregex_iterator(); ++it) {
        std::string name = it->str();
        for (const char* suffix : {"_bucket", "_sum", "_count"}) {
          if (absl::EndsWith(name, suffix)) name.resize(name.size() - std::strlen(suffix));
        }
        queried.insert(name);
      }
    }
  }
  EXPECT_GE(exprs, 10);
  // What the issue asks the dashboard to show.
  for (const char* needed : {"muster_world_size", "muster_generation", "muster_step",
                             "muster_regroup_duration_seconds", "muster_heartbeat_latency_seconds",
                             "muster_checkpoint_duration_seconds", "muster_checkpoint_bytes_total"}) {
    EXPECT_EQ(queried.count(needed), 1u) << needed << " is not on the dashboard";
  }
  for (const std::string& name : queried) {
    EXPECT_NE(text.find("# TYPE " + name + " "), std::string::npos)
        << name << " is queried but not exported";
  }
}

}  // namespace
}  // namespace muster
