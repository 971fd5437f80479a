#include "trainer/elastic/collective_deadline.h"

#include <algorithm>

namespace muster {

void CollectiveDeadline::StepTook(absl::Duration took) {
  recent_.push_back(took);
  while (static_cast<int>(recent_.size()) > options_.window) recent_.pop_front();
  ++timed_;
}

bool CollectiveDeadline::TakeTiming() {
  const bool take = !skip_next_;
  skip_next_ = false;
  return take;
}

absl::Duration CollectiveDeadline::Current() const {
  if (options_.fixed > absl::ZeroDuration()) return options_.fixed;
  if (timed_ < options_.warm_steps || recent_.empty()) return options_.cold;
  const absl::Duration slowest = *std::max_element(recent_.begin(), recent_.end());
  return std::max(options_.floor, slowest * options_.multiple);
}

absl::Duration CollectiveDeadline::Long() const { return std::max(Current(), options_.cold); }

}  // namespace muster
