// The node session's one connection to the coordinator, through the states
// that node_session_impl.h draws: their transitions, connecting with
// backoff, the handshake, what a broken stream drops, and the write loop
// with the node heartbeat that gathers the members' beats.
#include <memory>
#include <string>
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

bool NodeSessionImpl::EnterConnecting(grpc::ClientContext* ctx) {
  absl::MutexLock lock(&mu_);
  if (stopping()) return false;
  link_.state = NodeSessionState::kConnecting;
  link_.ctx = ctx;
  link_.epoch = 0;
  return true;
}

void NodeSessionImpl::EnterConnected() {
  absl::MutexLock lock(&mu_);
  if (link_.state == NodeSessionState::kConnecting) link_.state = NodeSessionState::kConnected;
  SendParkedLocked();
}

void NodeSessionImpl::EnterBackingOff() {
  absl::MutexLock lock(&mu_);
  if (!stopping()) link_.state = NodeSessionState::kBackingOff;  // the writer stops
  link_.ctx = nullptr;
}

void NodeSessionImpl::EnterStopping() {
  absl::MutexLock lock(&mu_);
  link_.state = NodeSessionState::kStopping;
  if (link_.ctx != nullptr) link_.ctx->TryCancel();
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
    const Dropped dropped = DropSent();
    FinishDropped(dropped, ended);
    if (dropped.stopping) return;
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
    AwaitBackoff(backoff.Next());
  }
}

absl::Status NodeSessionImpl::Connection() {
  grpc::ClientContext ctx;
  AttachToken(&ctx, o_.token);
  if (!EnterConnecting(&ctx)) return absl::CancelledError("stopping");
  if (coordinator_->Refresh()) {
    MUSTER_LOG(INFO) << "muster-agent: node " << o_.node << ": coordinator now at "
                     << coordinator_->address();
  }
  std::unique_ptr<v1::Coordinator::Stub> stub = v1::Coordinator::NewStub(coordinator_->get());
  std::unique_ptr<NodeStream> stream = stub->Session(&ctx);
  v1::SessionEvent event;
  std::thread writer;
  if (Handshake(stream.get(), &ctx, &event)) {
    Route(std::move(event));
    EnterConnected();
    MUSTER_LOG(INFO) << "muster-agent: node " << o_.node << ": node session open";
    writer = std::thread([this, s = stream.get()] { WriteLoop(s); });
    while (stream->Read(&event)) Route(std::move(event));
  }
  EnterBackingOff();
  if (writer.joinable()) writer.join();
  return FromGrpcStatus(stream->Finish());
}

bool NodeSessionImpl::Handshake(NodeStream* stream, grpc::ClientContext* ctx,
                                v1::SessionEvent* ack) {
  // A coordinator that hangs may still accept the TCP connection and then
  // never answer: give up on the handshake as the write loop does on an
  // open stream (common/session_liveness.h).
  bool handshaken = false;
  std::thread watch([this, ctx, &handshaken] {
    absl::MutexLock lock(&mu_);
    const absl::Duration limit = SilenceLimit(link_.interval);
    auto done = [this, &handshaken]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return handshaken || stopping();
    };
    if (!AwaitFor(&mu_, absl::Condition(&done), limit, clock_)) {
      MUSTER_LOG(WARNING) << "muster-agent: node " << o_.node << ": no answer from "
                          << coordinator_->address() << " in " << absl::FormatDuration(limit);
      coordinator_->MoveOn();  // the next address of a list, if any
      ctx->TryCancel();
    }
  });
  v1::SessionRequest hello;
  hello.mutable_node_hello()->set_node(o_.node);
  hello.mutable_node_hello()->set_batches(true);  // Route unpacks them
  hello.mutable_node_hello()->set_grouped(true);  // and copies them out
  v1::SessionRequest first_beat;  // learns the heartbeat period
  first_beat.mutable_heartbeat();
  bool ok = stream->Write(hello) && stream->Write(first_beat);
  ok = ok && stream->Read(ack) && ack->has_ack();
  {
    absl::MutexLock lock(&mu_);
    handshaken = true;
  }
  watch.join();
  return ok;
}

NodeSessionImpl::Dropped NodeSessionImpl::DropSent() {
  Dropped dropped;
  absl::MutexLock lock(&mu_);
  dropped.stopping = stopping();
  link_.outgoing.clear();
  for (auto it = trainers_.members.begin(); it != trainers_.members.end();) {
    if (!it->second.attached && !dropped.stopping) {
      ++it;
      continue;
    }
    dropped.streams.push_back(std::move(it->second.out));
    it = trainers_.members.erase(it);
  }
  for (auto it = trainers_.calls.begin(); it != trainers_.calls.end();) {
    if (!it->second.sent && !dropped.stopping) {
      ++it;
      continue;
    }
    dropped.calls.push_back(it->second.call);
    it = trainers_.calls.erase(it);
  }
  return dropped;
}

void NodeSessionImpl::FinishDropped(const Dropped& dropped, const absl::Status& ended) {
  // Each trainer rejoins and opens its session again, as after a
  // coordinator restart.
  const absl::Status why =
      dropped.stopping
          ? absl::UnavailableError("muster-agent is stopping")
          : absl::UnavailableError(absl::StrCat(
                "muster-agent lost its session with the coordinator: ", ended.message()));
  for (const auto& out : dropped.streams) out->Close(why);
  // A trainer retries UNAVAILABLE until its own deadline.
  for (RelayedRendezvous* call : dropped.calls) call->Fail(why);
}

void NodeSessionImpl::AwaitBackoff(absl::Duration wait) {
  absl::MutexLock lock(&mu_);
  // Stopping ends the wait: the next Connection() then refuses, and what
  // still waits is finished as the loop ends.
  auto halted = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping(); };
  AwaitFor(&mu_, absl::Condition(&halted), wait, clock_);
}

void NodeSessionImpl::WriteLoop(NodeStream* stream) {
  uint64_t sequence = 0;
  absl::Time next_beat = clock_->Now();
  // The beat's time is checked at least every 10 ms, on the monotonic clock
  // (an absl timed wait would stall while the wall clock is set back).
  MutexPoker poker(&mu_, absl::Milliseconds(10));
  for (;;) {
    std::vector<v1::SessionRequest> batch;
    if (!NextBatch(&next_beat, &sequence, &batch)) return;
    if (batch.size() == 1) {
      if (!stream->Write(batch.front())) return;
    } else if (batch.size() > 1) {  // one message: one completion at the coordinator
      v1::SessionRequest merged;
      for (v1::SessionRequest& r : batch) *merged.add_batch() = std::move(r);
      if (!stream->Write(merged)) return;
    }
  }
}

bool NodeSessionImpl::NextBatch(absl::Time* next_beat, uint64_t* sequence,
                                std::vector<v1::SessionRequest>* batch) {
  absl::MutexLock lock(&mu_);
  auto ready = [this, next_beat]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const absl::Time now = clock_->Now();
    if (!connected() || now >= *next_beat) return true;
    return !link_.outgoing.empty() && !HoldForRendezvous(now);
  };
  mu_.Await(absl::Condition(&ready));
  if (!connected()) return false;
  batch->swap(link_.outgoing);
  const absl::Time now = clock_->Now();
  // A silent coordinator is hung or cut off (common/session_liveness.h).
  if (now - link_.last_heard > SilenceLimit(link_.interval)) {
    MUSTER_LOG(WARNING) << "muster-agent: node " << o_.node << ": no word from the "
                        << "coordinator for " << absl::FormatDuration(now - link_.last_heard)
                        << "; reconnecting";
    // A relay that went silent is cut off or hung as well: go round it to
    // the next address of a list rather than wait out a handshake with it
    // (from the last entry, the coordinator, there is no going round).
    coordinator_->MoveOn(/*wrap=*/false);
    if (link_.ctx != nullptr) link_.ctx->TryCancel();
    return false;
  }
  if (now >= *next_beat) {
    batch->push_back(NodeBeatLocked(now, ++*sequence));
    *next_beat = now + link_.interval;
  }
  return true;
}

v1::SessionRequest NodeSessionImpl::NodeBeatLocked(absl::Time now, uint64_t sequence) const {
  v1::SessionRequest beat;
  beat.mutable_heartbeat()->set_sequence(sequence);
  for (const auto& [id, m] : trainers_.members) {
    if (!m.attached || now - m.last_beat > 2 * link_.interval) continue;  // hung or stopped
    v1::MemberStep* step = beat.mutable_heartbeat()->add_members();
    step->set_member_id(id);
    step->set_step(m.step);
    step->set_samples(m.samples);
    step->set_stalled_ms(m.stalled_ms);
    step->set_working(m.working);
    if (m.memory.ByteSizeLong() > 0) *step->mutable_memory() = m.memory;
    step->set_beat_age_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(now - m.last_beat)));
  }
  return beat;
}

void NodeSessionImpl::Send(v1::SessionRequest request) {
  if (link_.outgoing.empty()) link_.outgoing_since = clock_->Now();
  link_.outgoing.push_back(std::move(request));
}

bool NodeSessionImpl::HoldForRendezvous(absl::Time now) const {
  if (now - link_.outgoing_since >= kRendezvousHold) return false;
  for (const v1::SessionRequest& r : link_.outgoing) {
    if (!r.has_rendezvous()) return false;
  }
  size_t attached = 0;
  for (const auto& [id, m] : trainers_.members) attached += m.attached ? 1 : 0;
  return trainers_.calls.size() < attached;
}

void NodeSessionImpl::SendParkedLocked() {
  // Attaches first: the coordinator then knows each session before the
  // calls of its member.
  for (auto& [id, m] : trainers_.members) {
    if (m.attached) continue;
    m.attached = true;
    v1::SessionRequest attach;
    attach.mutable_attach()->set_member_id(id);
    attach.mutable_attach()->set_incarnation(m.incarnation);
    Send(std::move(attach));
  }
  for (auto& [n, c] : trainers_.calls) {
    if (c.sent) continue;
    c.sent = true;
    Send(std::move(c.parked));
    c.parked.Clear();
  }
}

}  // namespace muster::node_session_internal
