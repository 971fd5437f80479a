#include "tests/integration/test_member.h"

#include "rpc/credentials.h"
#include "rpc/status.h"

namespace muster {

TestMember::TestMember(std::shared_ptr<grpc::Channel> channel, std::string token,
                       std::string id, std::string node, uint64_t incarnation)
    : stub_(v1::Coordinator::NewStub(channel)),
      token_(std::move(token)),
      id_(std::move(id)),
      node_(std::move(node)),
      incarnation_(incarnation) {}

TestMember::~TestMember() {
  stop_ = true;
  if (heartbeater_.joinable()) heartbeater_.join();
  if (stream_) session_ctx_.TryCancel();
  if (reader_.joinable()) reader_.join();
}

v1::MemberRef TestMember::ref() const {
  v1::MemberRef r;
  r.set_member_id(id_);
  r.set_incarnation(incarnation_);
  return r;
}

std::unique_ptr<grpc::ClientContext> TestMember::Context(absl::Duration timeout) const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  AttachToken(ctx.get(), token_);
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return ctx;
}

absl::Status TestMember::Join() {
  v1::JoinRequest req;
  *req.mutable_member() = ref();
  req.set_node(node_);
  v1::JoinResponse resp;
  return FromGrpcStatus(stub_->Join(Context().get(), req, &resp));
}

absl::Status TestMember::OpenSession(absl::Duration interval) {
  AttachToken(&session_ctx_, token_);
  stream_ = stub_->Session(&session_ctx_);
  v1::SessionRequest hello;
  *hello.mutable_hello() = ref();
  if (!stream_->Write(hello)) return absl::UnavailableError("cannot write hello");
  reader_ = std::thread([this] { ReadLoop(); });
  heartbeater_ = std::thread([this, interval] { HeartbeatLoop(interval); });
  return absl::OkStatus();
}

void TestMember::BreakSession() {
  stop_ = true;
  session_ctx_.TryCancel();
}

void TestMember::ReadLoop() {
  v1::SessionEvent ev;
  while (stream_->Read(&ev)) {
    if (ev.has_ack()) ++acks_;
    if (ev.has_regroup()) {
      absl::MutexLock lock(&mu_);
      regroups_.push_back(ev.regroup());
    }
  }
  stop_ = true;
  grpc::Status s;
  {
    absl::MutexLock lock(&write_mu_);
    s = stream_->Finish();
  }
  absl::MutexLock lock(&mu_);
  ended_ = true;
  end_status_ = s;
}

void TestMember::HeartbeatLoop(absl::Duration interval) {
  uint64_t seq = 0;
  while (!stop_) {
    if (!paused_) {
      v1::SessionRequest hb;
      hb.mutable_heartbeat()->set_step(step_);
      hb.mutable_heartbeat()->set_sequence(++seq);
      absl::MutexLock lock(&write_mu_);
      if (!stream_->Write(hb)) return;
    }
    absl::SleepFor(interval);
  }
}

absl::StatusOr<v1::RendezvousResponse> TestMember::Rendezvous(uint64_t after, int64_t step,
                                                              absl::Duration timeout) {
  v1::RendezvousRequest req;
  *req.mutable_member() = ref();
  req.set_after_generation(after);
  req.set_step(step);
  req.set_timeout_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(timeout)));
  v1::RendezvousResponse resp;
  grpc::Status s = stub_->Rendezvous(Context(timeout + absl::Seconds(5)).get(), req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return resp;
}

absl::Status TestMember::Leave(v1::LeaveRequest::Reason reason) {
  v1::LeaveRequest req;
  *req.mutable_member() = ref();
  req.set_reason(reason);
  req.set_step(step_);
  v1::LeaveResponse resp;
  return FromGrpcStatus(stub_->Leave(Context().get(), req, &resp));
}

absl::StatusOr<v1::RegroupEvent> TestMember::WaitRegroup(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return regroups_.size() > regroups_taken_;
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout)) {
    return absl::DeadlineExceededError("no regroup event");
  }
  return regroups_[regroups_taken_++];
}

absl::StatusOr<grpc::Status> TestMember::WaitSessionEnd(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ended = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return ended_; };
  if (!mu_.AwaitWithTimeout(absl::Condition(&ended), timeout)) {
    return absl::DeadlineExceededError("session still open");
  }
  return end_status_;
}

}  // namespace muster
