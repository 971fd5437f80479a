// Pipelined staging: a communicator on memory that its transport cannot
// reach (a GPU's, with Gloo across nodes) over a communicator on host
// memory. A collective's buffer is cut into chunks; every chunk's copy to
// the host is queued at once, and as each arrives the host collective runs
// on it while the later chunks are still copying in, and its result is
// queued back at once while the next chunk is reduced. Nothing waits on the
// host for the copies back: the caller's work queue follows them
// (StagingCopies::Finish). Gloo's own CUDA algorithms pipeline the same way.
//
// The copies come in through StagingCopies, so the chunking and ordering
// are tested on the CPU with host copies; the CUDA copies (two streams,
// one event per chunk, pinned host memory) are in nccl/cuda_staged.cc.
//
// Results: AllReduce and Broadcast are cut into chunks; an element-wise
// reduction of a chunk is the reduction of those elements, so for two ranks
// (a + b = b + a in IEEE arithmetic) and for broadcasts the result is bit
// for bit the unpipelined one. With more ranks a ring's order of additions
// for an element depends on where the element falls in the buffer it was
// given, so float sums may differ in the last bits from the whole-buffer
// reduction (as between any two chunk sizes). ReduceScatter and AllGather
// travel as one chunk (their per-rank counts are not cut).
#ifndef MUSTER_TRAINER_COMM_STAGED_H_
#define MUSTER_TRAINER_COMM_STAGED_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "trainer/comm/communicator.h"

namespace muster {

// Bytes [offset, offset + bytes) of a staged buffer.
struct StagedChunk {
  size_t offset = 0;
  size_t bytes = 0;
};

// Pure: `bytes` cut into chunks of `chunk_bytes` (rounded down to whole
// elements of `element_bytes`, at least one element), in order; the last
// one holds the rest. No chunks for 0 bytes; one chunk when chunk_bytes is
// 0 or not smaller than `bytes`.
std::vector<StagedChunk> PlanStagedChunks(size_t bytes, size_t element_bytes, size_t chunk_bytes);

// The copies between the buffer's memory and host memory, queued
// asynchronously where the memory allows.
class StagingCopies {
 public:
  virtual ~StagingCopies() = default;
  // Host memory for a collective on `bytes` at `data`, in `chunks` chunks,
  // ordered after the caller's work queued so far; valid until the next
  // Begin. Errors: UNAVAILABLE (allocation, the device).
  virtual absl::StatusOr<void*> Begin(void* data, size_t bytes, size_t chunks) = 0;
  // Queues chunk `index` from the buffer into the host memory.
  virtual absl::Status QueueToHost(size_t index, const StagedChunk& chunk) = 0;
  // Blocks until chunk `index` is in the host memory.
  virtual absl::Status WaitToHost(size_t index) = 0;
  // Queues chunk `index` back from the host memory into the buffer.
  virtual absl::Status QueueToBuffer(size_t index, const StagedChunk& chunk) = 0;
  // The caller's work queued from now on follows every copy back.
  virtual absl::Status Finish() = 0;
};

// Runs `op` on each chunk's host copy (its address in `host`), in order:
// every copy in is queued first; chunk i's op runs once chunk i is in,
// and its copy back is queued right after. On an error nothing more is
// queued and the error is returned (the buffer is then unspecified: some
// chunks may hold results).
absl::Status RunStagedChunks(const std::vector<StagedChunk>& chunks, void* host,
                             StagingCopies& copies,
                             const std::function<absl::Status(void*, const StagedChunk&)>& op);

// The pipelined communicator: `host` on host memory, `copies` between it
// and the buffers' memory `memory`, chunks of about `chunk_bytes`. A
// failure of a copy aborts `host`. Takes ownership.
std::unique_ptr<Communicator> NewPipelinedStagedCommunicator(std::unique_ptr<Communicator> host,
                                                             std::unique_ptr<StagingCopies> copies,
                                                             MemorySpace memory,
                                                             size_t chunk_bytes);

// StagingCopies for buffers in host memory (memcpy; a collective's copies
// are done when queued): for tests of the pipeline on the CPU.
std::unique_ptr<StagingCopies> NewHostStagingCopies();

}  // namespace muster

#endif  // MUSTER_TRAINER_COMM_STAGED_H_
