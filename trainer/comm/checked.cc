#include "trainer/comm/checked.h"

#include <sys/uio.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "trainer/comm/forwarding.h"
#ifdef MUSTER_HAVE_CUDA
#include "trainer/comm/nccl/nccl_communicator.h"
#endif

namespace muster {
namespace {

// Whether this process can read the byte at `p` (without faulting: the
// kernel copies it). Device memory under CUDA's unified addressing is
// reserved but not readable, so it fails here.
bool Readable(const void* p) {
  char byte;
  iovec local{&byte, 1};
  iovec remote{const_cast<void*>(p), 1};
  return ::process_vm_readv(::getpid(), &local, 1, &remote, 1, 0) == 1;
}

bool InSpace(const MemorySpace& space, const void* data, size_t bytes) {
  if (data == nullptr) return false;
  const char* last = static_cast<const char*>(data) + (bytes == 0 ? 0 : bytes - 1);
  if (space.is_host()) {
#ifdef MUSTER_HAVE_CUDA
    if (CudaDeviceCount() > 0 && IsCudaDeviceMemory(data, 1, space.device)) return false;
#endif
    return Readable(data) && Readable(last);
  }
#ifdef MUSTER_HAVE_CUDA
  return IsCudaDeviceMemory(data, bytes, space.device);
#else
  return false;
#endif
}

class MemoryChecked : public ForwardingCommunicator {
 public:
  explicit MemoryChecked(std::unique_ptr<Communicator> inner)
      : ForwardingCommunicator(std::move(inner)) {}

  absl::Status AllReduce(void* data, size_t count, DataType type, ReduceOp op,
                         absl::Time deadline) override {
    if (absl::Status s = Check("AllReduce", data, count, type); !s.ok()) return s;
    return inner()->AllReduce(data, count, type, op, deadline);
  }
  absl::Status AllReduceGradients(void* data, size_t count, ReduceOp op,
                                  absl::Time deadline) override {
    if (absl::Status s = Check("AllReduceGradients", data, count, DataType::kFloat32); !s.ok()) {
      return s;
    }
    return inner()->AllReduceGradients(data, count, op, deadline);
  }
  absl::Status ReduceScatter(void* data, const std::vector<size_t>& counts, DataType type,
                             ReduceOp op, absl::Time deadline) override {
    if (absl::Status s = Check("ReduceScatter", data, TotalCount(counts), type); !s.ok()) return s;
    return inner()->ReduceScatter(data, counts, type, op, deadline);
  }
  absl::Status ReduceScatterGradients(void* data, const std::vector<size_t>& counts,
                                      ReduceOp op, absl::Time deadline) override {
    if (absl::Status s = Check("ReduceScatterGradients", data, TotalCount(counts),
                               DataType::kFloat32);
        !s.ok()) {
      return s;
    }
    return inner()->ReduceScatterGradients(data, counts, op, deadline);
  }
  absl::Status ReduceColumnsGradients(void* data, const std::vector<size_t>& counts,
                                      ReduceOp op, absl::Time deadline) override {
    if (absl::Status s = Check("ReduceColumnsGradients", data, TotalCount(counts),
                               DataType::kFloat32);
        !s.ok()) {
      return s;
    }
    return inner()->ReduceColumnsGradients(data, counts, op, deadline);
  }
  absl::Status AllGather(void* data, const std::vector<size_t>& counts, DataType type,
                         absl::Time deadline) override {
    if (absl::Status s = Check("AllGather", data, TotalCount(counts), type); !s.ok()) return s;
    return inner()->AllGather(data, counts, type, deadline);
  }
  absl::Status AllGatherInNode(void* data, const std::vector<size_t>& counts, DataType type,
                               absl::Time deadline) override {
    if (absl::Status s = Check("AllGatherInNode", data, TotalCount(counts), type); !s.ok()) {
      return s;
    }
    return inner()->AllGatherInNode(data, counts, type, deadline);
  }
  absl::Status Broadcast(void* data, size_t count, DataType type, int root,
                         absl::Time deadline) override {
    if (absl::Status s = Check("Broadcast", data, count, type); !s.ok()) return s;
    return inner()->Broadcast(data, count, type, root, deadline);
  }
  absl::StatusOr<std::unique_ptr<Communicator>> Shrink(const std::vector<int>& excluded,
                                                       absl::Time deadline) override {
    auto shrunk = inner()->Shrink(excluded, deadline);
    if (!shrunk.ok()) return shrunk.status();
    return NewMemoryChecked(std::move(*shrunk));
  }

 private:
  absl::Status Check(const char* call, const void* data, size_t count, DataType type) const {
    if (count == 0) return absl::OkStatus();
    absl::Status s = CheckBufferIn(inner()->memory(), data, count * DataTypeSize(type));
    if (s.ok()) return s;
    return absl::InvalidArgumentError(absl::StrCat(inner()->name(), " ", call, ": ", s.message()));
  }
};

}  // namespace

absl::Status CheckBufferIn(const MemorySpace& space, const void* data, size_t bytes) {
  if (InSpace(space, data, bytes)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "the buffer of %d bytes at %p is not in %s memory, which this communicator takes", bytes,
      data, space.ToString()));
}

std::unique_ptr<Communicator> NewMemoryChecked(std::unique_ptr<Communicator> inner) {
  return std::make_unique<MemoryChecked>(std::move(inner));
}

}  // namespace muster
