// LeaseClaim: how a coordinator comes to hold the lease on its state dir,
// the one writer of a job's state (docs/failover.md).
//
// A coordinator takes the lease at once when nobody holds it (never taken,
// or released by a coordinator that stopped), or when its holder is this
// coordinator's own advertised address (a restart: the old process is
// gone, as two cannot listen on one address). Otherwise it
// is a standby: it watches the lease's beats, which the holder adds every
// quarter of the timeout, and takes over in the next epoch once they have
// not moved for `timeout` by its own clock (no clocks of two nodes are
// compared). The store is then fenced (StateStore::TakeLease): the old
// holder can commit nothing more, and exits when its next renewal fails.
//
// Thread-compatible.
#ifndef MUSTER_COORDINATOR_LEASE_H_
#define MUSTER_COORDINATOR_LEASE_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/state_store.h"

namespace muster {

class LeaseClaim {
 public:
  LeaseClaim(StateStore* store, std::string holder, absl::Duration timeout)
      : store_(store), holder_(std::move(holder)), timeout_(timeout) {}

  // One look at the lease at `now`: the lease once this coordinator holds
  // it, nullopt while another holder's beats still move (or stopped less
  // than `timeout` ago). Errors: the store's.
  absl::StatusOr<std::optional<Lease>> Poll(absl::Time now);

  // The lease as last seen (for messages).
  const Lease& seen() const { return seen_; }

 private:
  StateStore* const store_;
  const std::string holder_;
  const absl::Duration timeout_;
  bool watching_ = false;
  Lease seen_;
  absl::Time still_since_;
};

}  // namespace muster

#endif  // MUSTER_COORDINATOR_LEASE_H_
