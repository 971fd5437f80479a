#include "coordinator/arrival_deadline.h"

namespace muster {

void ArrivalDeadline::Set(absl::Time formed_at, absl::Duration window) {
  window_ = window;
  arrive_by_ = formed_at + window;
}

void ArrivalDeadline::Clear() { arrive_by_ = absl::InfiniteFuture(); }

bool ArrivalDeadline::Due(absl::Time now) const { return now >= arrive_by_; }

}  // namespace muster
