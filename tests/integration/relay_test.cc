// muster-relay between clients and the real muster-coordinator, all as
// processes: calls pass with their statuses and tokens, waiting ones too; a
// member that joins through a relay is reached at its own host, not the
// relay's; a session the relay loses is held for its member, and one whose
// member goes away fails at once, as without a relay.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "muster/v1/coordinator.grpc.pb.h"
#include "rpc/credentials.h"
#include "tests/integration/subprocess.h"
#include "tests/integration/test_member.h"

namespace muster {
namespace {

const std::string kBin = MUSTER_BIN_DIR;
constexpr char kToken[] = "relay-test-token";

class RelayTest : public ::testing::Test {
 public:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/relay" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::system(("rm -rf " + dir_ + " && mkdir -p " + dir_).c_str());
    token_file_ = dir_ + "/token";
    std::ofstream(token_file_) << kToken << "\n";
    ::chmod(token_file_.c_str(), 0600);
    coordinator_ = absl::StrCat("127.0.0.1:", FreeLoopbackPort());
    // The relay listens on IPv6 loopback and reaches the coordinator on
    // IPv4: the coordinator sees its callers at ::1 only through the relay.
    relay_ = absl::StrCat("[::1]:", FreeLoopbackPort());
    procs_.Add(SpawnLogged({kBin + "/muster-coordinator", "--listen=" + coordinator_,
                            "--token-file=" + token_file_, "--min-members=1",
                            "--max-members=2", "--last-call=100ms",
                            "--heartbeat-interval=100ms", "--heartbeat-timeout=20s"},
                           dir_ + "/coordinator.log"));
    ASSERT_TRUE(Up(coordinator_)) << Log("coordinator");
  }

  pid_t StartRelay(const std::vector<std::string>& extra = {}) {
    std::vector<std::string> argv = {kBin + "/muster-relay", "--listen=" + relay_,
                                     "--coordinator=" + coordinator_};
    argv.insert(argv.end(), extra.begin(), extra.end());
    const pid_t pid = procs_.Add(SpawnLogged(argv, dir_ + "/relay.log"));
    EXPECT_TRUE(Up(relay_)) << Log("relay");
    return pid;
  }

  // Until GetStatus through `target` answers.
  bool Up(const std::string& target) {
    for (int i = 0; i < 100; ++i) {
      // A connection of its own each time: not one that gRPC holds back
      // after the failed tries before the process listened.
      auto stub = v1::Coordinator::NewStub(*MakeChannel(target, {}, i));
      v1::GetStatusResponse resp;
      if (stub->GetStatus(Context().get(), v1::GetStatusRequest(), &resp).ok()) return true;
      absl::SleepFor(absl::Milliseconds(100));
    }
    return false;
  }

  std::unique_ptr<v1::Coordinator::Stub> Stub(const std::string& target) {
    return v1::Coordinator::NewStub(*MakeChannel(target, {}));
  }
  static std::unique_ptr<grpc::ClientContext> Context(
      const std::string& token = kToken, absl::Duration timeout = absl::Seconds(10)) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    AttachToken(ctx.get(), token);
    ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    return ctx;
  }
  std::string Log(const std::string& name) { return ReadText(dir_ + "/" + name + ".log"); }

  // Until the coordinator's log holds `text`.
  bool WaitForLog(const std::string& text, absl::Duration timeout) {
    const absl::Time end = absl::Now() + timeout;
    while (absl::Now() < end) {
      if (Log("coordinator").find(text) != std::string::npos) return true;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return false;
  }

  std::string dir_, token_file_, coordinator_, relay_;
  KillOnExit procs_;
};

TEST_F(RelayTest, AMemberThatJoinsThroughARelayIsReachedAtItsOwnHost) {
  StartRelay();
  auto stub = Stub(relay_);
  v1::JoinRequest join;
  join.mutable_member()->set_member_id("n/0");
  join.mutable_member()->set_incarnation(7);
  join.set_node("n");
  join.set_state_address(":4321");  // "reach me where my call comes from"
  v1::JoinResponse joined;
  grpc::Status s = stub->Join(Context().get(), join, &joined);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(joined.observed_host(), "::1");
  TestMember member(*MakeChannel(relay_, {}), kToken, "n/0", "n", 7);
  ASSERT_TRUE(member.OpenSession().ok());
  absl::StatusOr<v1::RendezvousResponse> world = member.Rendezvous(0, 0);
  ASSERT_TRUE(world.ok()) << world.status();
  EXPECT_EQ(world->self().state_address(), "[::1]:4321");
}

TEST_F(RelayTest, CallsPassWithTheirStatusesAndAWaitingCallIsAnswered) {
  StartRelay();
  auto stub = Stub(relay_);
  v1::GetStatusResponse status;
  // The coordinator's own refusal comes back as it said it.
  grpc::Status s = stub->GetStatus(Context("").get(), v1::GetStatusRequest(), &status);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(s.error_message().find("missing job token"), std::string::npos) << s.error_message();
  v1::JoinRequest bad;  // no member id
  v1::JoinResponse joined;
  s = stub->Join(Context().get(), bad, &joined);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  // A call that waits (a key not set yet) is answered through the relay
  // once the key is set straight at the coordinator.
  TestMember member(*MakeChannel(relay_, {}), kToken, "n/0", "n", 7);
  ASSERT_TRUE(member.Join().ok());
  ASSERT_TRUE(member.OpenSession().ok());
  absl::StatusOr<v1::RendezvousResponse> world = member.Rendezvous(0, 0);
  ASSERT_TRUE(world.ok()) << world.status();
  v1::KvGetRequest get;
  get.set_generation(world->world().generation());
  get.add_keys("later");
  get.set_wait_ms(20000);
  v1::KvGetResponse value;
  std::thread waiter([&] { s = stub->KvGet(Context().get(), get, &value); });
  absl::SleepFor(absl::Milliseconds(300));
  v1::KvSetRequest set;
  set.set_generation(world->world().generation());
  set.set_key("later");
  set.set_value("v");
  v1::KvSetResponse done;
  EXPECT_TRUE(Stub(coordinator_)->KvSet(Context().get(), set, &done).ok());
  waiter.join();
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(value.values_size(), 1);
  EXPECT_EQ(value.values(0), "v");
}

TEST_F(RelayTest, ARelayWithTheTokenRefusesCallsWithoutIt) {
  StartRelay({"--token-file=" + token_file_});
  auto stub = Stub(relay_);
  v1::GetStatusResponse status;
  grpc::Status s = stub->GetStatus(Context("wrong").get(), v1::GetStatusRequest(), &status);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(s.error_message().find("wrong job token"), std::string::npos) << s.error_message();
  EXPECT_TRUE(stub->GetStatus(Context().get(), v1::GetStatusRequest(), &status).ok());
}

// The relay dies (SIGKILL) or stops (SIGTERM) under a member's session: the
// coordinator holds the member, which opens its session again straight to
// the coordinator.
void HeldThroughTheRelaysEnd(RelayTest* t, int signal) {
  const pid_t relay = t->StartRelay();
  TestMember through(*MakeChannel(t->relay_, {}), kToken, "n/0", "n", 9);
  ASSERT_TRUE(through.Join().ok());
  ASSERT_TRUE(through.OpenSession().ok());
  ASSERT_TRUE(through.Rendezvous(0, 0).ok());
  ASSERT_EQ(::kill(relay, signal), 0);
  ASSERT_TRUE(t->WaitForLog("lost between its relay and the coordinator", absl::Seconds(10)))
      << t->Log("coordinator");
  TestMember direct(*MakeChannel(t->coordinator_, {}), kToken, "n/0", "n", 9);
  ASSERT_TRUE(direct.OpenSession().ok());
  absl::SleepFor(absl::Milliseconds(500));  // heartbeats go on, straight
  EXPECT_GT(direct.acks(), 0);
  const std::string log = t->Log("coordinator");
  EXPECT_EQ(log.find("fail: n/0"), std::string::npos) << log;
  v1::GetStatusResponse status;
  ASSERT_TRUE(t->Stub(t->coordinator_)->GetStatus(t->Context().get(), {}, &status).ok());
  EXPECT_EQ(status.generation(), 1u) << status.DebugString();
}

TEST_F(RelayTest, ASessionLostWithItsRelayIsHeldUntilItsMemberReattaches) {
  HeldThroughTheRelaysEnd(this, SIGKILL);
}

TEST_F(RelayTest, ARelayThatStopsLeavesItsSessionsHeld) {
  HeldThroughTheRelaysEnd(this, SIGTERM);
}

// The member's own end of the stream goes away behind a live relay (a
// killed process): the relay half-closes, and the coordinator fails the
// member at once, not after its 20 s heartbeat timeout.
TEST_F(RelayTest, AMemberThatGoesAwayBehindARelayFailsAtOnce) {
  StartRelay();
  TestMember through(*MakeChannel(relay_, {}), kToken, "n/0", "n", 9);
  ASSERT_TRUE(through.Join().ok());
  ASSERT_TRUE(through.OpenSession().ok());
  ASSERT_TRUE(through.Rendezvous(0, 0).ok());
  through.BreakSession();
  EXPECT_TRUE(WaitForLog("fail: n/0", absl::Seconds(5))) << Log("coordinator");
  EXPECT_EQ(Log("coordinator").find("lost between its relay"), std::string::npos);
}

}  // namespace
}  // namespace muster
