// Relay: a transparent gRPC relay in front of the coordinator
// (muster-relay, docs/relay.md). Each call it accepts, whatever its method,
// goes on as one call to the coordinator over a few shared connections:
// the messages both ways as bytes, untouched, the caller's metadata (the
// job token with it), its deadline and cancellation, the coordinator's
// status and trailing metadata back. The relay adds one entry: the
// caller's host (kForwardedHostMetadata), which the coordinator would
// otherwise take from the connection and which is then the relay's.
//
// What it is for: a node's agent holds one stream to the coordinator, so
// a job of N nodes costs the coordinator N connections; a few relays bring
// that down to a few connections carrying the same N streams
// (docs/scale.md).
//
// Thread-safety: Start, port and Shutdown may be called from any thread;
// calls are relayed on gRPC's threads.
#ifndef MUSTER_RELAY_RELAY_H_
#define MUSTER_RELAY_RELAY_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "rpc/tls_files.h"

namespace muster {

struct RelayOptions {
  std::string listen = "0.0.0.0:29401";  // host:port served to agents and trainers
  // The coordinator: host:port, file:PATH (its address file, followed on
  // failover) or a list of these (rpc/coordinator_channel.h).
  std::string coordinator;
  int connections = 1;      // connections to the coordinator, used in turn
  TlsFiles tls;             // served to callers (cert, key; ca for mTLS)
  TlsFiles coordinator_tls; // towards the coordinator
  // When set, a call without this job token is refused here instead of at
  // the coordinator.
  std::string token;
  // Largest message a caller may send (the coordinator's own limit, so
  // that nothing larger is buffered here first).
  int max_message_bytes = 4 << 20;
};

// Counts since Start.
struct RelayCounts {
  uint64_t calls = 0;     // calls accepted
  uint64_t refused = 0;   // of them, refused here (the token)
  uint64_t open = 0;      // calls under way now
};

class Relay {
 public:
  // Listens and starts relaying. Errors: INVALID_ARGUMENT (no coordinator,
  // connections out of 1..64, TLS files that do not go together),
  // NOT_FOUND (a TLS file that cannot be read), UNAVAILABLE (cannot listen).
  static absl::StatusOr<std::unique_ptr<Relay>> Start(const RelayOptions& options);
  ~Relay();  // Shutdown()

  int port() const;  // the port it listens on (the bound one for ":0")
  RelayCounts counts() const;
  // Ends every call under way (CANCELLED to their callers) and stops
  // listening. Idempotent.
  void Shutdown();

  class Impl;

 private:
  explicit Relay(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace muster

#endif  // MUSTER_RELAY_RELAY_H_
