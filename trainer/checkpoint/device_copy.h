// DeviceCopier: a checkpoint's device-to-host copies, off the training
// stream. The copies run on a side stream into pinned host memory; the side
// stream first waits for the work already queued on the training stream
// (the optimizer step of the checkpointed step), so it copies that step's
// state. The training stream waits on the GPU, never on the host: for the
// state the next forward pass changes (buffers such as batch-norm
// statistics, extra tensors) right after Snapshot, for the parameters and
// optimizer state only before the next optimizer update (BeforeUpdate).
//
// Without CUDA (or for CPU tensors) every call is a plain host copy.
//
// Thread-safety: Begin/Copy/MarkEarly/End/BeforeUpdate on the training
// thread; WaitCopied on the writer thread, after End.
#ifndef MUSTER_TRAINER_CHECKPOINT_DEVICE_COPY_H_
#define MUSTER_TRAINER_CHECKPOINT_DEVICE_COPY_H_

#include <torch/types.h>

#include <cstddef>
#include <memory>
#include <vector>

namespace muster {

class DeviceCopier {
 public:
  DeviceCopier();
  ~DeviceCopier();
  DeviceCopier(const DeviceCopier&) = delete;
  DeviceCopier& operator=(const DeviceCopier&) = delete;

  // Pins [data, data + bytes) for fast transfers (cudaHostRegister) when
  // CUDA is usable; Unpin before freeing it.
  void Pin(void* data, size_t bytes);
  void Unpin();

  // Starts a snapshot of state on `device`: the side stream follows the
  // training stream from here.
  void Begin(const torch::Device& device);
  // Copies `t` (contiguous) to `dst`: queued on the side stream for a CUDA
  // tensor, at once for a CPU one.
  void Copy(void* dst, const torch::Tensor& t);
  // Everything copied so far is what the next forward pass may change: the
  // training stream waits for it (on the GPU).
  void MarkEarly();
  // No more copies for this snapshot.
  void End();
  // Before the next optimizer update: the training stream waits for the
  // copies (on the GPU). Cheap when no snapshot is pending.
  void BeforeUpdate();
  // Blocks until the copies are in host memory; returns their GPU time in
  // seconds (0 for a snapshot without device tensors).
  double WaitCopied();
  // Bytes copied from the device by the last snapshot.
  size_t device_bytes() const { return device_bytes_; }

 private:
  struct Cuda;
  std::unique_ptr<Cuda> cuda_;
  size_t device_bytes_ = 0;
  std::vector<torch::Tensor> keep_;  // temporaries the side stream still reads
};

}  // namespace muster

#endif  // MUSTER_TRAINER_CHECKPOINT_DEVICE_COPY_H_
