// Communicator: collective operations among the ranks of one group, for one
// generation. Implementations: Gloo over TCP (gloo/), shared memory inside a
// node (shm/), NCCL on GPUs (nccl/), and Hierarchical, which composes an
// intra-node and an inter-node communicator.
//
// Buffers live where memory() says: host memory for Gloo and shared memory,
// device memory of one GPU for NCCL and for the compositions built on it.
// Handing a communicator a buffer elsewhere is a bug; NewMemoryChecked
// (checked.h) catches it.
// Every call takes a deadline, a time of the Now() of the clock the
// communicator was built with (CommOptions::clock: the monotonic clock,
// common/clock.h), and returns a Status; nothing blocks forever:
//   OK                   done; the buffer holds the result on every rank;
//   DEADLINE_EXCEEDED    the deadline passed (a hung peer);
//   ABORTED              Abort() was called, or a peer failed or vanished:
//                        the communicator is broken, build a new one for the
//                        next generation;
//   INVALID_ARGUMENT     bad counts, root or data type for this backend.
// After any error other than INVALID_ARGUMENT the contents of the buffer are
// unspecified and the communicator only answers ABORTED.
//
// Thread-safety: collectives are issued by one thread at a time, and every
// rank issues the same collectives in the same order. Abort() may be called
// from any thread at any time, also while a collective is blocked; it makes
// that collective return ABORTED promptly (within milliseconds for shm and
// NCCL; Gloo returns at once and releases its sockets when the blocked
// transfer ends or times out).
#ifndef MUSTER_TRAINER_COMM_COMMUNICATOR_H_
#define MUSTER_TRAINER_COMM_COMMUNICATOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace muster {

enum class DataType { kFloat32, kFloat16, kBFloat16, kFloat64, kInt64 };

// Where a communicator's buffers must live.
struct MemorySpace {
  enum class Kind { kHost, kCuda };
  Kind kind = Kind::kHost;
  int device = -1;  // the CUDA device, for kCuda

  static MemorySpace Host() { return {}; }
  static MemorySpace Cuda(int device) { return {Kind::kCuda, device}; }
  bool is_host() const { return kind == Kind::kHost; }
  std::string ToString() const;  // "host", "cuda:0"
};
enum class ReduceOp { kSum, kAverage };

size_t DataTypeSize(DataType type);
const char* DataTypeName(DataType type);

// Splits `count` elements into `parts` contiguous segments whose sizes differ
// by at most one (the first ones take the remainder).
std::vector<size_t> EvenSplit(size_t count, size_t parts);

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Backend name for logs ("gloo", "shm", "nccl", "hier(shm+gloo)").
  virtual std::string name() const = 0;
  // Where every buffer handed to this communicator must live.
  virtual MemorySpace memory() const { return MemorySpace::Host(); }

  // In place: every rank ends with the element-wise sum (or average) of
  // `count` elements over all ranks.
  virtual absl::Status AllReduce(void* data, size_t count, DataType type, ReduceOp op,
                                 absl::Time deadline) = 0;

  // Gradients, in place: as AllReduce(data, count, kFloat32, op, deadline)
  // over `count` float32 elements, except that where the bytes cross nodes
  // they travel as gradient_wire(), chosen when the communicator was built
  // (CommOptions::gradient_compression, factory.h): the float32 values
  // there are rounded to that type, reduced (summed in float32 where muster
  // adds them, in the wire type by NCCL) and widened back; an average is
  // divided in float32. Every rank ends with the same bits. With
  // gradient_wire() kFloat32 (the default) it is that AllReduce, bit for
  // bit. Errors: AllReduce's.
  virtual absl::Status AllReduceGradients(void* data, size_t count, ReduceOp op,
                                          absl::Time deadline) {
    return AllReduce(data, count, DataType::kFloat32, op, deadline);
  }
  // The type AllReduceGradients' bytes cross nodes in: kFloat32 (none; also
  // whenever the world is one node), kBFloat16 or kFloat16. The same on
  // every rank of a world built with the same options.
  virtual DataType gradient_wire() const { return DataType::kFloat32; }

  // In place over a buffer of sum(counts) elements laid out as size()
  // contiguous segments, segment r holding counts[r] elements: afterwards
  // segment rank() holds the reduction of that segment over all ranks. Other
  // segments are unspecified.
  virtual absl::Status ReduceScatter(void* data, const std::vector<size_t>& counts,
                                     DataType type, ReduceOp op, absl::Time deadline) = 0;

  // Gradients, in place: as ReduceScatter(data, counts, kFloat32, op,
  // deadline), except that where the bytes cross nodes they travel as
  // gradient_wire(), as AllReduceGradients' do: rounded to that type,
  // reduced there (summed in float32 where muster adds them) and widened
  // back; an average is divided in float32. Segment rank() is the same bits
  // as that segment of AllReduceGradients over the same buffer wherever the
  // two add in the same order (two nodes). With kFloat32 it is that
  // ReduceScatter, bit for bit. Errors: ReduceScatter's.
  virtual absl::Status ReduceScatterGradients(void* data, const std::vector<size_t>& counts,
                                              ReduceOp op, absl::Time deadline) {
    return ReduceScatter(data, counts, DataType::kFloat32, op, deadline);
  }

  // Gradients, in place over the same layout, for ranks that each need the
  // segments of their column: where NodeRanks() is not empty (L ranks a
  // node, numbered node by node), afterwards the segments of every rank
  // r' with r' % L == rank() % L hold their reduction (two copies of
  // sharded state on two nodes: a rank and its buddy share a column);
  // elsewhere every segment does. Other segments are unspecified. The
  // hierarchical communicator on host memory carries across nodes only
  // what a reduce-scatter of the columns would; the others all-reduce
  // (AllReduceGradients). Compressed across nodes as AllReduceGradients.
  // Errors: AllReduce's.
  virtual absl::Status ReduceColumnsGradients(void* data, const std::vector<size_t>& counts,
                                              ReduceOp op, absl::Time deadline);

  // In place over the same layout: rank r provides segment r; afterwards
  // every rank holds every segment.
  virtual absl::Status AllGather(void* data, const std::vector<size_t>& counts, DataType type,
                                 absl::Time deadline) = 0;

  // The world ranks of this rank's node in node-local rank order, where
  // every node of the world holds as many ranks as this one and they are
  // numbered node by node (node k holds ranks [k*L, (k+1)*L) for L =
  // NodeRanks().size()), so that AllGatherInNode can run among them; empty
  // otherwise (a flat communicator, nodes of different sizes). Every rank
  // of a world built with the same options answers alike.
  virtual std::vector<int> NodeRanks() const { return {}; }

  // AllGather among NodeRanks() alone, in place over size L segments, one
  // per rank of the node in node-local rank order: nothing crosses nodes,
  // and the ranks of each node gather independently. A failure breaks the
  // communicator as any collective's does. Errors: AllGather's;
  // UNIMPLEMENTED where NodeRanks() is empty.
  virtual absl::Status AllGatherInNode(void* data, const std::vector<size_t>& counts,
                                       DataType type, absl::Time deadline);

  // In place: every rank ends with `root`'s `count` elements.
  virtual absl::Status Broadcast(void* data, size_t count, DataType type, int root,
                                 absl::Time deadline) = 0;

  virtual absl::Status Barrier(absl::Time deadline) = 0;

  // The world ranks of this communicator's peers that this rank cannot
  // reach over the network now (a probe of at most a second or two; see
  // gloo/reachability.h), for the report of a world that broke. Empty where
  // the transport cannot tell (shared memory, NCCL) or every peer answers.
  // Training thread, after a collective failed.
  virtual std::vector<int> Unreachable() { return {}; }

  // Breaks the communicator: a blocked or later collective returns ABORTED
  // with `why`. Idempotent; thread-safe.
  virtual void Abort(const absl::Status& why) = 0;

  // A composition's node-local communicator, handed over for the next world
  // (node_comm.h): one that nothing touched (none of its collectives failed,
  // nothing aborted it), which the next world may keep as it is, or one that
  // was touched but CanShrink(), which it may shrink; `*touched` says which.
  // This communicator then only answers ABORTED. Null when there is none, or
  // it was touched and cannot shrink. Training thread, with no collective in
  // flight.
  virtual std::unique_ptr<Communicator> ReleaseNodeCommunicator(bool* touched) {
    *touched = false;
    return nullptr;
  }

  // Whether Shrink can make the communicator of fewer ranks from this one,
  // also after a failure or an Abort broke it (NCCL's ncclCommShrink).
  virtual bool CanShrink() const { return false; }

  // What a rank checks on its own before it agrees to shrink (Shrink is
  // collective: a rank that cannot take part must say so before the others
  // wait for it): work a failure stopped has settled. Errors: the
  // transport's; DEADLINE_EXCEEDED.
  virtual absl::Status ReadyToShrink(absl::Time /*deadline*/) { return absl::OkStatus(); }

  // The communicator of this one's ranks but `excluded` (ranks of this
  // one), renumbered in order; every remaining rank calls it, the excluded
  // ones do not. Work still in flight is stopped first. This communicator
  // is spent afterwards, whatever the outcome.
  // Errors: UNIMPLEMENTED unless CanShrink(); DEADLINE_EXCEEDED; the
  // transport's.
  virtual absl::StatusOr<std::unique_ptr<Communicator>> Shrink(const std::vector<int>& excluded,
                                                               absl::Time deadline);
};

// The rank that `rank` has in the communicator Shrink makes without
// `excluded` (which does not hold it).
int RankAfterShrink(int rank, const std::vector<int>& excluded);

// The payload type of a status that names peers this rank could not reach
// (a communicator's build that failed for it): their world ranks,
// comma-separated ("2,3").
inline constexpr char kUnreachablePayload[] = "type.muster.dev/unreachable_ranks";
// The world ranks `status` names as unreachable (none without the payload).
std::vector<int> UnreachableRanks(const absl::Status& status);
// Makes `status` (not OK) name `ranks` as unreachable.
void SetUnreachableRanks(absl::Status* status, const std::vector<int>& ranks);

// Validates `counts` for a communicator of `size` ranks.
absl::Status CheckCounts(const std::vector<size_t>& counts, int size);

// The elements of a segmented buffer: the sum of `counts`.
size_t TotalCount(const std::vector<size_t>& counts);
// Where segment `rank` begins: the sum of counts[0..rank).
size_t SegmentOffset(const std::vector<size_t>& counts, int rank);

}  // namespace muster

#endif  // MUSTER_TRAINER_COMM_COMMUNICATOR_H_
