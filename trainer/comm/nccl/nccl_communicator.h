// NCCL: the GPU communicator. The unique id travels through the Store (the
// coordinator's KV); the communicator is created non-blocking and every
// collective runs on the communicator's own CUDA stream, watched by the
// calling thread: it polls the stream and ncclCommGetAsyncError until the
// work is done, the deadline passes or Abort() is called, and then calls
// ncclCommAbort so that a dead or hung peer never hangs this rank.
//
// A `shrinkable` communicator (a node's, of several ranks) is revoked
// instead (ncclCommRevoke, NCCL >= 2.28.7): its work in flight stops as
// with an abort, and a regroup that only lost members of the node shrinks
// it (Communicator::Shrink, ncclCommShrink, NCCL >= 2.27.3) instead of
// building a new one (node_comm.h). With older NCCL it aborts and builds.
//
// Ordering: a collective first waits (on the GPU, through an event) for the
// work already queued on the caller's stream, which is what wrote the
// buffer, and the caller's stream then waits for the collective. The
// caller's stream comes from `caller_stream` (LibTorch's current stream on
// the calling thread); without one it is CUDA's legacy default stream.
//
// Buffers are device pointers on `device`. Data types: float32, float16,
// bfloat16, float64, int64.
#ifndef MUSTER_TRAINER_COMM_NCCL_NCCL_COMMUNICATOR_H_
#define MUSTER_TRAINER_COMM_NCCL_NCCL_COMMUNICATOR_H_

#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "trainer/comm/communicator.h"
#include "trainer/comm/hierarchical.h"
#include "trainer/comm/store.h"

namespace muster {

// The cudaStream_t whose queued work a collective follows; null: the legacy
// default stream.
using CallerStreamFn = std::function<void*()>;

// `deadline` and the collectives' deadlines are times of `clock`'s Now();
// `clock`: required, not owned, must outlive the communicator.
// Errors: FAILED_PRECONDITION (no usable GPU), DEADLINE_EXCEEDED (peers did
// not join in time), UNAVAILABLE/ABORTED (NCCL errors).
absl::StatusOr<std::unique_ptr<Communicator>> NewNcclCommunicator(
    Store* store, int rank, int size, int device, absl::Time deadline, Clock* clock,
    CallerStreamFn caller_stream = nullptr, bool shrinkable = false);

// A communicator on device memory of `device` over `host`, a communicator on
// host memory (Gloo across nodes): each collective copies the buffer into a
// pinned host buffer, kept and reused, runs `host`'s collective and copies
// the result back, ordered after the caller's stream as NCCL is.
// `chunk_bytes` 0: the whole buffer at a time, the host waiting for each
// copy; > 0: pipelined in chunks of about that size (staged.h), the copies
// back followed by the caller's stream, not waited for.
std::unique_ptr<Communicator> NewCudaStagedCommunicator(std::unique_ptr<Communicator> host,
                                                        int device,
                                                        CallerStreamFn caller_stream = nullptr,
                                                        size_t chunk_bytes = 0);

// Zero, divide, compress and widen on device memory of `device`, queued
// on the caller's stream (for the hierarchical composition on GPUs, and
// gradient compression over a flat NCCL world: compressed.h).
std::unique_ptr<BufferOps> NewCudaBufferOps(int device, CallerStreamFn caller_stream = nullptr);

// Copies `bytes` of host memory at `host` to a new buffer on `device`, runs
// `op` on it and copies the result back (small values; synchronous).
absl::Status WithCudaCopy(int device, void* host, size_t bytes,
                          const std::function<absl::Status(void*)>& op);

// Number of CUDA devices this process can use (0 without a driver or GPU).
int CudaDeviceCount();

// Whether [data, data + bytes) is memory of CUDA device `device` (any
// device when negative).
bool IsCudaDeviceMemory(const void* data, size_t bytes, int device);

}  // namespace muster

#endif  // MUSTER_TRAINER_COMM_NCCL_NCCL_COMMUNICATOR_H_
