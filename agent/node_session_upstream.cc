// The node session's one connection to the coordinator: connecting with
// backoff, the handshake, the node heartbeat that gathers the members'
// beats, and routing what the coordinator says to the trainers.
#include <signal.h>

#include <algorithm>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/backoff.h"
#include "common/logging.h"
#include "common/session_liveness.h"
#include "common/monotonic_wait.h"
#include "rpc/credentials.h"
#include "agent/node_session_impl.h"

namespace muster::node_session_internal {

void NodeSessionImpl::Send(v1::SessionRequest request) {
  if (outgoing_.empty()) outgoing_since_ = clock_->Now();
  outgoing_.push_back(std::move(request));
}

bool NodeSessionImpl::HoldForRendezvous(absl::Time now) const {
  if (now - outgoing_since_ >= kRendezvousHold) return false;
  for (const v1::SessionRequest& r : outgoing_) {
    if (!r.has_rendezvous()) return false;
  }
  size_t attached = 0;
  for (const auto& [id, m] : members_) attached += m.attached ? 1 : 0;
  return rendezvous_.size() < attached;
}

void NodeSessionImpl::SendParkedLocked() {
  // Attaches first: the coordinator then knows each session before the
  // calls of its member.
  for (auto& [id, m] : members_) {
    if (m.attached) continue;
    m.attached = true;
    v1::SessionRequest attach;
    attach.mutable_attach()->set_member_id(id);
    attach.mutable_attach()->set_incarnation(m.incarnation);
    Send(std::move(attach));
  }
  for (auto& [n, c] : rendezvous_) {
    if (c.sent) continue;
    c.sent = true;
    Send(std::move(c.parked));
    c.parked.Clear();
  }
}

namespace {

// A full answer for several members of a node names each one's assignment
// only among the node's members: copies it to `self` and `rank` for member
// `id`. False (logged) when the answer does not name it.
bool OwnAssignment(const std::string& id, v1::RendezvousResponse* r) {
  for (const v1::Assignment& a : r->node_members()) {
    if (a.member().member_id() != id) continue;
    *r->mutable_self() = a;
    r->set_rank(a.rank());
    return true;
  }
  MUSTER_LOG(WARNING) << "muster-agent: dropped an answer for " << id
                      << " that names no assignment of it";
  return false;
}

}  // namespace

void NodeSessionImpl::RouteToEach(const v1::SessionEvent& event) {
  const bool answer = event.has_rendezvous();
  if (answer && event.rendezvous().calls_size() != event.member_ids_size()) {
    MUSTER_LOG(WARNING) << "muster-agent: dropped an answer for " << event.member_ids_size()
                        << " members that names " << event.rendezvous().calls_size() << " calls";
    return;
  }
  const v1::RendezvousResponse& response = event.rendezvous().response();
  const bool full = answer && event.rendezvous().code() == 0 && !response.has_delta() &&
                    !response.has_self();
  v1::SessionEvent each = event;
  each.clear_member_ids();
  if (answer) each.mutable_rendezvous()->clear_calls();
  for (int i = 0; i < event.member_ids_size(); ++i) {
    each.set_member_id(event.member_ids(i));
    if (answer) each.mutable_rendezvous()->set_call(event.rendezvous().calls(i));
    if (full && !OwnAssignment(event.member_ids(i),
                               each.mutable_rendezvous()->mutable_response())) {
      continue;
    }
    Route(each);
  }
}

void NodeSessionImpl::Route(v1::SessionEvent event) {
  if (event.batch_size() > 0) {  // several members' events in one message
    for (v1::SessionEvent& e : *event.mutable_batch()) Route(std::move(e));
    return;
  }
  if (event.member_ids_size() > 0) return RouteToEach(event);  // one for several members
  std::shared_ptr<Queue> out;
  absl::Status close;
  bool closing = false;
  pid_t hung = 0;
  {
    absl::MutexLock lock(&mu_);
    if (event.epoch() < epoch_) {
      // Not counted as word from the coordinator either: the liveness
      // check then drops a stream to a fenced one.
      MUSTER_LOG(WARNING) << "muster-agent: dropped an event of lease epoch " << event.epoch()
                          << " (epoch " << epoch_ << " is current)";
      return;
    }
    epoch_ = event.epoch();
    last_heard_ = clock_->Now();
  }
  if (event.has_rendezvous()) {
    RelayedRendezvous* call = nullptr;
    {
      absl::MutexLock lock(&mu_);
      auto it = rendezvous_.find(event.rendezvous().call());
      if (it == rendezvous_.end()) return;  // cancelled meanwhile
      call = it->second.call;
      rendezvous_.erase(it);
    }
    call->Answer(event.rendezvous());
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    if (event.has_ack()) {
      generation_ = std::max(generation_, event.ack().current_generation());
      if (event.ack().heartbeat_interval_ms() > 0) {
        interval_ = absl::Milliseconds(event.ack().heartbeat_interval_ms());
        interval_heard_ = true;
      }
      return;
    }
    if (event.has_regroup()) generation_ = std::max(generation_, event.regroup().generation());
    auto it = members_.find(event.member_id());
    if (it == members_.end()) return;
    if (event.has_closed()) {
      // A newer incarnation may already be attached under the same id.
      if (event.closed().incarnation() != it->second.incarnation) return;
      closing = true;
      close = absl::Status(static_cast<absl::StatusCode>(event.closed().code()),
                           event.closed().message());
      if (event.closed().end_process()) hung = it->second.pid;
      out = std::move(it->second.out);
      members_.erase(it);
    } else {
      out = it->second.out;
    }
  }
  if (closing) {
    if (hung > 0) {
      // Its session lived but its training did not come to a regroup: the
      // process is stuck (a kernel, a driver call, a deadlock). End it; the
      // supervisor restarts it as a new incarnation, which takes a live
      // peer's state.
      MUSTER_LOG(WARNING) << "muster-agent: the coordinator fenced trainer " << event.member_id()
                          << " (pid " << hung << ") as hung: " << close.message()
                          << "; killing it so that it restarts";
      ::kill(hung, SIGKILL);
    }
    out->Close(close);
    return;
  }
  event.clear_member_id();
  out->Write(std::move(event));
}

void NodeSessionImpl::ConnectLoop() {
  Backoff backoff(o_.backoff);
  // While the coordinator stays away, one line at the first failure and
  // then one every 30 s, with how many tries failed since.
  int quiet_failures = 0;
  absl::Time said = absl::InfinitePast();
  for (;;) {
    const absl::Time started = clock_->Now();
    const absl::Status ended = Connection();
    // Connection() left the link down: what went out on the ended
    // connection is dropped here once; what arrived since waits for the
    // next one (all of it, when stopping).
    std::vector<std::shared_ptr<Queue>> orphans;
    std::vector<RelayedRendezvous*> unanswered;
    bool stopping = false;
    {
      absl::MutexLock lock(&mu_);
      stopping = this->stopping();
      outgoing_.clear();
      for (auto it = members_.begin(); it != members_.end();) {
        if (!it->second.attached && !stopping) {
          ++it;
          continue;
        }
        orphans.push_back(std::move(it->second.out));
        it = members_.erase(it);
      }
      for (auto it = rendezvous_.begin(); it != rendezvous_.end();) {
        if (!it->second.sent && !stopping) {
          ++it;
          continue;
        }
        unanswered.push_back(it->second.call);
        it = rendezvous_.erase(it);
      }
    }
    // Each trainer rejoins and opens its session again, as after a
    // coordinator restart.
    const absl::Status why =
        stopping ? absl::UnavailableError("muster-agent is stopping")
                 : absl::UnavailableError(absl::StrCat(
                       "muster-agent lost its session with the coordinator: ", ended.message()));
    for (const auto& out : orphans) out->Close(why);
    // A trainer retries UNAVAILABLE until its own deadline.
    for (RelayedRendezvous* call : unanswered) call->Fail(why);
    if (stopping) return;
    if (clock_->Now() - started > absl::Seconds(10)) {
      backoff.Reset();
      quiet_failures = 0;
      said = absl::InfinitePast();
    }
    if (clock_->Now() - said >= absl::Seconds(30)) {
      MUSTER_LOG(WARNING) << "muster-agent: node " << o_.node << ": session with "
                          << o_.coordinator << " ended (" << ended << "); reconnecting"
                          << (quiet_failures > 0
                                  ? absl::StrCat(" (", quiet_failures, " more tries failed)")
                                  : std::string());
      said = clock_->Now();
      quiet_failures = 0;
    } else {
      ++quiet_failures;
    }
    const absl::Duration wait = backoff.Next();
    absl::MutexLock lock(&mu_);
    // Stopping: the next Connection() ends at once and the waiting calls
    // are finished above.
    auto halted = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return this->stopping(); };
    AwaitFor(&mu_, absl::Condition(&halted), wait, clock_);
  }
}

absl::Status NodeSessionImpl::Connection() {
  grpc::ClientContext ctx;
  AttachToken(&ctx, o_.token);
  {
    absl::MutexLock lock(&mu_);
    if (stopping()) return absl::CancelledError("stopping");
    ctx_ = &ctx;
    epoch_ = 0;
  }
  if (coordinator_->Refresh()) {
    MUSTER_LOG(INFO) << "muster-agent: node " << o_.node << ": coordinator now at "
                     << coordinator_->address();
  }
  std::unique_ptr<v1::Coordinator::Stub> stub = v1::Coordinator::NewStub(coordinator_->get());
  std::unique_ptr<Upstream> stream = stub->Session(&ctx);
  // A coordinator that hangs may still accept the TCP connection and then
  // never answer: give up on the handshake as the write loop does on an
  // open stream (common/session_liveness.h).
  bool handshaken = false;
  std::thread handshake_watch([this, &ctx, &handshaken] {
    absl::MutexLock lock(&mu_);
    const absl::Duration limit = SilenceLimit(interval_);
    auto done = [this, &handshaken]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return handshaken || stopping();
    };
    if (!AwaitFor(&mu_, absl::Condition(&done), limit, clock_)) {
      MUSTER_LOG(WARNING) << "muster-agent: node " << o_.node << ": no answer from "
                          << coordinator_->address() << " in " << absl::FormatDuration(limit);
      coordinator_->MoveOn();  // the next address of a list, if any
      ctx.TryCancel();
    }
  });
  v1::SessionRequest hello;
  hello.mutable_node_hello()->set_node(o_.node);
  hello.mutable_node_hello()->set_batches(true);  // Route unpacks them
  hello.mutable_node_hello()->set_grouped(true);  // and copies them out
  v1::SessionRequest first_beat;  // learns the heartbeat period
  first_beat.mutable_heartbeat();
  bool ok = stream->Write(hello) && stream->Write(first_beat);
  v1::SessionEvent event;
  ok = ok && stream->Read(&event) && event.has_ack();
  {
    absl::MutexLock lock(&mu_);
    handshaken = true;
  }
  handshake_watch.join();
  if (ok) {
    Route(std::move(event));
    absl::MutexLock lock(&mu_);
    if (link_ == Link::kDown) link_ = Link::kUp;
    SendParkedLocked();
  }
  std::thread writer;
  if (ok) {
    MUSTER_LOG(INFO) << "muster-agent: node " << o_.node << ": node session open";
    writer = std::thread([this, s = stream.get()] { WriteLoop(s); });
    while (stream->Read(&event)) Route(std::move(event));
  }
  {
    absl::MutexLock lock(&mu_);
    if (link_ == Link::kUp) link_ = Link::kDown;  // the writer stops
    ctx_ = nullptr;
  }
  if (writer.joinable()) writer.join();
  return FromGrpcStatus(stream->Finish());
}

void NodeSessionImpl::WriteLoop(Upstream* stream) {
  uint64_t sequence = 0;
  absl::Time next_beat = clock_->Now();
  // The beat's time is checked at least every 10 ms, on the monotonic clock
  // (an absl timed wait would stall while the wall clock is set back).
  MutexPoker poker(&mu_, absl::Milliseconds(10));
  for (;;) {
    std::vector<v1::SessionRequest> batch;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this, &next_beat]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        const absl::Time now = clock_->Now();
        if (!up() || now >= next_beat) return true;
        return !outgoing_.empty() && !HoldForRendezvous(now);
      };
      mu_.Await(absl::Condition(&ready));
      if (!up()) return;
      batch.swap(outgoing_);
      const absl::Time now = clock_->Now();
      // A silent coordinator is hung or cut off (common/session_liveness.h).
      if (now - last_heard_ > SilenceLimit(interval_)) {
        MUSTER_LOG(WARNING) << "muster-agent: node " << o_.node << ": no word from the "
                            << "coordinator for " << absl::FormatDuration(now - last_heard_)
                            << "; reconnecting";
        if (ctx_ != nullptr) ctx_->TryCancel();
        return;
      }
      if (now >= next_beat) {
        v1::SessionRequest beat;
        beat.mutable_heartbeat()->set_sequence(++sequence);
        for (const auto& [id, m] : members_) {
          if (!m.attached || now - m.last_beat > 2 * interval_) continue;  // hung or stopped
          v1::MemberStep* step = beat.mutable_heartbeat()->add_members();
          step->set_member_id(id);
          step->set_step(m.step);
          step->set_samples(m.samples);
          step->set_stalled_ms(m.stalled_ms);
          step->set_beat_age_ms(
              static_cast<uint32_t>(absl::ToInt64Milliseconds(now - m.last_beat)));
        }
        batch.push_back(std::move(beat));
        next_beat = now + interval_;
      }
    }
    if (batch.size() == 1) {
      if (!stream->Write(batch.front())) return;
    } else if (batch.size() > 1) {  // one message: one completion at the coordinator
      v1::SessionRequest merged;
      for (v1::SessionRequest& r : batch) *merged.add_batch() = std::move(r);
      if (!stream->Write(merged)) return;
    }
  }
}

}  // namespace muster::node_session_internal
