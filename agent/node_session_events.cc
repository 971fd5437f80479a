// What the coordinator sends the node session (node_session_impl.h): its
// events, routed to the trainers' streams, and its answers to their relayed
// Rendezvous calls.
#include <signal.h>

#include <algorithm>
#include <string>
#include <utility>

#include "common/logging.h"
#include "agent/node_session_impl.h"

namespace muster::node_session_internal {
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

void NodeSessionImpl::Route(v1::SessionEvent event) {
  if (event.batch_size() > 0) {  // several members' events in one message
    for (v1::SessionEvent& e : *event.mutable_batch()) Route(std::move(e));
    return;
  }
  if (event.member_ids_size() > 0) return RouteToEach(event);  // one for several members
  if (!Heard(event.epoch())) return;
  if (event.has_rendezvous()) return AnswerCall(event.rendezvous());
  if (event.has_ack()) return Acknowledged(event.ack());
  Deliver(std::move(event));
}

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

bool NodeSessionImpl::Heard(uint64_t epoch) {
  absl::MutexLock lock(&mu_);
  if (epoch < link_.epoch) {
    // Not counted as word from the coordinator either: the liveness
    // check then drops a stream to a fenced one.
    MUSTER_LOG(WARNING) << "muster-agent: dropped an event of lease epoch " << epoch
                        << " (epoch " << link_.epoch << " is current)";
    return false;
  }
  link_.epoch = epoch;
  link_.last_heard = clock_->Now();
  return true;
}

void NodeSessionImpl::AnswerCall(const v1::RendezvousAnswer& answer) {
  RelayedRendezvous* call = nullptr;
  {
    absl::MutexLock lock(&mu_);
    auto it = trainers_.calls.find(answer.call());
    if (it == trainers_.calls.end()) return;  // cancelled meanwhile
    call = it->second.call;
    trainers_.calls.erase(it);
  }
  call->Answer(answer);
}

void NodeSessionImpl::Acknowledged(const v1::HeartbeatAck& ack) {
  absl::MutexLock lock(&mu_);
  link_.generation = std::max(link_.generation, ack.current_generation());
  if (ack.heartbeat_interval_ms() > 0) {
    link_.interval = absl::Milliseconds(ack.heartbeat_interval_ms());
    link_.interval_heard = true;
  }
}

void NodeSessionImpl::Deliver(v1::SessionEvent event) {
  const Delivery delivery = DecideDelivery(event);
  if (delivery.out == nullptr) return;
  if (!delivery.closing) {
    event.clear_member_id();
    delivery.out->Write(std::move(event));
    return;
  }
  if (delivery.hung > 0) {
    // Its session lived but its training did not come to a regroup: the
    // process is stuck (a kernel, a driver call, a deadlock). End it; the
    // supervisor restarts it as a new incarnation, which takes a live
    // peer's state.
    MUSTER_LOG(WARNING) << "muster-agent: the coordinator fenced trainer " << event.member_id()
                        << " (pid " << delivery.hung << ") as hung: "
                        << delivery.close.message() << "; killing it so that it restarts";
    ::kill(delivery.hung, SIGKILL);
  }
  delivery.out->Close(delivery.close);
}

NodeSessionImpl::Delivery NodeSessionImpl::DecideDelivery(const v1::SessionEvent& event) {
  Delivery delivery;
  absl::MutexLock lock(&mu_);
  if (event.has_regroup()) {
    link_.generation = std::max(link_.generation, event.regroup().generation());
  }
  auto it = trainers_.members.find(event.member_id());
  if (it == trainers_.members.end()) return delivery;
  if (!event.has_closed()) {
    delivery.out = it->second.out;
    return delivery;
  }
  // A newer incarnation may already be attached under the same id.
  if (event.closed().incarnation() != it->second.incarnation) return delivery;
  delivery.closing = true;
  delivery.close = absl::Status(static_cast<absl::StatusCode>(event.closed().code()),
                                event.closed().message());
  if (event.closed().end_process()) delivery.hung = it->second.pid;
  delivery.out = std::move(it->second.out);
  trainers_.members.erase(it);
  return delivery;
}

}  // namespace muster::node_session_internal
