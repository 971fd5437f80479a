// NodeSession: the agent's one session with the coordinator for every
// trainer on its node (protocol: the node_hello / attach / detach messages
// of the Session rpc). The coordinator then holds one stream and receives
// one heartbeat per node instead of one per trainer.
//
// Trainers reach it on a Unix socket in a private (0700) directory that the
// agent passes them as MUSTER_AGENT_SESSION=unix:PATH. There a trainer
// speaks the same Session rpc as it would to the coordinator: hello, then
// heartbeats; it receives acknowledgements, regroup and stop events, and
// the final status of its session; its Rendezvous calls go here too. The
// relay:
//
//   trainer hello            -> attach on the node stream (held while the
//                               node stream is down, sent once it is up)
//   trainer heartbeat        -> its step is recorded; acknowledged at once
//                               with the newest generation the agent heard of
//   every heartbeat period   -> one node heartbeat naming each member whose
//                               own heartbeats reached the agent within two
//                               periods (a hung or stopped trainer drops out
//                               and the coordinator's heartbeat timeout
//                               fails it, as for a trainer without agent)
//   trainer stream ends      -> detach: the member fails at once
//   trainer process ends     -> detach with its exit status (DetachProcess)
//   trainer process stopped  -> detach, saying so (DetachProcess; the agent
//                               decides: stopped_trainers.h)
//   trainer Rendezvous call  -> a NodeRendezvous on the node stream (held
//                               while it is down); the coordinator's
//                               RendezvousAnswer finishes the call
//                               (UNAVAILABLE, which the trainer retries,
//                               when the node stream breaks after sending)
//   event for a member       -> written to that trainer's stream, unless
//                               its lease epoch is older than the newest
//                               heard on this connection (a fenced
//                               coordinator's: dropped, and not counted as
//                               word from the coordinator)
//   member's session closed  -> that trainer's stream ends with its status;
//                               closed as hung (end_process) -> the trainer
//                               process is SIGKILLed first, and its agent
//                               restarts it
//   node stream breaks       -> every attached trainer's stream ends
//                               UNAVAILABLE; each reopens its session here,
//                               where it waits until the agent has
//                               reconnected (with backoff), and reattaches
//                               (joining first only when a restarted
//                               coordinator has forgotten it): a trainer's
//                               retries never add to the agent's backoff
//
// The heartbeat period is the coordinator's (HeartbeatAck's
// heartbeat_interval_ms), learned on every connection.
//
// Thread-safety: DetachProcess may be called from any thread. The object
// runs a gRPC server and a connection thread of its own; create it after
// the process has set its signal mask (the threads inherit it). Its inside,
// with the connection's states and what its lock guards, is drawn in
// node_session_impl.h.
#ifndef MUSTER_AGENT_NODE_SESSION_H_
#define MUSTER_AGENT_NODE_SESSION_H_

#include <sys/types.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/backoff.h"
#include "common/clock.h"
#include "rpc/tls_files.h"

namespace muster {

struct NodeSessionOptions {
  std::string coordinator;  // host:port
  std::string token;        // the job token ("" without one)
  TlsFiles tls;             // ca (and cert+key for mutual TLS) of the coordinator
  std::string node;         // this node's identity, as the trainers join with
  // Directory under which the private socket directory is made.
  std::string runtime_dir = "/tmp";
  // Between connection attempts. One stream per node: a short cap keeps a
  // coordinator restart from costing the job more than about a second past
  // its outage, at one attempt per node and second at most.
  BackoffOptions backoff{absl::Milliseconds(50), absl::Seconds(1)};
  // Beats, silence and backoff are times of clock->Now(). Required; not
  // owned, must outlive the session (muster-agent passes its RealClock).
  Clock* clock = nullptr;
};

class NodeSession {
 public:
  // Makes the socket directory, starts the local server and the connection
  // to the coordinator (which keeps retrying in the background). Errors:
  // INVALID_ARGUMENT (empty coordinator or node, bad TLS files, a socket
  // path too long for a Unix socket), INTERNAL (the directory or the server
  // cannot be made).
  static absl::StatusOr<std::unique_ptr<NodeSession>> Start(NodeSessionOptions options);
  // Ends every trainer's stream and the node stream, removes the socket.
  virtual ~NodeSession() = default;

  // What trainers connect to: "unix:/.../session.sock".
  virtual std::string address() const = 0;

  // The trainer process `pid` has ended, or is held stopped: its member, if
  // attached, is detached with `reason` ("trainer process killed by signal
  // 9") and its stream closed.
  virtual void DetachProcess(pid_t pid, const std::string& reason) = 0;
};

}  // namespace muster

#endif  // MUSTER_AGENT_NODE_SESSION_H_
