// SessionReactor: the server side of one Session stream (on completion
// queues, rpc/async_bidi.h): a member's own session (hello, heartbeats), or a node session that
// carries the sessions of a node's members (node_hello, attach, detach, one
// heartbeat for all, and their Rendezvous calls). Hands them to the Coordinator; writes
// acknowledgements and the events the Coordinator pushes, one at a time, in
// order. A broken or finished stream is reported to the Coordinator, which
// fails its member, or every member attached to it, at once; except a
// stream that came through a relay (muster-relay) and was cancelled rather
// than finished by its caller: the relay lost it, not the member, whose
// agent reconnects, so its members are held (Coordinator::SessionLost;
// docs/relay.md). A relay half-closes the stream of a caller that went
// away, so that case still fails them at once.
//
// The reactor deletes itself in OnDone. The sink it registers
// with the Coordinator may outlive it and ignores calls after Close.
#ifndef MUSTER_COORDINATOR_SESSION_REACTOR_H_
#define MUSTER_COORDINATOR_SESSION_REACTOR_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "coordinator/coordinator.h"
#include "coordinator/metrics.h"
#include "rpc/async_bidi.h"
#include "muster/v1/coordinator.grpc.pb.h"

namespace muster {

class SessionOutbox;

// A Rendezvous request (unary or relayed on a node stream) that says its
// world broke: hands the report to the coordinator, which regroups that
// world once. The rendezvous that follows answers the member either way,
// so the report's own refusals (an older generation: already regrouped)
// are only logged.
void ReportBroken(Coordinator* coordinator, const v1::RendezvousRequest& request);

using SessionCall = AsyncBidiCall<v1::SessionRequest, v1::SessionEvent>;

class SessionReactor : public AsyncBidiReactor<v1::SessionRequest, v1::SessionEvent> {
 public:
  // Serves `call`. `auth` not OK: the stream is finished with it at once.
  // Every event sent carries `epoch` (SessionEvent.epoch).
  SessionReactor(SessionCall* call, Coordinator* coordinator, Metrics* metrics,
                 const absl::Status& auth, uint64_t epoch = 0);

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnDone() override;

 private:
  ~SessionReactor() override;
  // Handles one request; returns false when the stream was closed.
  bool Handle();
  bool OpenNode();
  bool HandleNode(absl::Time start);
  void Acknowledge(uint64_t generation, absl::Time start);
  // A member's Rendezvous on a node session; answered on the stream. Kept
  // in calls_ until FlushRendezvous.
  void Rendezvous(absl::Time start);
  // Hands the kept Rendezvous calls to the coordinator, all under one lock.
  void FlushRendezvous();
  void CloseSession(const std::string& why);
  // The relay lost the stream: its sessions are held, not failed.
  void LoseSession();

  struct Attached {
    uint64_t incarnation = 0;
    uint64_t session = 0;
  };

  Coordinator* const coordinator_;
  Metrics* const metrics_;
  std::shared_ptr<SessionOutbox> outbox_;
  v1::SessionRequest request_;
  // Touched only from OnReadDone, which gRPC never runs concurrently with
  // itself.
  uint64_t session_ = 0;
  // A node session: the node's name and its attached members by id.
  std::string node_;
  absl::flat_hash_map<std::string, Attached> attached_;
  std::vector<Coordinator::RendezvousCall> calls_;
  // The stream came through a relay (rpc/peer_address.h), and its reading
  // side ended: whether that was its caller or the relay is known in OnDone.
  const bool relayed_;
  bool read_ended_ = false;
};

}  // namespace muster

#endif  // MUSTER_COORDINATOR_SESSION_REACTOR_H_
