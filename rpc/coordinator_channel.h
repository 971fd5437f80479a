// CoordinatorChannel: a client's channel to the coordinator, which may move.
//
// A target is "host:port", or "file:PATH": the address file that the
// coordinator holding the lease on the job's state writes (docs/failover.md).
// For a file target, Refresh() reads the file again and, when the address
// changed, makes a new channel; callers refresh before they reconnect.
// Until the file exists, the channel points at an address that fails at
// once (UNAVAILABLE), so retry loops go on as for a coordinator not up yet.
//
// Thread-safe.
#ifndef MUSTER_RPC_COORDINATOR_CHANNEL_H_
#define MUSTER_RPC_COORDINATOR_CHANNEL_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "rpc/tls_files.h"

namespace muster {

// The address a target names now: itself, or the first line of its file.
// Errors: INVALID_ARGUMENT (empty), UNAVAILABLE naming the file when it
// cannot be read or holds no address.
absl::StatusOr<std::string> ResolveCoordinator(const std::string& target);

class CoordinatorChannel {
 public:
  // Errors: INVALID_ARGUMENT (an empty target), MakeChannel's.
  static absl::StatusOr<std::unique_ptr<CoordinatorChannel>> Create(const std::string& target,
                                                                    const TlsFiles& tls);

  std::shared_ptr<grpc::Channel> get();
  // The address the channel goes to.
  std::string address();
  // File targets: reads the file again; true when the channel changed.
  bool Refresh();

 private:
  CoordinatorChannel(std::string target, TlsFiles tls)
      : target_(std::move(target)), tls_(std::move(tls)) {}

  const std::string target_;
  const TlsFiles tls_;
  absl::Mutex mu_;
  std::string address_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<grpc::Channel> channel_ ABSL_GUARDED_BY(mu_);
};

}  // namespace muster

#endif  // MUSTER_RPC_COORDINATOR_CHANNEL_H_
