// NodeSessionImpl: the inside of a muster-agent's node session
// (node_session.h), as one class. Read this header first; the class's code
// lies in four files, one concern each:
//   node_session.cc           start and stop, the trainers' socket and the
//                             service they call;
//   node_session_trainers.cc  what the trainers send: each one's stream
//                             (LocalSession), their relayed Rendezvous calls
//                             (RelayedRendezvous), the member table;
//   node_session_upstream.cc  the one connection to the coordinator through
//                             the states below: connecting with backoff, the
//                             handshake, the write loop with the node
//                             heartbeat, what a broken stream drops;
//   node_session_events.cc    what the coordinator sends: its events routed
//                             to the trainers' streams, its answers to their
//                             calls.
//
// States of the node stream (NodeSessionState), and the transition (method:
// event) that leads from one to another:
//
//            +--------------+  EnterConnected(): the coordinator  +-------------+
//   Init --> | kConnecting  | --- acknowledged the node's hello --> | kConnected  |
//            +--------------+                                      +-------------+
//               ^        |                                                |
//               |        | EnterBackingOff(): the dial or the             |
//               |        | handshake failed                               |
//               |        v                                                |
//               |   +--------------+   EnterBackingOff(): the stream      |
//               |   | kBackingOff  | <-- broke, or the coordinator fell --+
//               |   +--------------+     silent and the write loop
//               |        |               cancelled it
//               +--------+
//   EnterConnecting(): the backoff wait is over
//
//   every state --EnterStopping(): the destructor--> kStopping (final;
//       EnterConnecting then refuses, and the connection thread ends)
//
//   kConnecting  the connection thread dials the coordinator (where its
//                address file points now) and waits for the ack to the node
//                hello, at most SilenceLimit (common/session_liveness.h).
//   kConnected   the only state in which attaches, detaches and relayed
//                Rendezvous calls go out at once; the write loop sends them
//                and the node heartbeat; events are routed to the trainers.
//   kBackingOff  the stream ended or never opened: the members attached on
//                it and the calls sent on it are dropped (their trainers'
//                streams and calls end UNAVAILABLE and they come back), then
//                the thread waits its backoff.
//   kStopping    every trainer's stream and call ends UNAVAILABLE.
// Outside kConnected, new attaches and calls wait (parked) for the next
// connection, which queues them as it opens (attaches before calls).
//
// Locks, and what each one guards:
//
//   lock                 guards
//   ------------------   ---------------------------------------------------
//   mu_                  link_: the state, the live connection's context,
//                        the requests queued for the write loop, the epoch
//                        and last word heard, the generation and heartbeat
//                        period learned; trainers_: the attached members and
//                        the Rendezvous calls waiting for their answer
//   none (constant       o_, clock_, dir_, socket_, server_, thread_, and
//     after Init)        coordinator_ (itself thread-safe)
//   each Queue's own     one trainer's stream writes (rpc/write_queue.h)
//   gRPC's callbacks     LocalSession's member_, incarnation_ (OnReadDone
//                        never runs concurrently with itself)
//   atomics              RelayedRendezvous's call_ and cancelled_
//
// mu_ is held to decide, never to act: no stream read or write, no Queue
// Write or Close (gRPC may run a reactor's callbacks inline, and they take
// mu_), no kill and no Rendezvous answer while holding it; cancelling a
// context, which does not block, is allowed. A Queue's lock is never taken
// inside mu_; coordinator_'s is, by the handshake watch (MoveOn).
//
// Threads: gRPC's (the trainers' streams and calls), the connection thread
// (ConnectLoop, which also reads the node stream and routes what it reads),
// one write loop per connection, a short-lived handshake watch, and the
// agent's, which calls DetachProcess.
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
using NodeStream = grpc::ClientReaderWriter<v1::SessionRequest, v1::SessionEvent>;

// Where the node stream stands (the diagram above).
enum class NodeSessionState {
  kConnecting,  // dialling the coordinator, then the handshake
  kConnected,   // the node stream is open; requests go out at once
  kBackingOff,  // the stream ended: drop what went out on it, then wait
  kStopping,    // the destructor runs; final
};

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

  // --- for LocalSession (node_session_trainers.cc) ---
  // Attaches a trainer's member; errors close its stream.
  absl::Status Attach(const v1::MemberRef& member, pid_t pid, std::shared_ptr<Queue> out);
  // A trainer's heartbeat: records the step, acknowledges it.
  void LocalBeat(const std::string& member, uint64_t incarnation, const v1::Heartbeat& beat,
                 Queue* out);
  // A trainer's stream ended (its read side): detach, unless already gone.
  void LocalEnded(const std::string& member, uint64_t incarnation, pid_t pid);

  // --- the service trainers call (node_session.cc) ---
  grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionEvent>* Session(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* Rendezvous(grpc::CallbackServerContext* ctx,
                                       const v1::RendezvousRequest* request,
                                       v1::RendezvousResponse* response) override;

  // --- for RelayedRendezvous (node_session_trainers.cc) ---
  // Queues `request` on the node stream under a new call number; while the
  // stream is down the call waits for the next connection.
  uint64_t Relay(RelayedRendezvous* call, const v1::RendezvousRequest& request);
  // Takes `call` out of the table; false when it was already taken.
  bool Forget(uint64_t call);

 private:
  struct Member {
    uint64_t incarnation = 0;
    pid_t pid = 0;
    std::shared_ptr<Queue> out;  // never null while in the table
    int64_t step = 0;
    int64_t samples = 0;
    uint32_t stalled_ms = 0;  // as of last_beat
    bool working = false;     // as of last_beat
    absl::Time last_beat;
    // Whether its attach went out on the current connection; a member that
    // attached while the node stream was down waits for the next one.
    bool attached = false;
    v1::MemoryBytes memory = {};  // its last reported account
  };
  struct Call {
    RelayedRendezvous* call = nullptr;
    // Relayed on the current connection, or waiting for the next one with
    // its request.
    bool sent = false;
    v1::SessionRequest parked;
  };
  // The node stream, and what the coordinator said on it. Guarded by mu_.
  struct Link {
    NodeSessionState state = NodeSessionState::kConnecting;
    // The live connection's context, to cancel it.
    grpc::ClientContext* ctx = nullptr;
    // For the write loop; `outgoing_since`: when it last became non-empty.
    std::vector<v1::SessionRequest> outgoing;
    absl::Time outgoing_since;
    // The newest lease epoch heard on the live connection
    // (SessionEvent.epoch): events of an older one come from a coordinator
    // fenced by a takeover and are dropped. The trainers rely on this
    // filter. Each connection starts afresh: it goes where the address file
    // points, and a coordinator restarted on a new state dir counts epochs
    // from 1 again.
    uint64_t epoch = 0;
    // When the coordinator last sent anything on the live connection.
    absl::Time last_heard;
    // Kept across connections: the newest generation heard of, and the
    // heartbeat period. `interval_heard`: the period came from the
    // coordinator (an ack); only then is it told to the trainers, which
    // otherwise keep the period their Join answered.
    uint64_t generation = 0;
    absl::Duration interval = absl::Seconds(1);
    bool interval_heard = false;
  };
  // The node's trainers: attached members and their Rendezvous calls
  // waiting for an answer. Guarded by mu_.
  struct Trainers {
    std::map<std::string, Member> members;
    std::map<uint64_t, Call> calls;  // by call number
    uint64_t last_call = 0;
  };
  // What a broken connection leaves to finish once mu_ is released.
  struct Dropped {
    bool stopping = false;
    std::vector<std::shared_ptr<Queue>> streams;
    std::vector<RelayedRendezvous*> calls;
  };
  // What an event for one member does, decided under mu_: nothing (`out` is
  // null), a write to its stream, or closing it with `close` (and first
  // SIGKILLing `hung`, when non-zero).
  struct Delivery {
    std::shared_ptr<Queue> out;
    bool closing = false;
    absl::Status close;
    pid_t hung = 0;
  };

  // --- the states' transitions (node_session_upstream.cc, the destructor) ---
  // kConnecting, kBackingOff -> kConnecting with `ctx` live; false (and no
  // change) in kStopping.
  bool EnterConnecting(grpc::ClientContext* ctx);
  // kConnecting -> kConnected; queues what waited for the connection.
  void EnterConnected();
  // kConnecting, kConnected -> kBackingOff; the write loop then stops.
  void EnterBackingOff();
  // Any -> kStopping; cancels the live connection.
  void EnterStopping();
  bool connected() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return link_.state == NodeSessionState::kConnected;
  }
  bool stopping() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return link_.state == NodeSessionState::kStopping;
  }

  // --- the connection (node_session_upstream.cc) ---
  // Connects, relays, and reconnects with backoff until the destructor.
  void ConnectLoop();
  // One connection's life, kConnecting to kBackingOff; returns how it ended.
  absl::Status Connection();
  // Sends the node hello and the first heartbeat and reads the ack into
  // `ack`; gives up (cancelling `ctx`) when the coordinator stays silent.
  bool Handshake(NodeStream* stream, grpc::ClientContext* ctx, v1::SessionEvent* ack);
  // Takes out of the tables what went out on the ended connection (all of
  // it when stopping); what arrived since stays for the next one.
  Dropped DropSent();
  // Ends what DropSent took, saying why (`ended`: how the connection ended).
  void FinishDropped(const Dropped& dropped, const absl::Status& ended);
  // Waits out `wait`, or until the destructor.
  void AwaitBackoff(absl::Duration wait);
  // Writes queued requests and the periodic heartbeat until the
  // connection ends.
  void WriteLoop(NodeStream* stream);
  // Waits until there is something to write, swaps it into `batch` (with
  // the node heartbeat when due); false when the loop must end.
  bool NextBatch(absl::Time* next_beat, uint64_t* sequence,
                 std::vector<v1::SessionRequest>* batch);
  // The node heartbeat: each attached member whose own beats are recent.
  v1::SessionRequest NodeBeatLocked(absl::Time now, uint64_t sequence) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
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

  // --- the coordinator's events (node_session_events.cc) ---
  void Route(v1::SessionEvent event);
  // An event naming several members (SessionEvent.member_ids): routed as
  // one to each.
  void RouteToEach(const v1::SessionEvent& event);
  // Whether an event of lease epoch `epoch` counts (it is not a fenced
  // coordinator's); if so, records that the coordinator was heard.
  bool Heard(uint64_t epoch);
  // Finishes the relayed call that `answer` names, unless it is gone.
  void AnswerCall(const v1::RendezvousAnswer& answer);
  void Acknowledged(const v1::HeartbeatAck& ack);
  // An event for one member: written to its stream, or closes it.
  void Deliver(v1::SessionEvent event);
  Delivery DecideDelivery(const v1::SessionEvent& event);

  // --- the member table (node_session_trainers.cc) ---
  // Removes `id` from the table and queues its detach; returns its stream,
  // for the caller to close once mu_ is released.
  std::shared_ptr<Queue> DetachLocked(const std::string& id, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after Init.
  const NodeSessionOptions o_;
  // Every time kept here (beats, silence, backoff) is its monotonic Now().
  Clock* const clock_;
  std::string dir_, socket_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<CoordinatorChannel> coordinator_;
  std::thread thread_;

  absl::Mutex mu_;
  Link link_ ABSL_GUARDED_BY(mu_);
  Trainers trainers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace muster::node_session_internal

#endif  // MUSTER_AGENT_NODE_SESSION_IMPL_H_
