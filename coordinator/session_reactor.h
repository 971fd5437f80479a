// SessionReactor: the server side of one member's Session stream (gRPC
// callback API). Reads hello and heartbeats and hands them to the
// Coordinator; writes acknowledgements and the events the Coordinator
// pushes, one at a time, in order. A broken or finished stream is reported
// to the Coordinator (which fails the member at once).
//
// The reactor deletes itself when gRPC calls OnDone. The sink it registers
// with the Coordinator may outlive it and ignores calls after Close.
#ifndef MUSTER_COORDINATOR_SESSION_REACTOR_H_
#define MUSTER_COORDINATOR_SESSION_REACTOR_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "coordinator/coordinator.h"
#include "coordinator/metrics.h"
#include "muster/v1/coordinator.grpc.pb.h"

namespace muster {

class SessionOutbox;

class SessionReactor
    : public grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionEvent> {
 public:
  // `auth` not OK: the stream is finished with it at once.
  SessionReactor(Coordinator* coordinator, Metrics* metrics, const absl::Status& auth);

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnDone() override;

 private:
  ~SessionReactor() override;
  // Handles one request; returns false when the stream was closed.
  bool Handle();
  void CloseSession(const std::string& why);

  Coordinator* const coordinator_;
  Metrics* const metrics_;
  std::shared_ptr<SessionOutbox> outbox_;
  v1::SessionRequest request_;
  // Touched only from OnReadDone, which gRPC never runs concurrently with
  // itself.
  uint64_t session_ = 0;
};

}  // namespace muster

#endif  // MUSTER_COORDINATOR_SESSION_REACTOR_H_
