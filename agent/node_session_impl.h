// The inside of a muster-agent's node session (node_session.h), in three
// files along its concerns:
//   node_session.cc           the trainers' socket, the service they call,
//                             start and stop;
//   node_session_trainers.cc  each trainer's stream (LocalSession) and
//                             relayed Rendezvous, and the member table;
//   node_session_upstream.cc  the one connection to the coordinator, with
//                             its backoff, the node heartbeat that gathers
//                             the members' beats, and routing of events.
#ifndef MUSTER_AGENT_NODE_SESSION_IMPL_H_
#define MUSTER_AGENT_NODE_SESSION_IMPL_H_

#include <grpcpp/grpcpp.h>
#include <sys/types.h>

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "muster/v1/coordinator.grpc.pb.h"
#include "rpc/coordinator_channel.h"
#include "rpc/status.h"
#include "rpc/write_queue.h"
#include "agent/node_session.h"

namespace muster::node_session_internal {

using Queue = WriteQueue<v1::SessionRequest, v1::SessionEvent>;
using Upstream = grpc::ClientReaderWriter<v1::SessionRequest, v1::SessionEvent>;

class NodeSessionImpl;

// One trainer's stream to the agent. Deletes itself when gRPC is done with
// it; the queue it writes through is shared with the relay's table and
// ignores writes once closed.
class LocalSession : public grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionEvent> {
 public:
  LocalSession(NodeSessionImpl* relay, const absl::Status& auth, pid_t pid);
  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override { out_->WriteDone(ok); }
  void OnDone() override { delete this; }

 private:
  NodeSessionImpl* const relay_;
  const pid_t pid_;
  const std::shared_ptr<Queue> out_;
  v1::SessionRequest request_;
  // Touched only from OnReadDone, which gRPC never runs concurrently with
  // itself.
  std::string member_;  // "" until hello
  uint64_t incarnation_ = 0;
};

// One trainer's Rendezvous, relayed as a NodeRendezvous on the node stream.
// Finished exactly once, by whoever takes it out of the relay's table: the
// answer, the node stream breaking, or the trainer cancelling. Deletes
// itself when gRPC is done with it.
class RelayedRendezvous : public grpc::ServerUnaryReactor {
 public:
  RelayedRendezvous(NodeSessionImpl* relay, v1::RendezvousResponse* response)
      : relay_(relay), response_(response) {}
  void Start(const absl::Status& auth, const v1::RendezvousRequest& request);
  // The coordinator's answer.
  void Answer(const v1::RendezvousAnswer& answer);
  void Fail(const absl::Status& status) { Finish(ToGrpcStatus(status)); }
  void OnCancel() override;
  void OnDone() override { delete this; }

 private:
  NodeSessionImpl* const relay_;
  v1::RendezvousResponse* const response_;
  // Set once relayed; with cancelled_, whichever of Start and OnCancel
  // comes second sees the other's write.
  std::atomic<uint64_t> call_{0};
  std::atomic<bool> cancelled_{false};
};

class NodeSessionImpl final : public NodeSession,
                              public v1::Coordinator::CallbackService {
 public:
  explicit NodeSessionImpl(NodeSessionOptions o) : o_(std::move(o)), clock_(o_.clock) {}
  ~NodeSessionImpl() override;

  absl::Status Init();
  std::string address() const override { return "unix:" + socket_; }
  void DetachProcess(pid_t pid, const std::string& reason) override;

  // --- for LocalSession ---
  // Attaches a trainer's member; errors close its stream.
  absl::Status Attach(const v1::MemberRef& member, pid_t pid, std::shared_ptr<Queue> out);
  // A trainer's heartbeat: records the step, acknowledges it.
  void LocalBeat(const std::string& member, uint64_t incarnation, const v1::Heartbeat& beat,
                 Queue* out);
  // A trainer's stream ended (its read side): detach, unless already gone.
  void LocalEnded(const std::string& member, uint64_t incarnation, pid_t pid);

  grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionEvent>* Session(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* Rendezvous(grpc::CallbackServerContext* ctx,
                                       const v1::RendezvousRequest* request,
                                       v1::RendezvousResponse* response) override;

  // --- for RelayedRendezvous ---
  // Queues `request` on the node stream under a new call number; while the
  // stream is down the call waits for the next connection.
  uint64_t Relay(RelayedRendezvous* call, const v1::RendezvousRequest& request);
  // Takes `call` out of the table; false when it was already taken.
  bool Forget(uint64_t call);

 private:
  struct Member {
    uint64_t incarnation = 0;
    pid_t pid = 0;
    std::shared_ptr<Queue> out;
    int64_t step = 0;
    int64_t samples = 0;
    uint32_t stalled_ms = 0;  // as of last_beat
    absl::Time last_beat;
    // Whether its attach went out on the current connection; a member that
    // attached while the node stream was down waits for the next one.
    bool attached = false;
  };
  struct Call {
    RelayedRendezvous* call = nullptr;
    // Relayed on the current connection, or waiting for the next one with
    // its request.
    bool sent = false;
    v1::SessionRequest parked;
  };

  // Connects, relays, and reconnects with backoff until the destructor.
  void ConnectLoop();
  // One connection's life; returns how it ended.
  absl::Status Connection();
  // Writes queued requests and the periodic heartbeat until the
  // connection ends.
  void WriteLoop(Upstream* stream);
  void Route(v1::SessionEvent event);
  // An event naming several members (SessionEvent.member_ids): routed as
  // one to each.
  void RouteToEach(const v1::SessionEvent& event);
  // Removes `id` from the table and queues its detach; returns its stream,
  // for the caller to close once mu_ is released (gRPC may run a reactor's
  // callbacks inline, and they take mu_).
  std::shared_ptr<Queue> DetachLocked(const std::string& id, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Send(v1::SessionRequest request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the write loop waits a little before sending: what is queued
  // is only Rendezvous calls, fewer than the node has attached trainers
  // (after a regroup the others call within milliseconds), and the first
  // was queued less than kRendezvousHold ago. What is queued then leaves as
  // one message, one completion at the coordinator rather than one per
  // trainer (docs/scale.md). A world completes only when its last member
  // arrives, so at scale the hold costs nothing; in a small world it costs
  // a regroup at most the hold (checked every 10 ms).
  bool HoldForRendezvous(absl::Time now) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  static constexpr absl::Duration kRendezvousHold = absl::Milliseconds(5);
  // On a new connection: the attaches and calls that waited for it.
  void SendParkedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after Init.
  const NodeSessionOptions o_;
  // Every time kept here (beats, silence, backoff) is its monotonic Now().
  Clock* const clock_;
  std::string dir_, socket_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<CoordinatorChannel> coordinator_;
  std::thread thread_;

  absl::Mutex mu_;
  // Where the node stream stands:
  //   kDown ──Connection() handshaken──> kUp ──stream ends──> kDown
  //     └──────────── destructor (from either) ──────────────> kStopping
  // Only in kUp do attaches, detaches and relayed calls go out at once;
  // otherwise they wait (parked) for the next connection.
  enum class Link { kDown, kUp, kStopping };
  Link link_ ABSL_GUARDED_BY(mu_) = Link::kDown;
  bool up() const ABSL_SHARED_LOCKS_REQUIRED(mu_) { return link_ == Link::kUp; }
  bool stopping() const ABSL_SHARED_LOCKS_REQUIRED(mu_) { return link_ == Link::kStopping; }
  // The live connection's context, to cancel it.
  grpc::ClientContext* ctx_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::vector<v1::SessionRequest> outgoing_ ABSL_GUARDED_BY(mu_);
  absl::Time outgoing_since_ ABSL_GUARDED_BY(mu_);  // when outgoing_ last became non-empty
  std::map<std::string, Member> members_ ABSL_GUARDED_BY(mu_);
  // Trainers' Rendezvous calls waiting for their answer, by call number.
  std::map<uint64_t, Call> rendezvous_ ABSL_GUARDED_BY(mu_);
  uint64_t last_call_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  // The newest lease epoch heard on the live connection (SessionEvent.epoch):
  // events of an older one come from a coordinator fenced by a takeover and
  // are dropped. The trainers rely on this filter. Each connection starts
  // afresh: it goes where the address file points, and a coordinator
  // restarted on a new state dir counts epochs from 1 again.
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  // When the coordinator last sent anything on the live connection.
  absl::Time last_heard_ ABSL_GUARDED_BY(mu_);
  absl::Duration interval_ ABSL_GUARDED_BY(mu_) = absl::Seconds(1);
  // interval_ came from the coordinator (an ack): only then is it told to
  // the trainers, which otherwise keep the period their Join answered.
  bool interval_heard_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace muster::node_session_internal

#endif  // MUSTER_AGENT_NODE_SESSION_IMPL_H_
