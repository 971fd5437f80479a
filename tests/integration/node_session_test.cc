// muster-agent's node session (agent/node_session.h) against the
// real coordinator service over real gRPC: trainers' clients reach the
// coordinator's session and Rendezvous through the agent's Unix socket.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "absl/time/clock.h"
#include "coordinator/server.h"
#include "muster/v1/coordinator.grpc.pb.h"
#include "rpc/credentials.h"
#include "tests/integration/subprocess.h"
#include "agent/node_session.h"
#include "trainer/client/coordinator_client.h"

namespace muster {
namespace {

constexpr char kToken[] = "node-session-token";

// Trainer `local_rank` of node n0, whose session goes through `agent`.
ClientOptions TrainerOptions(const std::string& target, const std::string& agent,
                             int local_rank) {
  ClientOptions c;
  c.target = target;
  c.token = kToken;
  c.member_id = absl::StrCat("n0/", local_rank);
  c.incarnation = 1 + local_rank;
  c.node = "n0";
  c.local_rank = local_rank;
  c.session_via = agent;
  c.clock = RealClock::Get();
  return c;
}

class NodeSessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions o;
    o.token = kToken;
    o.coordinator.rules.min_members = 2;
    o.coordinator.rules.max_members = 2;
    o.coordinator.heartbeat_interval = absl::Milliseconds(100);
    o.coordinator.heartbeat_timeout = absl::Seconds(5);
    server_ = std::move(CoordinatorServer::Start(o)).value();
    target_ = absl::StrCat("127.0.0.1:", server_->port());
    NodeSessionOptions n;
    n.clock = RealClock::Get();
    n.coordinator = target_;
    n.token = kToken;
    n.node = "n0";
    n.runtime_dir = ::testing::TempDir();
    agent_ = std::move(NodeSession::Start(n)).value();
  }

  ClientOptions Options(int local_rank) {
    return TrainerOptions(target_, agent_->address(), local_rank);
  }

  std::unique_ptr<CoordinatorServer> server_;
  std::string target_;
  std::unique_ptr<NodeSession> agent_;
};

TEST_F(NodeSessionTest, TrainersRendezvousThroughTheAgentsNodeStream) {
  // Each trainer joins (straight to the coordinator) and opens its session
  // at the agent, which attaches it on the node's stream.
  std::vector<std::unique_ptr<CoordinatorClient>> joined;
  for (int i = 0; i < 2; ++i) {
    joined.push_back(std::move(CoordinatorClient::Create(Options(i))).value());
    ASSERT_TRUE(joined.back()->Join(0, absl::Now() + absl::Seconds(10)).ok());
    ASSERT_TRUE(joined.back()->StartSession([](const SessionNotice&) {}).ok());
  }
  // The same members, with a coordinator address nothing listens on: their
  // Rendezvous can only arrive through the agent.
  std::vector<absl::StatusOr<WorldInfo>> worlds(2, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      ClientOptions o = Options(i);
      o.target = "127.0.0.1:1";
      auto client = std::move(CoordinatorClient::Create(o)).value();
      worlds[i] = client->Rendezvous(0, 10 * i, absl::Now() + absl::Seconds(20));
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(worlds[i].ok()) << worlds[i].status();
    EXPECT_EQ(worlds[i]->world_size, 2);
    EXPECT_EQ(worlds[i]->generation, 1u);
    EXPECT_EQ(worlds[i]->local_world_size(), 2);
    EXPECT_EQ(worlds[i]->state_step, 10);  // n0/1 brought step 10
  }
  EXPECT_NE(worlds[0]->rank, worlds[1]->rank);
}

TEST_F(NodeSessionTest, AnUnknownMembersRendezvousEndsWithTheCoordinatorsError) {
  ClientOptions o = Options(0);
  o.member_id = "n0/never-joined";
  auto client = std::move(CoordinatorClient::Create(o)).value();
  absl::StatusOr<WorldInfo> w = client->Rendezvous(0, 0, absl::Now() + absl::Seconds(10));
  EXPECT_EQ(w.status().code(), absl::StatusCode::kNotFound) << w.status();
  EXPECT_NE(w.status().message().find("n0/never-joined"), std::string::npos) << w.status();
}

TEST_F(NodeSessionTest, ATrainersDeadlineEndsItsRelayedRendezvous) {
  auto client = std::move(CoordinatorClient::Create(Options(0))).value();
  ASSERT_TRUE(client->Join(0, absl::Now() + absl::Seconds(10)).ok());
  ASSERT_TRUE(client->StartSession([](const SessionNotice&) {}).ok());
  // One of two members: no world forms; the call ends at its deadline, not
  // the coordinator's join timeout.
  const absl::Time start = absl::Now();
  absl::StatusOr<WorldInfo> w = client->Rendezvous(0, 0, absl::Now() + absl::Milliseconds(500));
  EXPECT_EQ(w.status().code(), absl::StatusCode::kDeadlineExceeded) << w.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(4));
}

// While the coordinator stays away the agent retries every few hundred ms,
// but says so once, then every 30 s with a count: a job whose coordinator
// is late or down does not bury its log.
TEST(NodeSessionStartTest, AnAgentThatCannotReachItsCoordinatorSaysSoOnce) {
  NodeSessionOptions n;
  n.clock = RealClock::Get();
  n.coordinator = absl::StrCat("127.0.0.1:", FreeLoopbackPort());  // nothing listens
  n.token = kToken;
  n.node = "n0";
  n.runtime_dir = ::testing::TempDir();
  n.backoff.initial = absl::Milliseconds(20);
  n.backoff.max = absl::Milliseconds(100);
  ::testing::internal::CaptureStderr();
  {
    auto agent = std::move(NodeSession::Start(n)).value();
    absl::SleepFor(absl::Milliseconds(1500));  // a dozen tries or more
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(Occurrences(log, "reconnecting"), 1) << log;
}

// Slurm starts the coordinator and the agents together: an agent may come
// up first. Its trainers' calls then wait at the agent and go out once the
// node stream is up, instead of being refused and retried with a backoff of
// their own on top of the agent's.
TEST(NodeSessionStartTest, CallsMadeBeforeTheAgentReachesItsCoordinatorWaitForIt) {
  const std::string target = absl::StrCat("127.0.0.1:", FreeLoopbackPort());
  NodeSessionOptions n;
  n.clock = RealClock::Get();
  n.coordinator = target;  // nothing listens yet
  n.token = kToken;
  n.node = "n0";
  n.runtime_dir = ::testing::TempDir();
  n.backoff.initial = absl::Milliseconds(20);
  n.backoff.max = absl::Milliseconds(100);
  auto agent = std::move(NodeSession::Start(n)).value();
  auto channel = grpc::CreateChannel(agent->address(), grpc::InsecureChannelCredentials());
  auto stub = v1::Coordinator::NewStub(channel);

  // A session and a Rendezvous for a member the coordinator will not know:
  // each ends with the coordinator's answer, which only a held call gets.
  grpc::Status rendezvous;
  std::thread call([&] {
    grpc::ClientContext ctx;
    AttachToken(&ctx, kToken);
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    v1::RendezvousRequest req;
    req.mutable_member()->set_member_id("n0/never-joined");
    req.mutable_member()->set_incarnation(7);
    req.set_timeout_ms(20'000);
    v1::RendezvousResponse resp;
    rendezvous = stub->Rendezvous(&ctx, req, &resp);
  });
  grpc::ClientContext session_ctx;
  AttachToken(&session_ctx, kToken);
  session_ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  auto session = stub->Session(&session_ctx);
  v1::SessionRequest hello;
  hello.mutable_hello()->set_member_id("n0/also-never-joined");
  hello.mutable_hello()->set_incarnation(8);
  ASSERT_TRUE(session->Write(hello));

  absl::SleepFor(absl::Milliseconds(500));  // the agent retries meanwhile
  ServerOptions o;
  o.listen = target;
  o.token = kToken;
  o.coordinator.rules.min_members = 2;
  o.coordinator.rules.max_members = 2;
  auto server = std::move(CoordinatorServer::Start(o)).value();

  call.join();
  EXPECT_EQ(rendezvous.error_code(), grpc::StatusCode::NOT_FOUND) << rendezvous.error_message();
  EXPECT_NE(rendezvous.error_message().find("n0/never-joined"), std::string::npos)
      << rendezvous.error_message();
  v1::SessionEvent event;
  while (session->Read(&event)) {
  }
  const grpc::Status ended = session->Finish();
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::NOT_FOUND) << ended.error_message();
  EXPECT_NE(ended.error_message().find("n0/also-never-joined"), std::string::npos)
      << ended.error_message();

  // And the ordinary start: two trainers that join, open their sessions
  // and rendezvous while the agent is still connecting form their world.
  server.reset();
  std::vector<absl::StatusOr<WorldInfo>> worlds(2, absl::UnknownError("not run"));
  std::vector<std::thread> trainers;
  for (int i = 0; i < 2; ++i) {
    trainers.emplace_back([&, i] {
      auto client =
          std::move(CoordinatorClient::Create(TrainerOptions(target, agent->address(), i)))
              .value();
      const absl::Time deadline = absl::Now() + absl::Seconds(30);
      absl::Status joined = client->Join(0, deadline);
      if (!joined.ok()) {
        worlds[i] = joined;
        return;
      }
      (void)client->StartSession([](const SessionNotice&) {});
      worlds[i] = client->Rendezvous(0, 0, deadline);
    });
  }
  absl::SleepFor(absl::Milliseconds(300));
  server = std::move(CoordinatorServer::Start(o)).value();
  for (auto& t : trainers) t.join();
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(worlds[i].ok()) << worlds[i].status();
    EXPECT_EQ(worlds[i]->world_size, 2);
  }
}

}  // namespace
}  // namespace muster
