// muster::MemoryAccount: the bytes this rank holds, by what holds them
// (Distributed::memory_account(); docs/design/sharding.md, "What a rank holds").
#ifndef MUSTER_MEMORY_ACCOUNT_H_
#define MUSTER_MEMORY_ACCOUNT_H_

#include <cstdint>

namespace muster {

// Each block of tensor memory (a storage) is counted once, in the first of
// these categories that reaches it, in this order:
//   parameters       the registered modules' parameters and buffers
//   gradients        what the parameters' and the sharded masters' .grad
//                    live in: their own tensors, or the gradient buckets
//                    they are views of (sharded state)
//   optimizer_state  the optimizers' state (Adam's moments, step counts),
//                    and sharded masters that copy their ranges
//   communication    the gradient buckets that hold no .grad
//   staging          the host copy a checkpoint is written from (kept for
//                    the next checkpoint)
//   transfer         the state image served to `muster pull-weights`
// Not counted: activations, the program's own tensors, buffers that live
// only inside one call (a gather's chunk, a reduction's staging), and the
// process itself (code, LibTorch's and gRPC's own memory).
struct MemoryAccount {
  int64_t parameters = 0;
  int64_t gradients = 0;
  int64_t optimizer_state = 0;
  int64_t communication = 0;
  int64_t staging = 0;
  int64_t transfer = 0;

  int64_t total() const {
    return parameters + gradients + optimizer_state + communication + staging + transfer;
  }
};

}  // namespace muster

#endif  // MUSTER_MEMORY_ACCOUNT_H_
