// StateServer: a trainer's state service (protos/muster/v1/state.proto).
//
// The training thread owns the state, so the server never reads tensors: a
// PullState call registers what step it wants and waits; at each step
// boundary the training thread asks Wanted(step) (one atomic load) and, when
// a call waits for that step, encodes its state and hands it over with
// Publish(). The calls then stream the bytes in 1 MiB chunks from their own
// threads while training goes on.
//
// No gRPC or LibTorch in this header. Thread-safe: Wanted/Publish from the
// training thread, the rest from anywhere.
#ifndef MUSTER_TRAINER_ELASTIC_STATE_SERVER_H_
#define MUSTER_TRAINER_ELASTIC_STATE_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "rpc/tls_files.h"

namespace muster {

struct StateServerOptions {
  std::string listen = "0.0.0.0:0";  // host:port; port 0 picks a free one
  std::string token;                 // job token callers must present ("" = none)
  TlsFiles tls;                      // cert + key: serve TLS
  std::string member_id;             // named in every answer
  // Times the calls' waits and the shutdown's grace. Required, not owned,
  // must outlive the server.
  Clock* clock = nullptr;
};

// Where the state service listens: `listen` as given, except that without
// a job token (nobody can be told apart) a wildcard host (0.0.0.0, [::] or
// none) becomes 127.0.0.1, so that the weights are not served to the
// network. An explicit address is kept.
std::string StateListenAddress(const std::string& listen, const std::string& token);

class StateServer {
 public:
  // Errors: INVALID_ARGUMENT (bad TLS files, no clock), UNAVAILABLE (cannot
  // bind).
  static absl::StatusOr<std::unique_ptr<StateServer>> Start(StateServerOptions options);
  virtual ~StateServer() = default;

  // The port it listens on.
  virtual int port() const = 0;
  // True when a call waits for the state after `step` (or an earlier one).
  virtual bool Wanted(int64_t step) const = 0;
  // The state after `step`, encoded as one safetensors file.
  virtual void Publish(int64_t step, uint64_t generation, std::string safetensors) = 0;
  // The bytes of the image it serves now (0 before the first Publish).
  virtual int64_t held_bytes() const = 0;
  // Ends waiting calls (UNAVAILABLE) and stops serving. Idempotent.
  virtual void Shutdown() = 0;
};

}  // namespace muster

#endif  // MUSTER_TRAINER_ELASTIC_STATE_SERVER_H_
