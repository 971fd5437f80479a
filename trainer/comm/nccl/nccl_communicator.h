// NCCL: the GPU communicator. The unique id travels through the Store (the
// coordinator's KV); the communicator is created non-blocking and every
// collective runs on the communicator's own CUDA stream, watched by the
// calling thread: it polls the stream and ncclCommGetAsyncError until the
// work is done, the deadline passes or Abort() is called, and then calls
// ncclCommAbort so that a dead or hung peer never hangs this rank.
//
// Buffers are device pointers on `device`. Data types: float32, float16,
// bfloat16, float64, int64.
#ifndef MUSTER_TRAINER_COMM_NCCL_NCCL_COMMUNICATOR_H_
#define MUSTER_TRAINER_COMM_NCCL_NCCL_COMMUNICATOR_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "trainer/comm/communicator.h"
#include "trainer/comm/store.h"

namespace muster {

// Errors: FAILED_PRECONDITION (no usable GPU), DEADLINE_EXCEEDED (peers did
// not join in time), UNAVAILABLE/ABORTED (NCCL errors).
absl::StatusOr<std::unique_ptr<Communicator>> NewNcclCommunicator(Store* store, int rank,
                                                                  int size, int device,
                                                                  absl::Time deadline);

// Number of CUDA devices this process can use (0 without a driver or GPU).
int CudaDeviceCount();

}  // namespace muster

#endif  // MUSTER_TRAINER_COMM_NCCL_NCCL_COMMUNICATOR_H_
