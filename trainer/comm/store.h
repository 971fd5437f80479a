// Store: the key-value rendezvous that communicators bootstrap through
// (NCCL unique ids, Gloo addresses, shared-memory segment names). In
// production it is the coordinator's KV of the current generation; keys are
// namespaced with a prefix per communicator
// (trainer/client/coordinator_store.h).
//
// Implementations are thread-safe.
#ifndef MUSTER_TRAINER_COMM_STORE_H_
#define MUSTER_TRAINER_COMM_STORE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace muster {

class Store {
 public:
  virtual ~Store() = default;
  // Errors: DEADLINE_EXCEEDED, ABORTED (the generation is over),
  // INVALID_ARGUMENT (key or value over the limits).
  virtual absl::Status Set(const std::string& key, const std::string& value,
                           absl::Time deadline) = 0;
  // Values of every key once all exist. Errors: as Set.
  virtual absl::StatusOr<std::vector<std::string>> Wait(const std::vector<std::string>& keys,
                                                        absl::Time deadline) = 0;
  // Whether this store's generation is known to be over (a newer world
  // exists): a communicator that waits for its peers outside the store, as
  // shared memory's first barrier does, gives up with ABORTED rather than
  // wait for peers that have moved on. Cheap; polled while waiting.
  virtual bool Over() const { return false; }
};

// Keys of `base` under "prefix/". `base` must outlive the returned store.
std::unique_ptr<Store> NewPrefixStore(Store* base, std::string prefix);

}  // namespace muster

#endif  // MUSTER_TRAINER_COMM_STORE_H_
