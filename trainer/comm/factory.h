// Builds the communicator a trainer uses for one generation's world.
#ifndef MUSTER_TRAINER_COMM_FACTORY_H_
#define MUSTER_TRAINER_COMM_FACTORY_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "muster/backend.h"
#include "trainer/comm/world_info.h"
#include "trainer/comm/communicator.h"
#include "trainer/comm/gloo/gloo_communicator.h"
#include "trainer/comm/hierarchical.h"
#include "trainer/comm/node_comm.h"
#include "trainer/comm/store.h"

namespace muster {

struct CommOptions {
  Backend backend = Backend::kAuto;
  std::string job = "job";
  GlooOptions gloo;
  size_t shm_slot_bytes = 2 << 20;
  bool cuda = false;     // buffers live on the GPU
  int cuda_device = 0;
  // cuda: the cudaStream_t whose work a collective follows (LibTorch's
  // current stream on the calling thread); null: the legacy default stream.
  std::function<void*()> cuda_stream;
  // Wrap the communicator in NewMemoryChecked (tests; $MUSTER_CHECK_BUFFERS).
  bool check_buffers = false;
  // cuda, the inter-node Gloo communicators of hier: 0 stages each buffer
  // whole, the host waiting for every copy; > 0 pipelines the copies in
  // chunks of about this many bytes (staged.h; $MUSTER_STAGING_CHUNK_KB).
  size_t staging_chunk_bytes = 0;
  // The type AllReduceGradients carries across nodes (muster/backend.h):
  // the hierarchical communicator compresses the shards it sends between
  // nodes, a flat Gloo or NCCL world of several nodes the whole buffer
  // (compressed.h). A world of one node is not compressed (nothing crosses
  // nodes; logged once per process).
  GradientCompression gradient_compression = GradientCompression::kNone;
  // The communicators' deadlines are times of its Now() (every backend's:
  // BuildCommunicator sets GlooOptions::clock and ShmOptions::clock from
  // it). Required, not owned, must outlive the communicator.
  Clock* clock = nullptr;
};

// $MUSTER_STAGING_CHUNK_KB (KiB, `kib`; null when unset) as
// CommOptions::staging_chunk_bytes: 0 (the whole-buffer staging) when unset
// or not a number.
size_t StagingChunkBytes(const char* kib);

// Connects this rank's communicator for `world`, bootstrapping through
// `store` (the generation's KV). With `cuda`, auto picks NCCL for the whole
// world, and hier is NCCL inside each node with Gloo between nodes from
// pinned host buffers ("hier(nccl+gloo)"; "hier(self+gloo)" for nodes of one
// rank, single_rank.h), for nodes without NCCL's
// transports, or trainers sharing one GPU as separate nodes); gloo and shm
// stay on host memory.
// `kept`, when given: what the previous world's communicator left
// (node_comm.h). A hierarchical communicator keeps it as its node-local one
// when every rank of the node may; either way it is consumed.
// `deadline` is a time of options.clock's Now().
// Errors: INVALID_ARGUMENT (backend does not fit the world, e.g. shm across
// nodes, nccl without CUDA; an unknown gradient_compression; no clock), and
// the backends' errors.
absl::StatusOr<std::unique_ptr<Communicator>> BuildCommunicator(
    const WorldInfo& world, Store* store, const CommOptions& options, absl::Time deadline,
    KeptNodeCommunicator* kept = nullptr);

}  // namespace muster

#endif  // MUSTER_TRAINER_COMM_FACTORY_H_
