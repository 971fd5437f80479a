#include "coordinator/barrier.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace muster {

void Barriers::Arrive(const std::string& name, const std::string& member,
                      uint32_t world_size, absl::Time deadline, Callback done,
                      Actions* actions) {
  Barrier& b = barriers_[name];
  if (b.released) {
    actions->Add([done = std::move(done)] { done(absl::OkStatus()); });
    return;
  }
  b.arrived.insert(member);
  b.waiters.push_back(Waiter{deadline, std::move(done)});
  if (b.arrived.size() >= world_size) {
    b.released = true;
    for (Waiter& w : b.waiters) {
      actions->Add([done = std::move(w.done)] { done(absl::OkStatus()); });
    }
    b.waiters.clear();
  }
}

void Barriers::Reset(const std::string& reason, Actions* actions) {
  Reset(absl::AbortedError(reason), actions);
}

void Barriers::Reset(const absl::Status& status, Actions* actions) {
  for (auto& [name, b] : barriers_) {
    for (Waiter& w : b.waiters) {
      actions->Add([done = std::move(w.done), status] { done(status); });
    }
  }
  barriers_.clear();
}

void Barriers::Expire(absl::Time now, Actions* actions) {
  for (auto& [name, b] : barriers_) {
    for (auto it = b.waiters.begin(); it != b.waiters.end();) {
      if (it->deadline <= now) {
        actions->Add([done = std::move(it->done), name = name,
                      arrived = b.arrived.size()] {
          done(absl::DeadlineExceededError(absl::StrCat(
              "barrier ", name, " timed out with ", arrived, " members arrived")));
        });
        it = b.waiters.erase(it);
      } else {
        ++it;
      }
    }
  }
}

size_t Barriers::waiter_count() const {
  size_t n = 0;
  for (const auto& [name, b] : barriers_) n += b.waiters.size();
  return n;
}

}  // namespace muster
