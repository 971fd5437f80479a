// Gradient compression (what DDP users get from bf16_compress_hook and
// fp16_compress_hook): float32 gradients that cross nodes as a 16-bit type.
//
// AllReduceCompressed is the compressed leg itself: round a float32 buffer
// to the wire type in scratch memory, all-reduce it in that type, widen the
// result back. The hierarchical composition runs it on the shard each rank
// carries across nodes (hierarchical.h); NewCompressedCommunicator runs it
// on the whole buffer of a flat communicator (Gloo or NCCL over a world of
// several nodes), whose every byte may cross nodes.
//
// Thread-safety: as the communicator's (one collective at a time).
#ifndef MUSTER_TRAINER_COMM_COMPRESSED_H_
#define MUSTER_TRAINER_COMM_COMPRESSED_H_

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "trainer/comm/communicator.h"
#include "trainer/comm/hierarchical.h"

namespace muster {

// The sum over `comm` of `count` float32 elements at `data` (in `comm`'s
// memory, which `ops` works on), carried as `wire` (kFloat16 or
// kBFloat16): compressed into the ops' scratch, all-reduced there, widened
// back into `data`. The reduction is `comm`'s for that type (Gloo and
// shared memory add in float32; NCCL in the type). Every rank ends with the
// same bits. `carried`: room for `count` elements of `wire` in `comm`'s
// memory (null: the ops' scratch). Errors: INVALID_ARGUMENT for another
// wire type; `ops`' (then `comm` was not called) and `comm`'s. Does not
// abort `comm`.
absl::Status AllReduceCompressed(Communicator* comm, BufferOps* ops, DataType wire, void* data,
                                 size_t count, absl::Time deadline, void* carried = nullptr);

// The same for a reduce-scatter over `comm` of float32 `data` laid out as
// `counts` (Communicator::ReduceScatter): every segment is compressed into
// `carried` (room for TotalCount(counts) elements of `wire`, in `comm`'s
// memory), reduce-scattered there (summed), and `comm`'s own segment is
// widened back into `data`; the other segments are left as they were.
// Errors: as AllReduceCompressed's.
absl::Status ReduceScatterCompressed(Communicator* comm, BufferOps* ops, DataType wire, void* data,
                                     const std::vector<size_t>& counts, void* carried,
                                     absl::Time deadline);

// `inner` (a flat communicator) whose AllReduceGradients carries the whole
// buffer as `wire` (AllReduceCompressed, then a float32 division for an
// average), and whose ReduceScatterGradients does the same
// (ReduceScatterCompressed); gradient_wire() is `wire` and name()
// "<inner>:<wire>", e.g. "gloo:bfloat16". Every other call goes to `inner`
// unchanged. A failure of a compressed collective aborts `inner` (the peers
// may be waiting in it). `ops` work on `inner`'s memory.
std::unique_ptr<Communicator> NewCompressedCommunicator(std::unique_ptr<Communicator> inner,
                                                        DataType wire,
                                                        std::unique_ptr<BufferOps> ops);

}  // namespace muster

#endif  // MUSTER_TRAINER_COMM_COMPRESSED_H_
