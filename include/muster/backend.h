// muster::Backend: which communicator carries a world's collectives, and
// muster::GradientCompression: in which type gradients cross nodes. Shared
// by the public options (muster/options.h) and the communicator factory.
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

// The type gradient buckets cross nodes in, as DDP's bf16_compress_hook and
// fp16_compress_hook do for the whole bucket. Inside a node gradients stay
// float32 (the hierarchical all-reduce compresses only the shard it sends
// across nodes; a flat communicator over several nodes compresses the whole
// bucket; a reduce-scatter of sharded state's gradients likewise), so a
// world of one node is never compressed. Accumulation is in
// float32 wherever muster adds (shared memory, Gloo), in the wire type on
// NCCL; averages are divided in float32. See docs/communicators.md.
enum class GradientCompression {
  kNone,  // float32 everywhere (the default)
  kBf16,  // bfloat16 across nodes: float32's range, 8 significant bits
  kFp16,  // float16 across nodes: 11 significant bits, range up to 65504
};

// "none", "bf16" or "fp16". INVALID_ARGUMENT names the choices.
absl::StatusOr<GradientCompression> ParseGradientCompression(const std::string& name);
// "none", "bf16", "fp16"; "unknown" for a value outside the enum.
const char* GradientCompressionName(GradientCompression compression);

}  // namespace muster

#endif  // MUSTER_BACKEND_H_
