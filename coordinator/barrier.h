// Barriers: named meeting points for every member of one generation.
//
// A barrier releases once each member of the world has arrived; a name is
// used once per generation (arriving again after the release returns at
// once, which makes retries safe). Reset() fails every waiter with ABORTED.
//
// Not thread-safe: owned by Coordinator and used under its mutex.
#ifndef MUSTER_COORDINATOR_BARRIER_H_
#define MUSTER_COORDINATOR_BARRIER_H_

#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "coordinator/actions.h"

namespace muster {

class Barriers {
 public:
  using Callback = std::function<void(absl::Status)>;

  // Records `member`'s arrival at `name` for a world of `world_size`; `done`
  // runs (through `actions`) when all have arrived, at `deadline` with
  // DEADLINE_EXCEEDED (the arrival stays counted), or on Reset with ABORTED.
  void Arrive(const std::string& name, const std::string& member, uint32_t world_size,
              absl::Time deadline, Callback done, Actions* actions);

  void Reset(const std::string& reason, Actions* actions);
  // The same, failing the waiters with `status`.
  void Reset(const absl::Status& status, Actions* actions);
  void Expire(absl::Time now, Actions* actions);

  size_t waiter_count() const;

 private:
  struct Waiter {
    absl::Time deadline;
    Callback done;
  };
  struct Barrier {
    std::set<std::string> arrived;
    std::vector<Waiter> waiters;
    bool released = false;
  };
  std::map<std::string, Barrier> barriers_;
};

}  // namespace muster

#endif  // MUSTER_COORDINATOR_BARRIER_H_
