// CoordinatorServer: a running coordinator — state store, Coordinator,
// gRPC server, metrics endpoint, the ticker thread that enforces timeouts
// and the watchdog that replaces a listener that stopped accepting
// (listener_watchdog.h). Used by muster-coordinator's main and by
// in-process tests.
//
// Thread-safe: Wait() may be called from one thread while another calls
// Stop() or a client sends Shutdown.
#ifndef MUSTER_COORDINATOR_SERVER_H_
#define MUSTER_COORDINATOR_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "coordinator/coordinator.h"
#include "coordinator/grpc_service.h"
#include "coordinator/listener_watchdog.h"
#include "coordinator/metrics.h"
#include "coordinator/status_page.h"
#include "coordinator/state_store.h"
#include "rpc/async_bidi.h"
#include "rpc/credentials.h"

namespace muster {

class LeaseRenewal;

struct ServerOptions {
  // host:port; port 0 picks a free one (see CoordinatorServer::port()).
  std::string listen = "127.0.0.1:0";
  // Directory of the SQLite state file; "" keeps state in memory only.
  std::string state_dir;
  // Non-empty: before serving, fill an empty checkpoint catalog from the
  // manifests under this checkpoint directory (coordinator/catalog_rebuild.h).
  std::string rebuild_catalog;
  // Benchmarks: every fsync of the state file also waits this long.
  absl::Duration state_sync_delay = absl::ZeroDuration();
  // Empty: no authentication.
  std::string token;
  TlsFiles tls;
  // host:port for /metrics; "" serves none.
  std::string metrics_listen;
  // host:port of the status page (status_page.h); "" serves none.
  std::string http_listen;
  // coordinator.clock also times the server: the lease's beats and the
  // standby's wait (coordinator/lease.h), the ticker and shutdown
  // deadlines. One clock for both, so the lease and the heartbeat expiry
  // it guards agree on time.
  CoordinatorOptions coordinator;
  absl::Duration tick = absl::Milliseconds(20);
  // Largest request accepted.
  int max_message_bytes = 4 << 20;
  // Completion queues, one thread each, that serve the Session streams
  // (rpc/async_bidi.h says why there are several).
  int session_queues = 8;
  // A connection that has not begun HTTP/2 by then is closed (gRPC's
  // default is 120 s: idle sockets from anyone who can reach the port would
  // hold file descriptors that long). Members send HTTP/2's preface as soon
  // as TCP (and TLS) connect; 2 s bounds how long a held flood of idle
  // connections keeps a token holder out (docs/failover.md).
  absl::Duration handshake_timeout = kHandshakeTimeout;
  // A connection with no call for this long is closed; clients reconnect
  // when they next call (trainers and agents always hold a session).
  absl::Duration max_connection_idle = kMaxConnectionIdle;
  // The listener watchdog (coordinator/listener_watchdog.h): how often it
  // looks at the accept queue, and how long a connection may wait there
  // before the listener counts as dead and a new one replaces it. A zero
  // interval runs no watchdog.
  absl::Duration listener_check = absl::Milliseconds(500);
  absl::Duration listener_stuck_after = absl::Seconds(1);

  // Failover (docs/failover.md), with a state dir only. This coordinator's
  // host:port as clients reach it: the lease's holder and what the address
  // file says. "" means `listen`, with a wildcard host replaced by this
  // host's name.
  std::string advertise;
  // Written atomically (host:port and a newline) once this coordinator
  // holds the lease and listens; clients given file:PATH read it.
  std::string address_file;
  // The holder's beats stopped this long: a standby takes over.
  absl::Duration lease_timeout = absl::Seconds(3);
  // Polled while waiting for the lease as a standby: true ends the wait
  // (Start then fails CANCELLED).
  std::function<bool()> cancelled;
};

class CoordinatorServer {
 public:
  // Opens the state, binds the ports and starts serving. Errors:
  // INVALID_ARGUMENT (options), UNAVAILABLE (a port or the state file).
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(ServerOptions options);
  ~CoordinatorServer();

  int port() const { return port_; }
  int metrics_port() const { return metrics_->port(); }
  // The status page's port; 0 without one.
  int http_port() const { return status_page_ == nullptr ? 0 : status_page_->port(); }
  Coordinator* coordinator() { return coordinator_.get(); }
  Metrics* metrics() { return metrics_.get(); }

  // Blocks until Stop(), a Shutdown rpc, or the job ending on its own.
  void Wait();
  // Why the job ended on its own (Coordinator::JobEnded), or "".
  std::string ended();
  // Why this coordinator gave up serving because another took the lease
  // over, or "". It then stopped without telling the members anything:
  // they move to the new holder.
  std::string lost_lease();
  // Stops members and the server; idempotent.
  void Stop(const std::string& reason);

 private:
  CoordinatorServer() = default;
  void TickLoop();
  // Once a tick, before the coordinator acts on time: beats the lease, or,
  // while no member is heard (Coordinator::Unheard, `*holding`), only checks
  // that nobody took it over. kTick: act on time; kHold: not this tick (the
  // lease is not sure, or it lapses on purpose); kStop: the lease was taken
  // over, and lost_lease() says by whom.
  enum class LeaseTurn { kTick, kHold, kStop };
  LeaseTurn TendLease(LeaseRenewal* lease, bool* holding);
  // Start's steps: the state store, its lease and a rebuilt catalog; the
  // gRPC server and the address file; and, on its own thread, the stop.
  absl::Status OpenState();
  absl::Status Listen();
  void StopWhenAsked();
  // --advertise, or the listen address with this host's name.
  std::string AdvertisedAddress() const;
  void RequestStop();
  // A new service over coordinator_ (each gRPC server needs its own).
  std::unique_ptr<CoordinatorService> NewService();
  struct Listener;
  // Binds `listen` and serves a new service on it; `*port` is the bound
  // port. Errors: UNAVAILABLE when the port cannot be bound.
  absl::StatusOr<std::unique_ptr<Listener>> StartGrpc(const std::string& listen, int* port);
  // The watchdog's rebuild: shuts the dead listening socket down and starts
  // one more gRPC server on the same port with a new service. The servers
  // before it keep their connections, so members' sessions live on.
  absl::Status RebuildListener(absl::Duration waited);
  // Shuts every gRPC server down by `deadline`, a time of clock()->Now()
  // (the watchdog stopped).
  void ShutDownServers(absl::Time deadline);
  // options_.coordinator.clock.
  Clock* clock() const { return options_.coordinator.clock; }

  ServerOptions options_;
  absl::Mutex ended_mu_;
  std::string ended_ ABSL_GUARDED_BY(ended_mu_);
  std::string lost_lease_ ABSL_GUARDED_BY(ended_mu_);
  // The lease's epoch held (0: no state dir, no lease).
  uint64_t epoch_ = 0;
  std::unique_ptr<StateStore> store_;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<StatusPage> status_page_;
  std::shared_ptr<grpc::ServerCredentials> credentials_;
  int port_ = 0;
  absl::Mutex servers_mu_;
  // A gRPC server with its service and its Session streams' queues (the
  // server is destroyed first: declared last).
  struct Listener {
    std::unique_ptr<CoordinatorService> service;
    std::unique_ptr<AsyncBidiServer<v1::SessionRequest, v1::SessionEvent>> sessions;
    std::unique_ptr<grpc::Server> server;
  };
  // The first listener and one more per rebuilt one.
  std::vector<std::unique_ptr<Listener>> listeners_ ABSL_GUARDED_BY(servers_mu_);
  // Stopped before the servers shut down.
  std::unique_ptr<ListenerWatchdog> watchdog_;
  std::once_flag stop_once_;
  absl::Notification stop_requested_;
  absl::Notification stopped_;
  std::thread ticker_;
  std::thread stopper_;
};

}  // namespace muster

#endif  // MUSTER_COORDINATOR_SERVER_H_
