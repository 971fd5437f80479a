// muster::Backend: which communicator carries a world's collectives. Shared
// by the public options (muster.h) and the communicator factory.
#ifndef MUSTER_BACKEND_H_
#define MUSTER_BACKEND_H_

#include <string>

#include "absl/status/statusor.h"

namespace muster {

enum class Backend {
  kAuto,  // shm on one node, gloo with one rank per node, hier otherwise (nccl on GPUs)
  kGloo,  // flat Gloo over TCP
  kShm,   // shared memory (one node only)
  kHier,  // shm inside nodes + Gloo across
  kNccl,  // flat NCCL (GPU)
};

// "auto", "gloo", "shm", "hier" or "nccl". INVALID_ARGUMENT names the others.
absl::StatusOr<Backend> ParseBackend(const std::string& name);

}  // namespace muster

#endif  // MUSTER_BACKEND_H_
