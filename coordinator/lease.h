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
// LeaseRenewal is the holder's side: when it beats, and whether it still
// acts on time.
//
// Every time here is the local clock's monotonic Now() (common/clock.h):
// nothing of it is stored (the lease holds a beat counter), and a wall
// clock step neither hides a holder that stopped beating nor makes a
// beating holder doubt its lease.
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

// The holder's timing: it beats (StateStore::RenewLease) every quarter of
// `timeout`, and while no beat succeeded for `timeout` it is not sure of
// the lease any more (a standby may have taken it over) and must decide
// nothing on time: a coordinator frozen past the timeout finds out that it
// lost the lease before it fails members that were never gone.
class LeaseRenewal {
 public:
  // The lease was taken (or last renewed) at `now`.
  LeaseRenewal(absl::Duration timeout, absl::Time now)
      : timeout_(timeout), next_beat_(now + timeout / 4), renewed_(now) {}

  // Whether a beat is due at `now`; when it is, the next one falls due a
  // quarter of the timeout later, whether this one succeeds or not.
  bool BeatDue(absl::Time now);
  // A beat succeeded at `now`.
  void Renewed(absl::Time now) { renewed_ = now; }
  // The next BeatDue is true, whenever it is asked.
  void BeatNow() { next_beat_ = absl::InfinitePast(); }
  // Whether, at `now`, a beat succeeded within the timeout.
  bool Sure(absl::Time now) const { return now - renewed_ <= timeout_; }

 private:
  const absl::Duration timeout_;
  absl::Time next_beat_;
  absl::Time renewed_;
};

// What a holder of `mine` is told once another coordinator took the lease
// over (ABORTED; the coordinator exits 4 on it, docs/failover.md).
absl::Status LeaseTakenOver(uint64_t mine, const Lease& now);

// A holder's check that it still holds the lease in `epoch`, without a
// beat: a coordinator that hears from none of its members lets its lease
// lapse (a standby may take over) and looks, at each beat it leaves out,
// whether one did. OK while the lease is still in `epoch`; LeaseTakenOver's
// ABORTED once another coordinator holds it. Errors: the store's.
absl::Status CheckLeaseHeld(StateStore* store, uint64_t epoch);

}  // namespace muster

#endif  // MUSTER_COORDINATOR_LEASE_H_
