#include "coordinator/session_reactor.h"

#include <deque>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "rpc/status.h"

namespace muster {

// The writing half of a session: a queue of events written one at a time.
// Thread-safe. After Close, nothing more is queued and the stream is
// finished once the queued events are written.
class SessionOutbox : public SessionSink {
 public:
  explicit SessionOutbox(SessionReactor* reactor) : reactor_(reactor) {}

  void Push(const MemberEvent& event) override {
    v1::SessionEvent msg;
    if (event.kind == MemberEvent::Kind::kStop) {
      msg.mutable_stop()->set_reason(event.reason);
    } else {
      v1::RegroupEvent* r = msg.mutable_regroup();
      r->set_generation(event.generation);
      r->set_abort(event.abort);
      r->set_leave(event.leave);
      r->set_reason(event.reason);
      r->set_paused(event.paused);
    }
    Write(std::move(msg));
  }

  void Write(v1::SessionEvent msg) {
    const v1::SessionEvent* first = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (close_pending_) return;
      queue_.push_back(std::move(msg));
      if (writing_) return;
      writing_ = true;
      first = &queue_.front();
    }
    reactor_->StartWrite(first);
  }

  void Close(const absl::Status& status) override {
    {
      absl::MutexLock lock(&mu_);
      if (close_pending_) return;
      close_pending_ = true;
      close_status_ = status;
      if (writing_) return;  // WriteDone finishes
      finished_ = true;
    }
    reactor_->Finish(ToGrpcStatus(status));
  }

  void WriteDone(bool ok) {
    const v1::SessionEvent* next = nullptr;
    absl::Status finish;
    bool do_finish = false;
    {
      absl::MutexLock lock(&mu_);
      queue_.pop_front();
      if (!ok) {
        queue_.clear();
        if (!close_pending_) {
          close_pending_ = true;
          close_status_ = absl::UnavailableError("write failed");
        }
      }
      if (!queue_.empty()) {
        next = &queue_.front();
      } else {
        writing_ = false;
        if (close_pending_ && !finished_) {
          finished_ = true;
          do_finish = true;
          finish = close_status_;
        }
      }
    }
    if (next != nullptr) {
      reactor_->StartWrite(next);
    } else if (do_finish) {
      reactor_->Finish(ToGrpcStatus(finish));
    }
  }

 private:
  // Valid until Finish has been called; never used after that.
  SessionReactor* const reactor_;
  absl::Mutex mu_;
  std::deque<v1::SessionEvent> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool close_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status close_status_ ABSL_GUARDED_BY(mu_);
};

SessionReactor::SessionReactor(Coordinator* coordinator, Metrics* metrics,
                               const absl::Status& auth)
    : coordinator_(coordinator),
      metrics_(metrics),
      outbox_(std::make_shared<SessionOutbox>(this)) {
  if (!auth.ok()) {
    outbox_->Close(auth);
    return;
  }
  StartRead(&request_);
}

SessionReactor::~SessionReactor() = default;

void SessionReactor::CloseSession(const std::string& why) {
  if (session_ != 0) coordinator_->SessionClosed(session_, why);
  session_ = 0;
}

bool SessionReactor::Handle() {
  const absl::Time start = absl::Now();
  if (session_ == 0) {
    if (!request_.has_hello()) {
      outbox_->Close(absl::FailedPreconditionError(
          "the first message of a session must be hello"));
      return false;
    }
    MemberKey key{request_.hello().member_id(), request_.hello().incarnation()};
    absl::StatusOr<uint64_t> id = coordinator_->OpenSession(key, outbox_);
    if (!id.ok()) {
      outbox_->Close(id.status());
      return false;
    }
    session_ = *id;
    return true;
  }
  if (!request_.has_heartbeat()) {
    CloseSession("protocol error: a second hello");
    outbox_->Close(absl::InvalidArgumentError("only heartbeats may follow hello"));
    return false;
  }
  absl::StatusOr<uint64_t> generation =
      coordinator_->Heartbeat(session_, request_.heartbeat().step());
  if (!generation.ok()) {
    outbox_->Close(generation.status());
    return false;
  }
  v1::SessionEvent ack;
  ack.mutable_ack()->set_sequence(request_.heartbeat().sequence());
  ack.mutable_ack()->set_current_generation(*generation);
  outbox_->Write(std::move(ack));
  if (metrics_ != nullptr) metrics_->ObserveHeartbeat(absl::Now() - start);
  return true;
}

void SessionReactor::OnReadDone(bool ok) {
  if (!ok) {
    CloseSession("stream ended");
    outbox_->Close(absl::OkStatus());
    return;
  }
  if (Handle()) StartRead(&request_);
}

void SessionReactor::OnWriteDone(bool ok) { outbox_->WriteDone(ok); }

void SessionReactor::OnDone() { delete this; }

}  // namespace muster
