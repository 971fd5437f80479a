// CoordinatorChannel: a client's channel to the coordinator, which may move.
//
// A target is "host:port", or "file:PATH": the address file that the
// coordinator holding the lease on the job's state writes (docs/failover.md),
// or a comma-separated list of these, tried in turn: a relay first, then
// the coordinator itself (docs/relay.md).
// For a file target, Refresh() reads the file again and, when the address
// changed, makes a new channel; callers refresh before they reconnect.
// Until the file exists, the channel points at an address that fails at
// once (UNAVAILABLE), so retry loops go on as for a coordinator not up yet.
// For a list, Refresh() moves on to the next entry (after the last, the
// first again) when the channel failed to connect (TRANSIENT_FAILURE), and
// stays on an entry that answers.
//
// Thread-safe.
#ifndef MUSTER_RPC_COORDINATOR_CHANNEL_H_
#define MUSTER_RPC_COORDINATOR_CHANNEL_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "rpc/tls_files.h"

namespace muster {

// The address a target names now: itself, or the first line of its file;
// for a list, its first entry's. Errors: INVALID_ARGUMENT (empty), UNAVAILABLE naming the file when it
// cannot be read or holds no address.
absl::StatusOr<std::string> ResolveCoordinator(const std::string& target);

class CoordinatorChannel {
 public:
  // `connection` as MakeChannel's. Errors: INVALID_ARGUMENT (an empty
  // target or list entry), MakeChannel's.
  static absl::StatusOr<std::unique_ptr<CoordinatorChannel>> Create(const std::string& target,
                                                                    const TlsFiles& tls,
                                                                    int connection = -1);

  std::shared_ptr<grpc::Channel> get();
  // The address the channel goes to.
  std::string address();
  // Reads a file target again, or moves on in a list (above); true when
  // the channel changed.
  bool Refresh();
  // For a list: the entry in use did not answer in time (a host that is
  // gone rather than refusing), so the next Refresh moves on as for one
  // that failed to connect. No-op for a single target. `wrap` false: not
  // from the last entry back to the first (a stream that went silent on
  // the coordinator after its relays is no reason to go back to them).
  void MoveOn(bool wrap = true);

 private:
  CoordinatorChannel(std::vector<std::string> targets, TlsFiles tls, int connection)
      : targets_(std::move(targets)), tls_(std::move(tls)), connection_(connection) {}

  const std::vector<std::string> targets_;
  const TlsFiles tls_;
  const int connection_;
  absl::Mutex mu_;
  size_t current_ ABSL_GUARDED_BY(mu_) = 0;  // the entry of targets_ in use
  bool move_on_ ABSL_GUARDED_BY(mu_) = false;  // MoveOn was called
  std::string address_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<grpc::Channel> channel_ ABSL_GUARDED_BY(mu_);
};

}  // namespace muster

#endif  // MUSTER_RPC_COORDINATOR_CHANNEL_H_
