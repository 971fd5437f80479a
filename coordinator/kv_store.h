// KvStore: the key-value store of one generation, used to bootstrap
// communicators (NCCL unique ids, Gloo rendezvous). Set, get, blocking wait
// with a deadline, atomic add and compare-and-set.
//
// Keys are valid for one generation: Reset() drops them and fails every
// waiter with ABORTED. Blocking is expressed as callbacks, queued on the
// caller's Actions, so the class never sleeps and is driven by Expire(now).
//
// Not thread-safe: owned by Coordinator and used under its mutex.
#ifndef MUSTER_COORDINATOR_KV_STORE_H_
#define MUSTER_COORDINATOR_KV_STORE_H_

#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/actions.h"
#include "coordinator/limits.h"

namespace muster {

struct CasResult {
  bool swapped = false;
  std::optional<std::string> current;  // the value after the call
};

class KvStore {
 public:
  using GetCallback = std::function<void(absl::StatusOr<std::vector<std::string>>)>;

  explicit KvStore(const Limits& limits) : limits_(limits) {}

  // Drops every key and fails every waiter with ABORTED naming `reason`.
  void Reset(const std::string& reason, Actions* actions);
  // The same, failing the waiters with `status`.
  void Reset(const absl::Status& status, Actions* actions);

  // Stores `value` under `key` and completes waiters that now have all
  // their keys. Errors: INVALID_ARGUMENT (key empty or too long, value too
  // large), RESOURCE_EXHAUSTED (too many keys or bytes in this generation).
  absl::Status Set(const std::string& key, std::string value, Actions* actions);

  // Values of `keys`, in order. Errors: INVALID_ARGUMENT (no keys, too many,
  // bad key), NOT_FOUND naming the first missing key.
  absl::StatusOr<std::vector<std::string>> Get(const std::vector<std::string>& keys) const;

  // Calls `done` (through `actions`) with the values once every key exists,
  // with DEADLINE_EXCEEDED at `deadline`, or with ABORTED on Reset. Argument
  // errors are reported at once.
  void Wait(std::vector<std::string> keys, absl::Time deadline, GetCallback done,
            Actions* actions);

  // Adds `delta` to the key's value read as a decimal int64 (missing: 0).
  // Errors: as Set, and INVALID_ARGUMENT when the value is not an integer
  // or the sum overflows.
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta, Actions* actions);

  // Sets `desired` if the key holds `expected` (nullopt: the key must be
  // absent). Errors: as Set.
  absl::StatusOr<CasResult> CompareAndSet(const std::string& key,
                                          const std::optional<std::string>& expected,
                                          std::string desired, Actions* actions);

  // Fails waiters whose deadline is at or before `now`.
  void Expire(absl::Time now, Actions* actions);

  size_t key_count() const { return values_.size(); }
  size_t waiter_count() const { return waiters_.size(); }

 private:
  struct Waiter {
    std::vector<std::string> keys;
    absl::Time deadline;
    GetCallback done;
    std::string missing;  // the key it is filed under in waiting_on_
  };
  using WaiterList = std::list<Waiter>;

  absl::Status CheckKey(const std::string& key) const;
  absl::Status Store(const std::string& key, std::string value, Actions* actions);
  // Completes the waiters filed under `key`, or files them under the next
  // key they miss.
  void Notify(const std::string& key, Actions* actions);
  // Files `w` under its first missing key; false when it misses none.
  bool File(WaiterList::iterator w);
  void Unfile(WaiterList::iterator w);

  Limits limits_;
  std::map<std::string, std::string> values_;
  size_t bytes_ = 0;
  WaiterList waiters_;
  // Waiters by the first key they miss: a Set looks only at its key's.
  absl::flat_hash_map<std::string, std::vector<WaiterList::iterator>> waiting_on_;
};

}  // namespace muster

#endif  // MUSTER_COORDINATOR_KV_STORE_H_
