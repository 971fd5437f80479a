// The buffer contract, checked: a communicator that passes every call on to
// `inner` after checking that the buffer lies in inner->memory() (host
// memory the process can read, or device memory of the declared GPU). A
// buffer elsewhere gets INVALID_ARGUMENT naming the call, the buffer and the
// memory the communicator takes; `inner` never sees it. The test suites and
// $MUSTER_CHECK_BUFFERS=1 wrap every communicator in it.
#ifndef MUSTER_TRAINER_COMM_CHECKED_H_
#define MUSTER_TRAINER_COMM_CHECKED_H_

#include <memory>

#include "trainer/comm/communicator.h"

namespace muster {

std::unique_ptr<Communicator> NewMemoryChecked(std::unique_ptr<Communicator> inner);

// OK if [data, data + bytes) lies in `space`; else INVALID_ARGUMENT.
absl::Status CheckBufferIn(const MemorySpace& space, const void* data, size_t bytes);

}  // namespace muster

#endif  // MUSTER_TRAINER_COMM_CHECKED_H_
