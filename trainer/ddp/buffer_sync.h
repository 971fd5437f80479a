// BufferSync: keeps the modules' buffers (BatchNorm's running statistics, a
// step counter a module keeps) the same on every rank, as DDP's
// broadcast_buffers does, without writing into a tensor that a live autograd
// graph still holds.
//
// A forward pass changes a module's buffers in place on each rank with that
// rank's own batch. PyTorch's DDP copies rank 0's buffers before each
// forward of the wrapped module. muster has no hook before a forward, so it
// copies them where no graph of the step can still need them: at the step
// boundary (Distributed::ShouldStop), after every pass of the step and
// before any checkpoint, state check or state transfer of that boundary. A
// GAN whose generator's graph, built in the discriminator's pass, is used
// again in the generator's pass therefore trains as written.
//
// Only the buffers that may have changed on some rank since the last Sync
// are copied, module by module (each module that holds buffers of its own,
// at any depth): a module in training mode (BatchNorm updates its running
// statistics in a training forward, and LibTorch's kernel writes them
// without bumping their autograd version), or one any of whose buffers'
// autograd version moved (an in-place write by the program). One
// all-reduce of a flag per module tells every rank which ones to
// broadcast. A frozen teacher in eval mode costs that one small all-reduce
// and nothing else.
//
// Thread-safety: none; the training thread only.
#ifndef MUSTER_TRAINER_DDP_BUFFER_SYNC_H_
#define MUSTER_TRAINER_DDP_BUFFER_SYNC_H_

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "trainer/comm/communicator.h"

namespace muster {

class BufferSync {
 public:
  // A module and the buffers it holds itself (not its children's).
  struct Holder {
    const torch::nn::Module* module = nullptr;  // outlives the BufferSync
    std::vector<torch::Tensor> buffers;
  };
  // Every holder of the registered modules, in one order on every rank.
  explicit BufferSync(std::vector<Holder> holders);
  // The holders of `modules` and of all their descendants.
  static std::vector<Holder> HoldersOf(const std::vector<torch::nn::Module*>& modules);

  bool empty() const { return holders_.empty(); }

  // Collective (every rank of `comm` calls it at the same boundary):
  // broadcasts from `root` every buffer that changed on any rank since the
  // last Sync or Settle. On success every rank holds root's buffers. Errors:
  // the communicator's (the buffers may then differ; a state transfer
  // settles them).
  absl::Status Sync(Communicator* comm, int root, absl::Time deadline);

  // The buffers as they are now count as the same on every rank (after a
  // state transfer that checked so).
  void Settle();
  // A state transfer left the buffers out (state_sync.h, `in_step`): the
  // next Sync copies every buffer from `root` instead of the changed ones
  // from its own root; -1: nothing owed (a later transfer carried them).
  // Every rank of the world sets the same.
  void Owe(int root) { owed_root_ = root; }

 private:
  std::vector<Holder> holders_;
  std::vector<std::vector<int64_t>> versions_;  // each buffer's version after the last Sync/Settle
  int owed_root_ = -1;
};

}  // namespace muster

#endif  // MUSTER_TRAINER_DDP_BUFFER_SYNC_H_
