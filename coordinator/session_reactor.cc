#include "coordinator/session_reactor.h"

#include <atomic>
#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/write_batch.h"
#include "coordinator/limits.h"
#include "coordinator/proto_convert.h"
#include "rpc/peer_address.h"
#include "rpc/status.h"
#include "rpc/write_queue.h"

namespace muster {

namespace {

v1::SessionEvent ToProto(const MemberEvent& event) {
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
  return msg;
}

// The events queued for a node stream as one SessionEvent carrying them in
// its batch, in order (a batch queued before is unpacked into it).
void MergeEvents(std::deque<v1::SessionEvent>* queue) {
  v1::SessionEvent merged;
  merged.set_epoch(queue->front().epoch());
  for (v1::SessionEvent& e : *queue) {
    if (e.batch_size() == 0) {
      *merged.add_batch() = std::move(e);
      continue;
    }
    for (v1::SessionEvent& inner : *e.mutable_batch()) *merged.add_batch() = std::move(inner);
  }
  queue->clear();
  queue->push_back(std::move(merged));
}

MemberProgress Progress(int64_t step, int64_t samples, uint32_t stalled_ms, bool working,
                        const v1::MemoryBytes& memory, uint32_t age_ms = 0) {
  MemberProgress p{step, samples, absl::Milliseconds(stalled_ms), absl::Milliseconds(age_ms),
                   working};
  p.memory = {memory.parameters(), memory.gradients(),     memory.optimizer_state(),
              memory.communication(), memory.staging(), memory.transfer()};
  return p;
}

}  // namespace

// What makes writes to a node's members the same event: the shared objects
// it was made from (a regroup's MemberEvent; a delta answer's world and
// delta; a full answer's world, with the node's rank in it). Held while a
// group waits, so no address is reused meanwhile.
struct GroupKey {
  std::shared_ptr<const void> first;
  std::shared_ptr<const void> second;
  uint64_t node = 0;
  bool Same(const GroupKey& o) const {
    return first == o.first && second == o.second && node == o.node;
  }
};

// The writing half of a session: a SessionSink over the stream's write
// queue. On a node session that takes groups (NodeHello.grouped), writes
// for its members with the same key, made inside one WriteBatch one after
// the other, go out as one event naming them all. Thread-safe.
class SessionOutbox : public SessionSink, public HeldWrites {
 public:
  SessionOutbox(SessionReactor* reactor, uint64_t epoch) : queue_(reactor), epoch_(epoch) {}

  void Push(const MemberEvent& event) override { Write(ToProto(event)); }
  void Close(const absl::Status& status) override {
    absl::MutexLock lock(&mu_);
    EndGroupLocked();
    queue_.Close(status);
  }
  // A node session's: events written together leave as one (proto batch).
  void EnableBatches() { queue_.EnableMerge(MergeEvents); }
  void EnableGroups() {
    absl::MutexLock lock(&mu_);
    groups_ = true;
  }
  void Write(v1::SessionEvent msg) {
    absl::MutexLock lock(&mu_);
    EndGroupLocked();
    WriteLocked(std::move(msg));
  }
  // An event for one of a node's members (`call`: the Rendezvous call it
  // answers, if it is an answer). `make` builds it, without the member.
  void WriteFor(const std::string& member, uint64_t call, GroupKey key,
                absl::FunctionRef<v1::SessionEvent()> make) {
    absl::MutexLock lock(&mu_);
    if (group_.has_value() && group_->key.Same(key)) {
      group_->members.push_back(member);
      group_->calls.push_back(call);
      return;
    }
    EndGroupLocked();
    // A group waits for the end of the WriteBatch this thread is in (Flush)
    // or for the next write that is not of it, whichever comes first.
    if (groups_ && key.first != nullptr && WriteBatch::Hold(this)) {
      group_.emplace(Group{std::move(key), make(), {member}, {call}});
      return;
    }
    v1::SessionEvent msg = make();
    Address(&msg, member, call);
    WriteLocked(std::move(msg));
  }
  void Flush() override {
    absl::MutexLock lock(&mu_);
    EndGroupLocked();
  }
  void WriteDone(bool ok) { queue_.WriteDone(ok); }

 private:
  struct Group {
    GroupKey key;
    v1::SessionEvent msg;
    std::vector<std::string> members;
    std::vector<uint64_t> calls;
  };

  static void Address(v1::SessionEvent* msg, const std::string& member, uint64_t call) {
    msg->set_member_id(member);
    if (msg->has_rendezvous()) msg->mutable_rendezvous()->set_call(call);
  }
  void EndGroupLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!group_.has_value()) return;
    Group g = std::move(*group_);
    group_.reset();
    if (g.members.size() == 1) {
      Address(&g.msg, g.members[0], g.calls[0]);
    } else {
      for (std::string& m : g.members) g.msg.add_member_ids(std::move(m));
      if (g.msg.has_rendezvous()) {
        v1::RendezvousAnswer* answer = g.msg.mutable_rendezvous();
        answer->mutable_calls()->Add(g.calls.begin(), g.calls.end());
        // A full answer for several members of one node: each takes its
        // own assignment from the node's members it carries once.
        answer->mutable_response()->clear_self();
        answer->mutable_response()->clear_rank();
      }
    }
    WriteLocked(std::move(g.msg));
  }
  void WriteLocked(v1::SessionEvent msg) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    msg.set_epoch(epoch_);
    queue_.Write(std::move(msg));
  }

  WriteQueue<v1::SessionRequest, v1::SessionEvent, SessionReactor> queue_;
  const uint64_t epoch_;
  absl::Mutex mu_;
  bool groups_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<Group> group_ ABSL_GUARDED_BY(mu_);
};

// One member's session inside a node session: its events go out on the
// node's stream, tagged with its id; closing it tells the node and leaves
// the stream open for the others.
class NodeMemberSink : public SessionSink {
 public:
  NodeMemberSink(std::shared_ptr<SessionOutbox> outbox, MemberKey member)
      : outbox_(std::move(outbox)), member_(std::move(member)) {}

  void Push(const MemberEvent& event) override {
    if (closed_) return;
    v1::SessionEvent msg = ToProto(event);
    msg.set_member_id(member_.id);
    outbox_->Write(std::move(msg));
  }
  void PushShared(const std::shared_ptr<const MemberEvent>& event) override {
    if (closed_) return;
    outbox_->WriteFor(member_.id, 0, GroupKey{event, nullptr}, [&] { return ToProto(*event); });
  }

  void Close(const absl::Status& status) override { End(status, /*end_process=*/false); }
  void CloseHung(const absl::Status& status) override { End(status, /*end_process=*/true); }

 private:
  void End(const absl::Status& status, bool end_process) {
    if (closed_.exchange(true)) return;
    v1::SessionEvent msg;
    msg.set_member_id(member_.id);
    msg.mutable_closed()->set_code(static_cast<int>(status.code()));
    msg.mutable_closed()->set_message(std::string(status.message()));
    msg.mutable_closed()->set_incarnation(member_.incarnation);
    msg.mutable_closed()->set_end_process(end_process);
    outbox_->Write(std::move(msg));
  }

  const std::shared_ptr<SessionOutbox> outbox_;
  const MemberKey member_;
  std::atomic<bool> closed_{false};
};

SessionReactor::SessionReactor(SessionCall* call, Coordinator* coordinator, Metrics* metrics,
                               const absl::Status& auth, uint64_t epoch)
    : AsyncBidiReactor(call),
      coordinator_(coordinator),
      metrics_(metrics),
      outbox_(std::make_shared<SessionOutbox>(this, epoch)),
      relayed_(context()->client_metadata().count(kForwardedHostMetadata) > 0) {
  coordinator_->StreamOpened();
  if (!auth.ok()) {
    outbox_->Close(auth);
    return;
  }
  StartRead(&request_);
}

SessionReactor::~SessionReactor() { coordinator_->StreamClosed(); }

void SessionReactor::CloseSession(const std::string& why) {
  if (session_ != 0) coordinator_->SessionClosed(session_, why);
  session_ = 0;
  for (const auto& [id, attached] : attached_) {
    coordinator_->SessionClosed(attached.session,
                                absl::StrCat("node session of ", node_, " ", why));
  }
  attached_.clear();
}

bool SessionReactor::Handle() {
  const absl::Time start = coordinator_->options().clock->Now();
  if (session_ == 0 && node_.empty()) {
    if (request_.has_node_hello()) return OpenNode();
    if (!request_.has_hello()) {
      outbox_->Close(absl::FailedPreconditionError(
          "the first message of a session must be hello or node_hello"));
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
  if (!node_.empty()) return HandleNode(start);
  if (!request_.has_heartbeat()) {
    CloseSession("protocol error: a second hello");
    outbox_->Close(absl::InvalidArgumentError("only heartbeats may follow hello"));
    return false;
  }
  absl::StatusOr<uint64_t> generation = coordinator_->Heartbeat(
      session_, Progress(request_.heartbeat().step(), request_.heartbeat().samples(),
                         request_.heartbeat().stalled_ms(), request_.heartbeat().working(),
                         request_.heartbeat().memory()));
  if (!generation.ok()) {
    outbox_->Close(generation.status());
    return false;
  }
  Acknowledge(*generation, start);
  return true;
}

void SessionReactor::Acknowledge(uint64_t generation, absl::Time start) {
  v1::SessionEvent ack;
  ack.mutable_ack()->set_sequence(request_.heartbeat().sequence());
  ack.mutable_ack()->set_current_generation(generation);
  ack.mutable_ack()->set_heartbeat_interval_ms(
      static_cast<uint32_t>(absl::ToInt64Milliseconds(coordinator_->HeartbeatInterval())));
  outbox_->Write(std::move(ack));
  if (metrics_ != nullptr) metrics_->ObserveHeartbeat(coordinator_->options().clock->Now() - start);
}

bool SessionReactor::OpenNode() {
  const std::string& node = request_.node_hello().node();
  if (absl::Status s = CheckName("node", node, coordinator_->options().limits.max_id_bytes);
      !s.ok()) {
    outbox_->Close(s);
    return false;
  }
  node_ = node;
  if (request_.node_hello().batches()) outbox_->EnableBatches();
  if (request_.node_hello().grouped()) outbox_->EnableGroups();
  MUSTER_LOG(INFO) << "node session of " << node_ << " opened";
  return true;
}

bool SessionReactor::HandleNode(absl::Time start) {
  switch (request_.body_case()) {
    case v1::SessionRequest::kAttach: {
      const MemberKey key{request_.attach().member_id(), request_.attach().incarnation()};
      auto sink = std::make_shared<NodeMemberSink>(outbox_, key);
      absl::StatusOr<uint64_t> id = coordinator_->OpenSession(key, sink, node_);
      if (!id.ok()) {
        sink->Close(id.status());
        return true;
      }
      attached_[key.id] = Attached{key.incarnation, *id};
      return true;
    }
    case v1::SessionRequest::kDetach: {
      auto it = attached_.find(request_.detach().member().member_id());
      if (it != attached_.end() &&
          it->second.incarnation == request_.detach().member().incarnation()) {
        coordinator_->SessionClosed(it->second.session,
                                    Printable(request_.detach().reason(),
                                              coordinator_->options().limits.max_reason_bytes));
        attached_.erase(it);
      }
      return true;
    }
    case v1::SessionRequest::kHeartbeat: {
      std::vector<uint64_t> sessions;
      std::vector<MemberProgress> progress;
      std::vector<std::string> ids;
      for (const v1::MemberStep& m : request_.heartbeat().members()) {
        auto it = attached_.find(m.member_id());
        if (it == attached_.end()) continue;
        sessions.push_back(it->second.session);
        progress.push_back(Progress(m.step(), m.samples(), m.stalled_ms(), m.working(), m.memory(),
                                    m.beat_age_ms()));
        ids.push_back(m.member_id());
      }
      std::vector<bool> ok;
      const absl::StatusOr<uint64_t> generation = coordinator_->Heartbeats(sessions, progress, &ok);
      if (!generation.ok()) {
        outbox_->Close(generation.status());
        return false;
      }
      for (size_t i = 0; i < ok.size(); ++i) {
        if (!ok[i]) attached_.erase(ids[i]);  // closed by the coordinator; the node hears of it
      }
      Acknowledge(*generation, start);
      return true;
    }
    case v1::SessionRequest::kRendezvous:
      Rendezvous(start);
      return true;
    default:
      CloseSession("protocol error");
      outbox_->Close(absl::InvalidArgumentError(
          "a node session takes attach, detach, heartbeat and rendezvous after node_hello"));
      return false;
  }
}

void SessionReactor::Rendezvous(absl::Time start) {
  const v1::NodeRendezvous& call = request_.rendezvous();
  const v1::RendezvousRequest& req = call.request();
  if (req.has_broken()) {
    FlushRendezvous();  // the calls before the report come first
    ReportBroken(coordinator_, req);
  }
  // The answer goes out on the stream whenever the world forms; the outbox
  // ignores it once the stream has finished. Made with the calls that came
  // with it (FlushRendezvous).
  calls_.push_back(Coordinator::RendezvousCall{
      ToKey(req.member()), req.after_generation(), req.step(),
      absl::Milliseconds(req.timeout_ms()),
      [outbox = outbox_, metrics = metrics_, clock = coordinator_->options().clock,
       id = req.member().member_id(), n = call.call(),
       start](absl::StatusOr<RendezvousResult> result) {
        if (metrics != nullptr) {
          metrics->ObserveRpc("NodeRendezvous", result.status().code(), clock->Now() - start);
        }
        // A delta answer is the same for every member that takes it, a full
        // one for every member of the same node.
        GroupKey key;
        if (result.ok() && result->delta != nullptr) {
          key = GroupKey{result->world, result->delta};
        } else if (result.ok()) {
          key = GroupKey{result->world, nullptr,
                         1 + uint64_t{result->world->members[result->rank].node_rank}};
        }
        outbox->WriteFor(id, n, std::move(key), [&] {
          v1::SessionEvent msg;
          v1::RendezvousAnswer* answer = msg.mutable_rendezvous();
          answer->set_code(static_cast<int>(result.status().code()));
          answer->set_message(std::string(result.status().message()));
          if (result.ok()) ToProto(*result, answer->mutable_response());
          return msg;
        });
      },
      req.takes_delta()});
}

void SessionReactor::OnReadDone(bool ok) {
  if (!ok) {
    // Through a relay: failed or held in OnDone, once the call has ended.
    if (relayed_) {
      read_ended_ = true;
    } else {
      CloseSession("stream ended");
    }
    outbox_->Close(absl::OkStatus());
    return;
  }
  coordinator_->Heard();
  if (request_.batch_size() > 0 && !node_.empty()) {
    // A node's requests sent as one message: each in order, as if alone.
    google::protobuf::RepeatedPtrField<v1::SessionRequest> batch;
    batch.Swap(request_.mutable_batch());
    for (v1::SessionRequest& r : batch) {
      request_ = std::move(r);
      // The members' Rendezvous calls together, as they came between the
      // other requests.
      if (request_.body_case() != v1::SessionRequest::kRendezvous) FlushRendezvous();
      if (!Handle()) {  // a batch inside a batch is refused as any unknown body
        FlushRendezvous();
        return;
      }
    }
    FlushRendezvous();
  } else {
    const bool open = Handle();
    FlushRendezvous();
    if (!open) return;
  }
  StartRead(&request_);
}

void SessionReactor::FlushRendezvous() {
  if (calls_.empty()) return;
  std::vector<Coordinator::RendezvousCall> calls;
  calls.swap(calls_);
  coordinator_->RendezvousAll(std::move(calls));
}

void SessionReactor::OnWriteDone(bool ok) { outbox_->WriteDone(ok); }

void SessionReactor::OnDone() {
  if (read_ended_) {
    if (context()->IsCancelled()) {
      LoseSession();
    } else {
      CloseSession("stream ended");
    }
  }
  delete this;
}

void SessionReactor::LoseSession() {
  if (session_ == 0 && attached_.empty()) return;
  MUSTER_LOG(WARNING) << (node_.empty() ? std::string("a member's session")
                                        : absl::StrCat("node session of ", node_))
                      << " was lost between its relay and the coordinator; its "
                      << (session_ != 0 ? 1 : attached_.size())
                      << " member(s) are held until they reattach or the heartbeat timeout";
  if (session_ != 0) coordinator_->SessionLost(session_);
  session_ = 0;
  for (const auto& [id, attached] : attached_) coordinator_->SessionLost(attached.session);
  attached_.clear();
}

void ReportBroken(Coordinator* coordinator, const v1::RendezvousRequest& request) {
  const absl::Status s =
      coordinator->ReportBroken(ToKey(request.member()), FromProto(request.broken()));
  if (!s.ok() && !absl::IsAborted(s)) {
    MUSTER_LOG(INFO) << "broken-world report of " << request.member().member_id()
                     << " not acted on: " << s;
  }
}

}  // namespace muster
