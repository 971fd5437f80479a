// Small host values (control words, counters, digests, metrics) through a
// communicator on any memory: passed as they are to a communicator on host
// memory, and through a device copy to one on a GPU's memory.
#ifndef MUSTER_TRAINER_COMM_VALUES_H_
#define MUSTER_TRAINER_COMM_VALUES_H_

#include <cstddef>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "trainer/comm/communicator.h"

namespace muster {

// In place over `count` host values; the communicator's errors.
absl::Status AllReduceValues(Communicator* comm, void* data, size_t count, DataType type,
                             ReduceOp op, absl::Time deadline);
absl::Status BroadcastValues(Communicator* comm, void* data, size_t count, DataType type,
                             int root, absl::Time deadline);
// Communicator::AllGather's layout: `counts` values per rank, each rank's
// own segment filled in.
absl::Status AllGatherValues(Communicator* comm, void* data, const std::vector<size_t>& counts,
                             DataType type, absl::Time deadline);

}  // namespace muster

#endif  // MUSTER_TRAINER_COMM_VALUES_H_
