#include "common/backoff.h"

#include <algorithm>

namespace muster {

Backoff::Backoff(BackoffOptions options, uint64_t /*seed*/)
    : options_(options), ceiling_(options.initial) {}

absl::Duration Backoff::Next() {
  ++attempts_;
  const absl::Duration ceiling = ceiling_;
  ceiling_ = std::min(options_.max, ceiling_ * options_.multiplier);
  const double fraction = absl::Uniform(gen_, 0.5, 1.0);
  return ceiling * fraction;
}

void Backoff::Reset() {
  ceiling_ = options_.initial;
  attempts_ = 0;
}

}  // namespace muster
