// Shared memory: the CPU communicator among the ranks of one node.
//
// One POSIX shared-memory segment per node, job and generation (its name is
// published through the Store), holding a control block and double-buffered
// staging areas. Collectives run in rounds: each rank copies the parts of its
// buffer that other ranks reduce into its staging slot, each rank reduces its
// own segment reading the others' slots, and each copies the reduced
// segments back (2 barriers per round). Waiting spins, then yields, then
// sleeps, and checks the deadline, the abort flag (shared by the node's
// ranks) and whether the peer processes are still alive.
//
// The segment's name is unlinked as soon as every rank has mapped it, so a
// crash leaves nothing behind in /dev/shm; names of older generations that a
// crash left before that point are removed when the next one is created.
#ifndef MUSTER_TRAINER_COMM_SHM_SHM_COMMUNICATOR_H_
#define MUSTER_TRAINER_COMM_SHM_SHM_COMMUNICATOR_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "trainer/comm/communicator.h"
#include "trainer/comm/store.h"

namespace muster {

struct ShmOptions {
  std::string job = "job";  // names the segment; letters, digits, '-' and '_'
  uint64_t generation = 0;
  std::string node = "node";
  // Bytes of one rank's staging slot per round.
  size_t slot_bytes = 2 << 20;
  // Deadlines are times of its Now(). Required, not owned, must outlive the
  // communicator.
  Clock* clock = nullptr;
};

// Maps the node's segment (local rank 0 creates it) by `deadline`, a time
// of options.clock's Now(). Errors:
// DEADLINE_EXCEEDED, UNAVAILABLE (shm_open/mmap failed, e.g. /dev/shm full),
// FAILED_PRECONDITION (a segment of another size or version), INVALID_ARGUMENT.
absl::StatusOr<std::unique_ptr<Communicator>> NewShmCommunicator(Store* store, int rank,
                                                                 int size,
                                                                 const ShmOptions& options,
                                                                 absl::Time deadline);

// Names of this job's segments currently in /dev/shm (for tests and
// cleanup checks).
std::vector<std::string> ListShmSegments(const std::string& job);

}  // namespace muster

#endif  // MUSTER_TRAINER_COMM_SHM_SHM_COMMUNICATOR_H_
