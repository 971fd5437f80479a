#include "trainer/comm/values.h"

#include <functional>

#ifdef MUSTER_HAVE_CUDA
#include "trainer/comm/nccl/nccl_communicator.h"
#endif

namespace muster {
namespace {

absl::Status OnCommMemory(Communicator* comm, void* data, size_t bytes,
                          const std::function<absl::Status(void*)>& op) {
  if (comm->memory().is_host() || bytes == 0) return op(data);
#ifdef MUSTER_HAVE_CUDA
  return WithCudaCopy(comm->memory().device, data, bytes, op);
#else
  return absl::InvalidArgumentError("this build has no CUDA support");
#endif
}

}  // namespace

absl::Status AllReduceValues(Communicator* comm, void* data, size_t count, DataType type,
                             ReduceOp op, absl::Time deadline) {
  return OnCommMemory(comm, data, count * DataTypeSize(type), [&](void* buffer) {
    return comm->AllReduce(buffer, count, type, op, deadline);
  });
}

absl::Status BroadcastValues(Communicator* comm, void* data, size_t count, DataType type,
                             int root, absl::Time deadline) {
  return OnCommMemory(comm, data, count * DataTypeSize(type), [&](void* buffer) {
    return comm->Broadcast(buffer, count, type, root, deadline);
  });
}

absl::Status AllGatherValues(Communicator* comm, void* data, const std::vector<size_t>& counts,
                             DataType type, absl::Time deadline) {
  size_t count = 0;
  for (size_t c : counts) count += c;
  return OnCommMemory(comm, data, count * DataTypeSize(type), [&](void* buffer) {
    return comm->AllGather(buffer, counts, type, deadline);
  });
}

}  // namespace muster
