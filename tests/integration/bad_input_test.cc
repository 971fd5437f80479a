// A table of bad inputs per rpc against the real service: each gets the
// documented status code, and afterwards the server still serves with its
// state unchanged.
#include <gtest/gtest.h>

#include <functional>
#include <limits>

#include "coordinator/server.h"
#include "rpc/credentials.h"
#include "tests/integration/test_member.h"

namespace muster {
namespace {

using Stub = v1::Coordinator::Stub;
using Call = std::function<grpc::Status(Stub*, grpc::ClientContext*)>;

struct BadCase {
  const char* name;
  Call call;
  grpc::StatusCode code;
};

v1::MemberRef Ref(const std::string& id, uint64_t inc) {
  v1::MemberRef r;
  r.set_member_id(id);
  r.set_incarnation(inc);
  return r;
}

template <typename Req, typename Resp>
Call Rpc(grpc::Status (Stub::*method)(grpc::ClientContext*, const Req&, Resp*), Req req) {
  return [method, req](Stub* stub, grpc::ClientContext* ctx) {
    Resp resp;
    return (stub->*method)(ctx, req, &resp);
  };
}

class BadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions o;
    o.token = "right-token";
    o.coordinator.rules.min_members = 1;
    o.coordinator.rules.max_members = 1;
    server_ = std::move(CoordinatorServer::Start(o)).value();
    channel_ = *MakeChannel("127.0.0.1:" + std::to_string(server_->port()), {});
    stub_ = v1::Coordinator::NewStub(channel_);
    member_ = std::make_unique<TestMember>(channel_, "right-token", "m0", "n0", 1);
    ASSERT_TRUE(member_->Join().ok());
    ASSERT_TRUE(member_->OpenSession().ok());
    auto r = member_->Rendezvous(0, 0);
    ASSERT_TRUE(r.ok()) << r.status();
  }

  grpc::Status Run(const Call& call, const std::string& token) {
    grpc::ClientContext ctx;
    AttachToken(&ctx, token);
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    return call(stub_.get(), &ctx);
  }

  std::unique_ptr<CoordinatorServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<Stub> stub_;
  std::unique_ptr<TestMember> member_;
};

std::vector<BadCase> Cases() {
  std::vector<BadCase> cases;
  auto join = [](const std::string& id, uint64_t inc, const std::string& node) {
    v1::JoinRequest r;
    *r.mutable_member() = Ref(id, inc);
    r.set_node(node);
    return r;
  };
  cases.push_back({"join empty id", Rpc(&Stub::Join, join("", 1, "n")),
                   grpc::StatusCode::INVALID_ARGUMENT});
  cases.push_back({"join incarnation 0", Rpc(&Stub::Join, join("x", 0, "n")),
                   grpc::StatusCode::INVALID_ARGUMENT});
  cases.push_back({"join oversized node", Rpc(&Stub::Join, join("x", 1, std::string(300, 'n'))),
                   grpc::StatusCode::INVALID_ARGUMENT});
  // A newline or an escape sequence in a name would forge log lines.
  cases.push_back({"join id with a newline",
                   Rpc(&Stub::Join, join("x\nI 12:00:00.000 coordinator.cc:1] fake", 1, "n")),
                   grpc::StatusCode::INVALID_ARGUMENT});
  cases.push_back({"join node with an ANSI escape",
                   Rpc(&Stub::Join, join("x", 1, "\x1b[2Jn")), grpc::StatusCode::INVALID_ARGUMENT});

  v1::RendezvousRequest rv;
  *rv.mutable_member() = Ref("ghost", 1);
  cases.push_back({"rendezvous unknown member", Rpc(&Stub::Rendezvous, rv),
                   grpc::StatusCode::NOT_FOUND});
  *rv.mutable_member() = Ref("m0", 99);
  cases.push_back({"rendezvous stale incarnation", Rpc(&Stub::Rendezvous, rv),
                   grpc::StatusCode::ABORTED});
  *rv.mutable_member() = Ref("m0", 1);
  rv.set_step(-5);
  rv.set_after_generation(1);
  cases.push_back({"rendezvous negative step", Rpc(&Stub::Rendezvous, rv),
                   grpc::StatusCode::INVALID_ARGUMENT});

  v1::LeaveRequest leave;
  *leave.mutable_member() = Ref("m0", 1);
  cases.push_back({"leave without reason", Rpc(&Stub::Leave, leave),
                   grpc::StatusCode::INVALID_ARGUMENT});
  v1::DrainRequest drain;
  cases.push_back({"drain empty node", Rpc(&Stub::Drain, drain),
                   grpc::StatusCode::INVALID_ARGUMENT});
  drain.set_node("nowhere");
  cases.push_back({"drain unknown node", Rpc(&Stub::Drain, drain), grpc::StatusCode::NOT_FOUND});

  v1::KvSetRequest set;
  set.set_generation(0);
  set.set_key("k");
  cases.push_back({"kv set stale generation", Rpc(&Stub::KvSet, set), grpc::StatusCode::ABORTED});
  set.set_generation(9);
  cases.push_back({"kv set future generation", Rpc(&Stub::KvSet, set),
                   grpc::StatusCode::FAILED_PRECONDITION});
  set.set_generation(1);
  set.set_key(std::string(600, 'k'));
  cases.push_back({"kv set oversized key", Rpc(&Stub::KvSet, set),
                   grpc::StatusCode::INVALID_ARGUMENT});
  set.set_key("k");
  set.set_value(std::string(2 << 20, 'v'));
  cases.push_back({"kv set 2 MiB value", Rpc(&Stub::KvSet, set),
                   grpc::StatusCode::INVALID_ARGUMENT});
  set.set_value(std::string(5 << 20, 'v'));
  cases.push_back({"kv set 5 MiB message", Rpc(&Stub::KvSet, set),
                   grpc::StatusCode::RESOURCE_EXHAUSTED});
  v1::KvGetRequest get;
  get.set_generation(1);
  cases.push_back({"kv get no keys", Rpc(&Stub::KvGet, get), grpc::StatusCode::INVALID_ARGUMENT});
  for (int i = 0; i < 65; ++i) get.add_keys("k" + std::to_string(i));
  cases.push_back({"kv get 65 keys", Rpc(&Stub::KvGet, get), grpc::StatusCode::INVALID_ARGUMENT});

  v1::BarrierRequest barrier;
  barrier.set_generation(1);
  *barrier.mutable_member() = Ref("m0", 1);
  cases.push_back({"barrier empty name", Rpc(&Stub::Barrier, barrier),
                   grpc::StatusCode::INVALID_ARGUMENT});
  barrier.set_name("b");
  *barrier.mutable_member() = Ref("ghost", 1);
  cases.push_back({"barrier unknown member", Rpc(&Stub::Barrier, barrier),
                   grpc::StatusCode::NOT_FOUND});

  v1::BeginCheckpointRequest begin;
  begin.set_generation(1);
  *begin.mutable_member() = Ref("m0", 1);
  begin.set_step(-1);
  cases.push_back({"begin negative step", Rpc(&Stub::BeginCheckpoint, begin),
                   grpc::StatusCode::INVALID_ARGUMENT});
  v1::ReportShardRequest report;
  *report.mutable_member() = Ref("m0", 1);
  report.set_checkpoint_id(12345);
  cases.push_back({"report unknown checkpoint", Rpc(&Stub::ReportShard, report),
                   grpc::StatusCode::NOT_FOUND});
  v1::AbortCheckpointRequest abort;
  *abort.mutable_member() = Ref("m0", 1);
  abort.set_checkpoint_id(777);
  cases.push_back({"abort unknown checkpoint", Rpc(&Stub::AbortCheckpoint, abort),
                   grpc::StatusCode::NOT_FOUND});
  // Free text that is stored is bounded (it went into the event log whole).
  abort.set_reason(std::string(4096, 'r'));
  cases.push_back({"abort with a 4 KiB reason", Rpc(&Stub::AbortCheckpoint, abort),
                   grpc::StatusCode::INVALID_ARGUMENT});
  abort.set_reason("disk full\nI 12:00:00.000 coordinator.cc:1] checkpoint 1 committed");
  cases.push_back({"abort with a newline in its reason", Rpc(&Stub::AbortCheckpoint, abort),
                   grpc::StatusCode::INVALID_ARGUMENT});
  // A NaN metric used to fail the store's NOT NULL constraint as
  // UNAVAILABLE, which clients retry forever.
  report.set_metric_name("val_loss");
  report.set_metric_value(std::numeric_limits<double>::quiet_NaN());
  cases.push_back({"report a NaN metric", Rpc(&Stub::ReportShard, report),
                   grpc::StatusCode::INVALID_ARGUMENT});
  report.set_metric_value(std::numeric_limits<double>::infinity());
  cases.push_back({"report an infinite metric", Rpc(&Stub::ReportShard, report),
                   grpc::StatusCode::INVALID_ARGUMENT});
  return cases;
}

TEST_F(BadInputTest, EveryRpcRejectsMissingOrWrongToken) {
  std::vector<std::pair<const char*, Call>> calls = {
      {"GetStatus", Rpc(&Stub::GetStatus, v1::GetStatusRequest())},
      {"ListCheckpoints", Rpc(&Stub::ListCheckpoints, v1::ListCheckpointsRequest())},
      {"Shutdown", Rpc(&Stub::Shutdown, v1::ShutdownRequest())},
  };
  for (const BadCase& c : Cases()) {
    // gRPC itself refuses an oversized message before any handler (and so
    // before the token check) runs.
    if (c.code != grpc::StatusCode::RESOURCE_EXHAUSTED) calls.emplace_back(c.name, c.call);
  }
  for (const auto& [name, call] : calls) {
    EXPECT_EQ(Run(call, "").error_code(), grpc::StatusCode::UNAUTHENTICATED) << name;
    EXPECT_EQ(Run(call, "wrong-token").error_code(), grpc::StatusCode::UNAUTHENTICATED) << name;
    EXPECT_EQ(Run(call, "right-token-but-longer").error_code(),
              grpc::StatusCode::UNAUTHENTICATED) << name;
  }
  // A session without the token is refused too.
  grpc::ClientContext ctx;
  auto stream = stub_->Session(&ctx);
  v1::SessionRequest hello;
  *hello.mutable_hello() = Ref("m0", 1);
  stream->Write(hello);
  v1::SessionEvent ev;
  EXPECT_FALSE(stream->Read(&ev));
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  // The shutdown without a token did nothing.
  EXPECT_FALSE(server_->coordinator()->shutting_down());
}

TEST_F(BadInputTest, EachBadInputGetsItsCodeAndChangesNothing) {
  const StatusSnapshot before = server_->coordinator()->GetStatus();
  for (const BadCase& c : Cases()) {
    grpc::Status s = Run(c.call, "right-token");
    EXPECT_EQ(s.error_code(), c.code) << c.name << ": " << s.error_message();
    EXPECT_FALSE(s.error_message().empty()) << c.name;
  }
  const StatusSnapshot after = server_->coordinator()->GetStatus();
  EXPECT_EQ(after.generation, before.generation);
  EXPECT_EQ(after.world_size, before.world_size);
  EXPECT_EQ(after.members.size(), before.members.size());
  EXPECT_EQ(after.job_state, JobState::kRunning);
  EXPECT_TRUE(server_->coordinator()->ListCheckpoints(true).empty());
  grpc::ClientContext ctx;
  AttachToken(&ctx, "right-token");
  v1::GetStatusResponse status;
  ASSERT_TRUE(stub_->GetStatus(&ctx, v1::GetStatusRequest(), &status).ok());
  EXPECT_EQ(status.job_state(), "running");
}

TEST_F(BadInputTest, SessionProtocolErrors) {
  {
    grpc::ClientContext ctx;
    AttachToken(&ctx, "right-token");
    auto stream = stub_->Session(&ctx);
    v1::SessionRequest hb;
    hb.mutable_heartbeat()->set_step(1);
    stream->Write(hb);
    v1::SessionEvent ev;
    EXPECT_FALSE(stream->Read(&ev));
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  }
  {
    grpc::ClientContext ctx;
    AttachToken(&ctx, "right-token");
    auto stream = stub_->Session(&ctx);
    v1::SessionRequest hello;
    *hello.mutable_hello() = Ref("ghost", 1);
    stream->Write(hello);
    v1::SessionEvent ev;
    EXPECT_FALSE(stream->Read(&ev));
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
  }
  EXPECT_EQ(server_->coordinator()->GetStatus().job_state, JobState::kRunning);
}

// A flood of joins from members nobody expects: every join past the limit is
// refused with RESOURCE_EXHAUSTED naming it, the job's own member is
// untouched, and the coordinator keeps answering.
TEST(JoinFloodTest, JoinsPastTheMemberLimitAreRefusedAndChangeNothing) {
  ServerOptions o;
  o.token = "t";
  o.coordinator.rules.min_members = 1;
  o.coordinator.rules.max_members = 1;
  o.coordinator.limits.max_members = 50;
  auto server = std::move(CoordinatorServer::Start(o)).value();
  auto channel = *MakeChannel("127.0.0.1:" + std::to_string(server->port()), {});
  TestMember member(channel, "t", "m0", "n0", 1);
  ASSERT_TRUE(member.Join().ok());
  ASSERT_TRUE(member.OpenSession().ok());
  ASSERT_TRUE(member.Rendezvous(0, 0).ok());
  auto stub = v1::Coordinator::NewStub(channel);
  int accepted = 0, refused = 0;
  for (int i = 0; i < 400; ++i) {
    grpc::ClientContext ctx;
    AttachToken(&ctx, "t");
    v1::JoinRequest req;
    req.mutable_member()->set_member_id("flood-" + std::to_string(i));
    req.mutable_member()->set_incarnation(1);
    req.set_node("x");
    v1::JoinResponse resp;
    const grpc::Status st = stub->Join(&ctx, req, &resp);
    if (st.ok()) {
      ++accepted;
    } else {
      ++refused;
      EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
      EXPECT_NE(st.error_message().find("50"), std::string::npos) << st.error_message();
    }
  }
  EXPECT_EQ(accepted, 49);  // the limit counts every tracked member, m0 included
  EXPECT_EQ(refused, 351);
  grpc::ClientContext ctx;
  AttachToken(&ctx, "t");
  v1::GetStatusResponse status;
  ASSERT_TRUE(stub->GetStatus(&ctx, v1::GetStatusRequest(), &status).ok());
  EXPECT_EQ(status.generation(), 1u);
  EXPECT_EQ(status.world_size(), 1u);
  EXPECT_EQ(status.members_size(), 50);
}

}  // namespace
}  // namespace muster
