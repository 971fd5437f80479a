#include "coordinator/lease.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace muster {

absl::StatusOr<std::optional<Lease>> LeaseClaim::Poll(absl::Time now) {
  MUSTER_ASSIGN_OR_RETURN(Lease lease, store_->ReadLease());
  const bool free = lease.epoch == 0 || lease.holder.empty() || lease.holder == holder_;
  if (!free) {
    if (!watching_ || lease.epoch != seen_.epoch || lease.beats != seen_.beats) {
      watching_ = true;
      seen_ = lease;
      still_since_ = now;
      return std::nullopt;
    }
    if (now - still_since_ < timeout_) return std::nullopt;
  }
  absl::StatusOr<Lease> taken = store_->TakeLease(lease, holder_);
  if (absl::IsAborted(taken.status())) {
    watching_ = false;  // another coordinator was faster: watch it
    return std::nullopt;
  }
  MUSTER_RETURN_IF_ERROR(taken.status());
  seen_ = *taken;
  return *taken;
}

bool LeaseRenewal::BeatDue(absl::Time now) {
  if (now < next_beat_) return false;
  next_beat_ = now + timeout_ / 4;
  return true;
}

absl::Status LeaseTakenOver(uint64_t mine, const Lease& now) {
  return absl::AbortedError(absl::StrCat("this coordinator's lease (epoch ", mine,
                                         ") was taken over: epoch ", now.epoch, " is held by ",
                                         now.holder));
}

absl::Status CheckLeaseHeld(StateStore* store, uint64_t epoch) {
  MUSTER_ASSIGN_OR_RETURN(Lease lease, store->ReadLease());
  if (lease.epoch == epoch) return absl::OkStatus();
  return LeaseTakenOver(epoch, lease);
}

}  // namespace muster
