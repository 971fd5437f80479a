#include "trainer/comm/factory.h"

#include <mutex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "trainer/comm/checked.h"
#include "trainer/comm/compressed.h"
#include "trainer/comm/shm/shm_communicator.h"
#include "trainer/comm/single_rank.h"
#ifdef MUSTER_HAVE_CUDA
#include "trainer/comm/nccl/nccl_communicator.h"
#endif

namespace muster {

absl::StatusOr<Backend> ParseBackend(const std::string& name) {
  if (name == "auto") return Backend::kAuto;
  if (name == "gloo") return Backend::kGloo;
  if (name == "shm") return Backend::kShm;
  if (name == "hier") return Backend::kHier;
  if (name == "nccl") return Backend::kNccl;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown backend '", name, "' (auto, gloo, shm, hier, nccl)"));
}

absl::StatusOr<GradientCompression> ParseGradientCompression(const std::string& name) {
  if (name == "none") return GradientCompression::kNone;
  if (name == "bf16") return GradientCompression::kBf16;
  if (name == "fp16") return GradientCompression::kFp16;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown gradient compression '", name, "' (none, bf16, fp16)"));
}

const char* GradientCompressionName(GradientCompression compression) {
  switch (compression) {
    case GradientCompression::kNone: return "none";
    case GradientCompression::kBf16: return "bf16";
    case GradientCompression::kFp16: return "fp16";
  }
  return "unknown";
}

size_t StagingChunkBytes(const char* kib) {
  size_t n = 0;
  if (kib == nullptr || !absl::SimpleAtoi(kib, &n)) return 0;
  return n * 1024;
}

namespace {

// The type gradients cross nodes in for `world`: float32 without
// compression, and in a world of one node, where nothing crosses nodes.
absl::StatusOr<DataType> GradientWire(const WorldInfo& world, const CommOptions& options) {
  DataType wire = DataType::kFloat32;
  switch (options.gradient_compression) {
    case GradientCompression::kNone: return DataType::kFloat32;
    case GradientCompression::kBf16: wire = DataType::kBFloat16; break;
    case GradientCompression::kFp16: wire = DataType::kFloat16; break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("CommOptions::gradient_compression has no such value (",
                       static_cast<int>(options.gradient_compression), ")"));
  }
  if (world.node_count > 1) return wire;
  static std::once_flag told;
  std::call_once(told, [&] {
    MUSTER_LOG(INFO) << "gradient compression "
                     << GradientCompressionName(options.gradient_compression)
                     << ": this world is one node, so nothing crosses nodes and gradients are "
                        "reduced in float32 (compression applies between nodes only)";
  });
  return DataType::kFloat32;
}

// A flat communicator over several nodes carries the whole buffer as `wire`.
absl::StatusOr<std::unique_ptr<Communicator>> CompressedIf(
    absl::StatusOr<std::unique_ptr<Communicator>> comm, DataType wire,
    std::unique_ptr<BufferOps> ops) {
  if (!comm.ok() || wire == DataType::kFloat32) return comm;
  return NewCompressedCommunicator(std::move(*comm), wire, std::move(ops));
}

ShmOptions ShmOptionsFor(const WorldInfo& world, const CommOptions& options) {
  ShmOptions shm;
  shm.job = options.job;
  shm.generation = world.generation;
  shm.node = world.self.node;
  shm.slot_bytes = options.shm_slot_bytes;
  shm.clock = options.clock;
  return shm;
}

// This node's communicator: the previous world's, kept or shrunk
// (node_comm.h), or a new one: shared memory, or NCCL on the GPU (a node
// of one rank on the GPU: single_rank.h).
absl::StatusOr<std::unique_ptr<Communicator>> BuildIntra(const WorldInfo& world, Store* store,
                                                         const CommOptions& options,
                                                         absl::Time deadline,
                                                         KeptNodeCommunicator* kept) {
  const int node = world.node_rank();
  KeptNodeCommunicator none;
  auto node_store = NewPrefixStore(store, absl::StrCat("node", node));
  MUSTER_ASSIGN_OR_RETURN(
      std::unique_ptr<Communicator> same,
      ReuseNodeCommunicator(kept != nullptr ? kept : &none, world, node_store.get(), deadline,
                            options.clock));
  if (same != nullptr) return same;
  if (options.cuda && world.local_world_size() == 1) {
    // Nothing to reduce inside the node, and no NCCL start-up to pay.
    return NewSingleRankCommunicator(MemorySpace::Cuda(options.cuda_device));
  }
  if (options.cuda) {
#ifdef MUSTER_HAVE_CUDA
    auto s = NewPrefixStore(store, absl::StrCat("nccl/node", node));
    return NewNcclCommunicator(s.get(), world.local_rank(), world.local_world_size(),
                               options.cuda_device, deadline, options.clock, options.cuda_stream,
                               /*shrinkable=*/true);
#else
    return absl::InvalidArgumentError("this build has no CUDA/NCCL support");
#endif
  }
  auto intra_store = NewPrefixStore(store, absl::StrCat("shm/node", node));
  return NewShmCommunicator(intra_store.get(), world.local_rank(), world.local_world_size(),
                            ShmOptionsFor(world, options), deadline);
}

// An inter-node group's communicator: Gloo, staged through pinned host
// buffers when the buffers are on the GPU.
absl::StatusOr<std::unique_ptr<Communicator>> BuildInter(Store* store, int rank, int size,
                                                         int world_rank,
                                                         const CommOptions& options,
                                                         absl::Time deadline) {
  GlooOptions gloo = options.gloo;
  gloo.single_host = false;  // one rank per node, nodes elsewhere
  gloo.world_rank = world_rank;
  gloo.clock = options.clock;
  auto c = NewGlooCommunicator(store, rank, size, gloo, deadline);
  if (!c.ok() || !options.cuda) return c;
#ifdef MUSTER_HAVE_CUDA
  return NewCudaStagedCommunicator(std::move(*c), options.cuda_device, options.cuda_stream,
                                   options.staging_chunk_bytes);
#else
  return absl::InvalidArgumentError("this build has no CUDA/NCCL support");
#endif
}

std::unique_ptr<BufferOps> BufferOpsFor([[maybe_unused]] const CommOptions& options) {
#ifdef MUSTER_HAVE_CUDA
  if (options.cuda) return NewCudaBufferOps(options.cuda_device, options.cuda_stream);
#endif
  return NewHostBufferOps();
}

absl::StatusOr<std::unique_ptr<Communicator>> BuildHier(const WorldInfo& world, Store* store,
                                                        const CommOptions& options,
                                                        absl::Time deadline,
                                                        KeptNodeCommunicator* kept,
                                                        DataType wire) {
  HierarchyPlan plan = PlanHierarchy(world.node_sizes);
  auto intra = BuildIntra(world, store, options, deadline, kept);
  if (!intra.ok()) return intra.status();
  std::vector<InterGroup> mine;
  std::vector<std::unique_ptr<Communicator>> inter;
  for (const InterGroup& g : plan.groups) {
    if (plan.Owner(world.local_world_size(), g.first_segment) != world.local_rank()) continue;
    mine.push_back(g);
    if (world.node_count == 1) {
      inter.push_back(nullptr);
      continue;
    }
    auto group_store = NewPrefixStore(store, absl::StrCat("hier/", g.first_segment));
    auto c = BuildInter(group_store.get(), world.node_rank(), world.node_count, world.rank,
                        options, deadline);
    if (!c.ok()) {
      (*intra)->Abort(c.status());
      return c.status();
    }
    inter.push_back(std::move(*c));
  }
  return NewHierarchicalCommunicator(world.rank, world.world_size, std::move(plan),
                                     world.local_world_size(),
                                     std::move(*intra), std::move(mine), std::move(inter),
                                     BufferOpsFor(options), wire);
}

absl::StatusOr<std::unique_ptr<Communicator>> BuildUnchecked(const WorldInfo& world,
                                                             Store* store,
                                                             const CommOptions& options,
                                                             absl::Time deadline,
                                                             KeptNodeCommunicator* kept) {
  MUSTER_ASSIGN_OR_RETURN(const DataType wire, GradientWire(world, options));
  Backend backend = options.backend;
  const bool one_per_node = world.node_count == world.world_size;
  if (backend == Backend::kAuto) {
    if (options.cuda) {
      backend = Backend::kNccl;  // NCCL's own transports across nodes
    } else if (world.node_count <= 1) {
      backend = Backend::kShm;
    } else {
      backend = one_per_node ? Backend::kGloo : Backend::kHier;
    }
  }
  switch (backend) {
    case Backend::kGloo: {
      auto s = NewPrefixStore(store, "gloo/world");
      GlooOptions gloo = options.gloo;
      gloo.single_host = world.node_count <= 1;
      gloo.world_rank = world.rank;
      gloo.clock = options.clock;
      return CompressedIf(
          NewGlooCommunicator(s.get(), world.rank, world.world_size, gloo, deadline), wire,
          NewHostBufferOps());
    }
    case Backend::kShm: {
      if (world.node_count > 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the shm backend needs every rank on one node; this world has ", world.node_count,
            " nodes (use hier or gloo)"));
      }
      auto s = NewPrefixStore(store, "shm/node0");
      return NewShmCommunicator(s.get(), world.rank, world.world_size, ShmOptionsFor(world, options),
                                deadline);
    }
    case Backend::kHier:
      return BuildHier(world, store, options, deadline, kept, wire);
    case Backend::kNccl: {
#ifdef MUSTER_HAVE_CUDA
      if (!options.cuda) {
        return absl::InvalidArgumentError("the nccl backend needs the GPU (--device cuda)");
      }
      auto s = NewPrefixStore(store, "nccl/world");
      return CompressedIf(
          NewNcclCommunicator(s.get(), world.rank, world.world_size, options.cuda_device,
                              deadline, options.clock, options.cuda_stream),
          wire, BufferOpsFor(options));
#else
      return absl::InvalidArgumentError("this build has no CUDA/NCCL support");
#endif
    }
    case Backend::kAuto:
      break;
  }
  return absl::InternalError("unreachable backend");
}

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> BuildCommunicator(
    const WorldInfo& world, Store* store, const CommOptions& options, absl::Time deadline,
    KeptNodeCommunicator* kept) {
  if (options.clock == nullptr) {
    if (kept != nullptr) *kept = {};  // consumed, as promised
    return absl::InvalidArgumentError("CommOptions::clock is required");
  }
  auto comm = BuildUnchecked(world, store, options, deadline, kept);
  if (kept != nullptr) *kept = {};  // not a hierarchical world: nothing to keep
  if (!comm.ok() || !options.check_buffers) return comm;
  return NewMemoryChecked(std::move(*comm));
}

}  // namespace muster
