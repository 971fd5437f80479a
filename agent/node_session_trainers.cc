// What the trainers send the node session (node_session_impl.h): each one's
// stream (LocalSession), their relayed Rendezvous calls, and the table of
// attached members.
#include <signal.h>
#include <sys/wait.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/node_session_impl.h"
#include "agent/supervisor.h"

namespace muster::node_session_internal {
namespace {

// How a child that has ended (and is not reaped yet) ended, or "" when it
// has not ended or is not our child.
std::string EndedChild(pid_t pid) {
  if (pid <= 0) return "";
  siginfo_t info;
  std::memset(&info, 0, sizeof(info));
  if (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0 ||
      info.si_pid != pid) {
    return "";
  }
  const bool signaled = info.si_code != CLD_EXITED;
  return ProcessEnd{signaled, info.si_status}.Describe();
}

}  // namespace

LocalSession::LocalSession(NodeSessionImpl* relay, const absl::Status& auth, pid_t pid)
    : relay_(relay), pid_(pid), out_(std::make_shared<Queue>(this)) {
  if (!auth.ok()) {
    out_->Close(auth);
    return;
  }
  StartRead(&request_);
}

void LocalSession::OnReadDone(bool ok) {
  if (!ok) {
    if (!member_.empty()) relay_->LocalEnded(member_, incarnation_, pid_);
    out_->Close(absl::OkStatus());
    return;
  }
  if (member_.empty()) {
    if (!request_.has_hello()) {
      out_->Close(absl::FailedPreconditionError("the first message of a session must be hello"));
      return;
    }
    if (absl::Status s = relay_->Attach(request_.hello(), pid_, out_); !s.ok()) {
      out_->Close(s);
      return;
    }
    member_ = request_.hello().member_id();
    incarnation_ = request_.hello().incarnation();
  } else if (request_.has_heartbeat()) {
    relay_->LocalBeat(member_, incarnation_, request_.heartbeat(), out_.get());
  } else {
    relay_->LocalEnded(member_, incarnation_, pid_);
    out_->Close(absl::InvalidArgumentError("only heartbeats may follow hello"));
    return;
  }
  StartRead(&request_);
}

void RelayedRendezvous::Start(const absl::Status& auth, const v1::RendezvousRequest& request) {
  if (!auth.ok()) {
    Fail(auth);
    return;
  }
  const uint64_t call = relay_->Relay(this, request);
  call_ = call;
  if (cancelled_ && relay_->Forget(call)) Fail(absl::CancelledError("the trainer cancelled"));
}

void RelayedRendezvous::Answer(const v1::RendezvousAnswer& answer) {
  const absl::Status status(static_cast<absl::StatusCode>(answer.code()), answer.message());
  if (status.ok()) *response_ = answer.response();
  Fail(status);
}

void RelayedRendezvous::OnCancel() {
  // The coordinator's waiter stays until the world forms or its timeout;
  // the answer then finds no call and is dropped.
  cancelled_ = true;
  const uint64_t call = call_;
  if (call != 0 && relay_->Forget(call)) Fail(absl::CancelledError("the trainer cancelled"));
}

uint64_t NodeSessionImpl::Relay(RelayedRendezvous* call, const v1::RendezvousRequest& request) {
  absl::MutexLock lock(&mu_);
  const uint64_t n = ++trainers_.last_call;
  v1::SessionRequest relayed;
  relayed.mutable_rendezvous()->set_call(n);
  *relayed.mutable_rendezvous()->mutable_request() = request;
  Call& entry = trainers_.calls[n];
  entry.call = call;
  if (connected()) {
    entry.sent = true;
    Send(std::move(relayed));
  } else {
    entry.parked = std::move(relayed);
  }
  return n;
}

bool NodeSessionImpl::Forget(uint64_t call) {
  absl::MutexLock lock(&mu_);
  return trainers_.calls.erase(call) > 0;
}

absl::Status NodeSessionImpl::Attach(const v1::MemberRef& member, pid_t pid,
                                     std::shared_ptr<Queue> out) {
  std::shared_ptr<Queue> superseded;
  {
    absl::MutexLock lock(&mu_);
    auto it = trainers_.members.find(member.member_id());
    // The coordinator closes the older session; so does the agent.
    if (it != trainers_.members.end()) superseded = std::move(it->second.out);
    // In the node heartbeat from its own first heartbeat on, which carries
    // its step.
    Member fresh;
    fresh.incarnation = member.incarnation();
    fresh.pid = pid;
    fresh.out = std::move(out);
    fresh.last_beat = absl::InfinitePast();
    fresh.attached = connected();
    trainers_.members[member.member_id()] = std::move(fresh);
    if (connected()) {
      v1::SessionRequest attach;
      *attach.mutable_attach() = member;
      Send(std::move(attach));
    }
  }
  if (superseded != nullptr) {
    superseded->Close(absl::AbortedError("superseded by a newer session of the member"));
  }
  return absl::OkStatus();
}

void NodeSessionImpl::LocalBeat(const std::string& member, uint64_t incarnation,
                                const v1::Heartbeat& beat, Queue* out) {
  v1::SessionEvent ack;
  {
    absl::MutexLock lock(&mu_);
    auto it = trainers_.members.find(member);
    if (it != trainers_.members.end() && it->second.incarnation == incarnation) {
      it->second.step = beat.step();
      it->second.samples = beat.samples();
      it->second.stalled_ms = beat.stalled_ms();
      it->second.working = beat.working();
      if (beat.has_memory()) it->second.memory = beat.memory();
      it->second.last_beat = clock_->Now();
    }
    ack.mutable_ack()->set_current_generation(link_.generation);
    if (link_.interval_heard) {
      ack.mutable_ack()->set_heartbeat_interval_ms(
          static_cast<uint32_t>(absl::ToInt64Milliseconds(link_.interval)));
    }
  }
  ack.mutable_ack()->set_sequence(beat.sequence());
  out->Write(std::move(ack));
}

void NodeSessionImpl::LocalEnded(const std::string& member, uint64_t incarnation, pid_t pid) {
  // A stream that ends because its process died: say how, if it is already
  // a zombie of ours.
  const std::string ended = EndedChild(pid);
  const std::string reason = ended.empty() ? "its session to muster-agent ended"
                                           : absl::StrCat("trainer process ", ended);
  std::shared_ptr<Queue> out;
  {
    absl::MutexLock lock(&mu_);
    auto it = trainers_.members.find(member);
    if (it == trainers_.members.end() || it->second.incarnation != incarnation) return;
    out = DetachLocked(member, reason);
  }
  out->Close(absl::AbortedError(reason));
}

void NodeSessionImpl::DetachProcess(pid_t pid, const std::string& reason) {
  std::shared_ptr<Queue> out;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, m] : trainers_.members) {
      if (m.pid == pid) {
        out = DetachLocked(id, reason);
        break;
      }
    }
  }
  if (out != nullptr) out->Close(absl::AbortedError(reason));
}

std::shared_ptr<Queue> NodeSessionImpl::DetachLocked(const std::string& id,
                                                     const std::string& reason) {
  auto it = trainers_.members.find(id);
  std::shared_ptr<Queue> out = std::move(it->second.out);
  v1::SessionRequest detach;
  detach.mutable_detach()->mutable_member()->set_member_id(id);
  detach.mutable_detach()->mutable_member()->set_incarnation(it->second.incarnation);
  detach.mutable_detach()->set_reason(
      absl::StrCat(reason, " (reported by muster-agent of node ", o_.node, ")"));
  const bool attached = it->second.attached;
  trainers_.members.erase(it);
  if (connected() && attached) Send(std::move(detach));
  return out;
}

}  // namespace muster::node_session_internal
