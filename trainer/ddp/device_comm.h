// Tensors to communicators, on the memory each communicator takes.
//
// A communicator declares its memory (host, or one GPU); tensors may live
// anywhere. These functions hand a communicator only buffers in its memory:
// a tensor already there goes as it is; any other is staged (copied to the
// communicator's memory and back). On the GPU, work is ordered by streams:
// NCCL follows LibTorch's current stream on the calling thread
// (CurrentCudaStream), and a StreamMark carries "the buffer is written" from
// the thread that wrote it to the thread that reduces it.
#ifndef MUSTER_TRAINER_DDP_DEVICE_COMM_H_
#define MUSTER_TRAINER_DDP_DEVICE_COMM_H_

#include <torch/types.h>

#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "trainer/comm/communicator.h"

namespace muster {

// The LibTorch device of `comm`'s memory.
torch::Device CommDevice(const Communicator& comm);

// In place over `tensor` (float32/16, bfloat16, float64, int64; any device).
absl::Status AllReduceTensor(Communicator* comm, const torch::Tensor& tensor, ReduceOp op,
                             absl::Time deadline);

// In place over a float32 `tensor` of gradients (any device), through
// Communicator::AllReduceGradients: compressed where `comm` carries
// gradients across nodes compressed, else AllReduceTensor bit for bit.
// INVALID_ARGUMENT for another dtype or a tensor that is not contiguous.
absl::Status AllReduceGradientTensor(Communicator* comm, const torch::Tensor& tensor,
                                     ReduceOp op, absl::Time deadline);

// In place over a contiguous float32 `tensor` of gradients (any device),
// laid out as Communicator::ReduceScatter's segments (`counts`, summing to
// its elements): afterwards segment rank() holds its reduction, crossing
// nodes as the communicator's gradient_wire()
// (Communicator::ReduceScatterGradients); with `columns`, the segments of
// this rank's column too (Communicator::ReduceColumnsGradients).
// INVALID_ARGUMENT for another dtype, a tensor that is not contiguous, or
// counts that are not one per rank or do not add up to it.
absl::Status ReduceScatterGradientTensor(Communicator* comm, const torch::Tensor& tensor,
                                         const std::vector<size_t>& counts, ReduceOp op,
                                         absl::Time deadline, bool columns = false);

// Copies rank `root`'s tensors (any dtype, any device) to every rank, in
// place, in broadcasts of at most `chunk` bytes through one buffer on the
// communicator's memory (a transfer costs a round's memory, not the
// tensors'). Every rank passes tensors of the same dtypes and shapes in the
// same order. `keep_equal`: a tensor that already holds root's bytes is not
// written, so its autograd version stays (a graph the program built before
// a state transfer between the passes of a step stays usable); that costs
// one comparison per tensor and one device synchronisation a round. On a
// communicator of one rank nothing is copied and the communicator is not
// called.
absl::Status BroadcastTensors(const std::vector<torch::Tensor>& tensors, Communicator* comm,
                              int root, absl::Time deadline, bool keep_equal = false,
                              int64_t chunk = int64_t{64} << 20);

// For CommOptions::cuda_stream: LibTorch's current stream on the calling
// thread for `device` (null without CUDA support).
std::function<void*()> CurrentCudaStream(int device);

// The GPU a trainer with `local_rank` uses: local_rank modulo the GPUs this
// process sees (a task bound to one GPU sees one, as device 0). -1 if none.
int CudaDeviceForLocalRank(int local_rank);

// "Everything queued so far on this thread's current stream of `device`":
// recorded on one thread, waited for on another's current stream. Empty
// (and free) for CPU devices.
class StreamMark {
 public:
  StreamMark() = default;
  static StreamMark Record(const torch::Device& device);
  // Makes the calling thread's current stream wait for the mark (on the GPU;
  // the host does not block).
  void WaitOnCurrentStream() const;

 private:
  std::shared_ptr<void> event_;
  [[maybe_unused]] int device_ = -1;  // read only where LibTorch has CUDA
};

}  // namespace muster

#endif  // MUSTER_TRAINER_DDP_DEVICE_COMM_H_
