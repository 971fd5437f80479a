#include "trainer/comm/nccl/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/status_macros.h"

namespace muster {
namespace {

absl::Status CudaError(const char* what, cudaError_t e) {
  return absl::UnavailableError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

absl::Status NcclError(const char* what, ncclResult_t r) {
  return absl::AbortedError(absl::StrCat(what, ": ", ncclGetErrorString(r)));
}

absl::StatusOr<ncclDataType_t> NcclType(DataType type) {
  switch (type) {
    case DataType::kFloat32: return ncclFloat32;
    case DataType::kFloat16: return ncclFloat16;
    case DataType::kBFloat16: return ncclBfloat16;
    case DataType::kFloat64: return ncclFloat64;
    case DataType::kInt64: return ncclInt64;
  }
  return absl::InvalidArgumentError("unsupported data type for NCCL");
}

// ncclCommShrink (2.27.3) and ncclCommRevoke (2.28.7), where the headers
// this was built with have them and the library loaded is as new.
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 3)
#define MUSTER_NCCL_SHRINK 1
#endif
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 7)
#define MUSTER_NCCL_REVOKE 1
#endif

bool LoadedAtLeast(int code) {
  int version = 0;
  return ncclGetVersion(&version) == ncclSuccess && version >= code;
}

// The CUDA objects a communicator owns besides NCCL's: its stream, and the
// events that order it after the caller's stream and the caller's after it.
struct StreamAndEvents {
  cudaStream_t stream = nullptr;
  cudaEvent_t ready = nullptr;
  cudaEvent_t event = nullptr;

  void Destroy() {
    if (ready != nullptr) cudaEventDestroy(ready);
    if (event != nullptr) cudaEventDestroy(event);
    if (stream != nullptr) cudaStreamDestroy(stream);
    *this = {};
  }
};

absl::StatusOr<StreamAndEvents> CreateStreamAndEvents() {
  StreamAndEvents out;
  if (cudaError_t e = cudaStreamCreateWithFlags(&out.stream, cudaStreamNonBlocking);
      e != cudaSuccess) {
    return CudaError("cudaStreamCreate", e);
  }
  for (cudaEvent_t* ev : {&out.ready, &out.event}) {
    if (cudaError_t e = cudaEventCreateWithFlags(ev, cudaEventDisableTiming); e != cudaSuccess) {
      out.Destroy();
      return CudaError("cudaEventCreate", e);
    }
  }
  return out;
}

// Waits until the non-blocking `comm` that `r` started (an init or a
// shrink) is ready; aborts it on an error, at `deadline` (a time of
// `clock`), or (ABORTED) once `store`'s generation is over: a peer that
// learnt of the newer world first never joins.
absl::Status AwaitReady(ncclComm_t comm, ncclResult_t r, const char* what, absl::Time deadline,
                        Clock* clock, const Store* store = nullptr) {
  while (r == ncclInProgress || r == ncclSuccess) {
    ncclResult_t state = ncclInProgress;
    if (ncclResult_t q = ncclCommGetAsyncError(comm, &state); q != ncclSuccess) {
      r = q;
      break;
    }
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) {
      r = state;
      break;
    }
    if (clock->Now() >= deadline) {
      ncclCommAbort(comm);
      return absl::DeadlineExceededError(absl::StrCat(what, " did not complete before the deadline"));
    }
    if (store != nullptr && store->Over()) {
      ncclCommAbort(comm);
      return absl::AbortedError(absl::StrCat(what, " given up: a newer world exists"));
    }
    ::usleep(100);
  }
  if (comm != nullptr) ncclCommAbort(comm);
  return NcclError(what, r);
}

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, StreamAndEvents cuda, int rank, int size, int device,
                   Clock* clock, CallerStreamFn caller_stream, bool shrinkable)
      : comm_(comm),
        stream_(cuda.stream),
        ready_(cuda.ready),
        event_(cuda.event),
        rank_(rank),
        size_(size),
        device_(device),
        clock_(clock),
        caller_stream_(std::move(caller_stream)),
        shrinkable_(shrinkable && size > 1) {}

  ~NcclCommunicator() override {
    cudaSetDevice(device_);
    if (!aborted_comm_) {  // else ncclCommAbort already freed it
      // ncclCommDestroy refuses a communicator whose state is not
      // ncclSuccess (and leaves this thread inside an NCCL group): abort it.
      ncclResult_t state = ncclInProgress;
      const bool settled =
          ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state == ncclSuccess;
      if (broken_ || spent_ || abort_requested_ || !settled) {
        ncclCommAbort(comm_);
      } else {
        ncclCommDestroy(comm_);
      }
    }
    cudaEventDestroy(ready_);
    cudaEventDestroy(event_);
    cudaStreamDestroy(stream_);
    if (scratch_ != nullptr) cudaFree(scratch_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "nccl"; }
  MemorySpace memory() const override { return MemorySpace::Cuda(device_); }

  absl::Status AllReduce(void* data, size_t count, DataType type, ReduceOp op,
                         absl::Time deadline) override {
    auto t = NcclType(type);
    if (!t.ok()) return t.status();
    const ncclRedOp_t red = op == ReduceOp::kAverage ? ncclAvg : ncclSum;
    return Launch(deadline, [&] {
      return ncclAllReduce(data, data, count, *t, red, comm_, stream_);
    });
  }

  absl::Status ReduceScatter(void* data, const std::vector<size_t>& counts, DataType type,
                             ReduceOp op, absl::Time deadline) override {
    if (absl::Status s = CheckCounts(counts, size_); !s.ok()) return s;
    auto t = NcclType(type);
    if (!t.ok()) return t.status();
    const ncclRedOp_t red = op == ReduceOp::kAverage ? ncclAvg : ncclSum;
    char* base = static_cast<char*>(data);
    const size_t es = DataTypeSize(type);
    bool equal = true;
    for (size_t c : counts) equal &= c == counts[0];
    if (equal) {
      return Launch(deadline, [&] {
        return ncclReduceScatter(base, base + rank_ * counts[0] * es, counts[0], *t, red, comm_,
                                 stream_);
      });
    }
    // Uneven segments: one reduce per segment to its owner, grouped.
    return Launch(deadline, [&] {
      ncclGroupStart();
      size_t offset = 0;
      for (int r = 0; r < size_; ++r) {
        ncclReduce(base + offset * es, base + offset * es, counts[r], *t, red, r, comm_, stream_);
        offset += counts[r];
      }
      return ncclGroupEnd();
    });
  }

  absl::Status AllGather(void* data, const std::vector<size_t>& counts, DataType type,
                         absl::Time deadline) override {
    if (absl::Status s = CheckCounts(counts, size_); !s.ok()) return s;
    auto t = NcclType(type);
    if (!t.ok()) return t.status();
    char* base = static_cast<char*>(data);
    const size_t es = DataTypeSize(type);
    bool equal = true;
    for (size_t c : counts) equal &= c == counts[0];
    if (equal) {
      return Launch(deadline, [&] {
        return ncclAllGather(base + rank_ * counts[0] * es, base, counts[0], *t, comm_, stream_);
      });
    }
    return Launch(deadline, [&] {
      ncclGroupStart();
      size_t offset = 0;
      for (int r = 0; r < size_; ++r) {
        ncclBroadcast(base + offset * es, base + offset * es, counts[r], *t, r, comm_, stream_);
        offset += counts[r];
      }
      return ncclGroupEnd();
    });
  }

  absl::Status Broadcast(void* data, size_t count, DataType type, int root,
                         absl::Time deadline) override {
    if (root < 0 || root >= size_) {
      return absl::InvalidArgumentError(absl::StrCat("root ", root, " is not a rank of ", size_));
    }
    auto t = NcclType(type);
    if (!t.ok()) return t.status();
    return Launch(deadline, [&] {
      return ncclBroadcast(data, data, count, *t, root, comm_, stream_);
    });
  }

  absl::Status Barrier(absl::Time deadline) override {
    if (scratch_ == nullptr) {
      cudaSetDevice(device_);
      if (cudaError_t e = cudaMalloc(&scratch_, sizeof(float)); e != cudaSuccess) {
        return CudaError("cudaMalloc", e);
      }
    }
    return AllReduce(scratch_, 1, DataType::kFloat32, ReduceOp::kSum, deadline);
  }

  bool CanShrink() const override {
#ifdef MUSTER_NCCL_SHRINK
    return shrinkable_ && !aborted_comm_ && !spent_ && LoadedAtLeast(NCCL_VERSION(2, 27, 3));
#else
    return false;
#endif
  }

  absl::Status ReadyToShrink(absl::Time deadline) override;
  absl::StatusOr<std::unique_ptr<Communicator>> Shrink(const std::vector<int>& excluded,
                                                       absl::Time deadline) override;

  void Abort(const absl::Status& why) override {
    absl::MutexLock lock(&why_mu_);
    if (abort_requested_) return;
    why_ = std::string(why.message());  // before the flag a collective reads
    abort_requested_ = true;
  }

 private:
  absl::Status BrokenStatus() {
    absl::MutexLock lock(&why_mu_);
    return absl::AbortedError(absl::StrCat("nccl communicator aborted: ", why_));
  }

  // Marks the communicator broken and stops its work in flight (once):
  // ncclCommRevoke where it may shrink and NCCL has it, which leaves the
  // communicator to shrink from (node_comm.h), else ncclCommAbort. Returns
  // `why`.
  absl::Status Break(absl::Status why) {
    broken_ = true;
    if (aborted_comm_ || revoked_) return why;
#ifdef MUSTER_NCCL_REVOKE
    if (CanShrink() && LoadedAtLeast(NCCL_VERSION(2, 28, 7))) {
      const ncclResult_t r = ncclCommRevoke(comm_, NCCL_REVOKE_DEFAULT);
      revoked_ = r == ncclSuccess || r == ncclInProgress;
      if (revoked_) return why;
    }
#endif
    ncclCommAbort(comm_);
    aborted_comm_ = true;
    return why;
  }

  // The reason to stop watching, if any: an asynchronous NCCL error, Abort()
  // or the deadline.
  absl::Status Watch(absl::Time deadline) {
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm_, &async);
    if (async != ncclSuccess && async != ncclInProgress) return Break(NcclError("nccl", async));
    if (abort_requested_) return Break(BrokenStatus());
    if (clock_->Now() >= deadline) {
      return Break(absl::DeadlineExceededError("nccl collective passed its deadline"));
    }
    return absl::OkStatus();
  }

  // Enqueues with `enqueue` after the caller's stream and watches the
  // communicator's stream until done.
  absl::Status Launch(absl::Time deadline, const std::function<ncclResult_t()>& enqueue) {
    if (broken_ || abort_requested_) {
      broken_ = true;
      return BrokenStatus();
    }
    cudaSetDevice(device_);
    cudaStream_t caller =
        caller_stream_ ? static_cast<cudaStream_t>(caller_stream_()) : cudaStream_t{nullptr};
    if (cudaError_t e = cudaEventRecord(ready_, caller); e != cudaSuccess) {
      return Break(CudaError("cudaEventRecord", e));
    }
    if (cudaError_t e = cudaStreamWaitEvent(stream_, ready_, 0); e != cudaSuccess) {
      return Break(CudaError("cudaStreamWaitEvent", e));
    }
    ncclResult_t r = enqueue();
    if (r != ncclSuccess && r != ncclInProgress) return Break(NcclError("nccl enqueue", r));
    // A non-blocking communicator may still be enqueueing: no stream
    // operation until it reports success.
    for (int i = 0; r == ncclInProgress; ++i) {
      ncclCommGetAsyncError(comm_, &r);
      if (r == ncclInProgress) {
        if (absl::Status s = Watch(deadline); !s.ok()) return s;
        if (i > 1000) ::usleep(50);
      }
    }
    if (r != ncclSuccess) return Break(NcclError("nccl enqueue", r));
    if (cudaError_t e = cudaEventRecord(event_, stream_); e != cudaSuccess) {
      return Break(CudaError("cudaEventRecord", e));
    }
    // Whatever the caller queues next on its stream reads the result.
    if (cudaError_t e = cudaStreamWaitEvent(caller, event_, 0); e != cudaSuccess) {
      return Break(CudaError("cudaStreamWaitEvent", e));
    }
    for (int i = 0;; ++i) {
      const cudaError_t q = cudaEventQuery(event_);
      if (q == cudaSuccess) return absl::OkStatus();
      if (q != cudaErrorNotReady) return Break(CudaError("cuda stream", q));
      if (absl::Status s = Watch(deadline); !s.ok()) return s;
      if (i > 1000) ::usleep(50);
    }
  }

  ncclComm_t comm_;
  cudaStream_t stream_;
  cudaEvent_t ready_;  // the caller's stream reached the collective
  cudaEvent_t event_;  // the collective is done
  const int rank_;
  const int size_;
  const int device_;
  Clock* const clock_;  // deadlines are times of its Now()
  const CallerStreamFn caller_stream_;
  // A node-local communicator of several ranks, which a regroup may shrink.
  const bool shrinkable_;
  void* scratch_ = nullptr;
  bool broken_ = false;
  bool aborted_comm_ = false;
  bool revoked_ = false;  // by Break: quiescent once NCCL says so
  bool spent_ = false;    // Shrink made a new one from it
  std::atomic<bool> abort_requested_{false};
  absl::Mutex why_mu_;
  std::string why_ ABSL_GUARDED_BY(why_mu_);
};

absl::Status NcclCommunicator::ReadyToShrink(absl::Time deadline) {
  if (!CanShrink()) return Communicator::ReadyToShrink(deadline);
  cudaSetDevice(device_);
  // A revoked communicator reports ncclInProgress until its work in flight
  // has stopped, then ncclSuccess; NCCL refuses to shrink it before.
  for (;;) {
    ncclResult_t state = ncclInProgress;
    if (ncclResult_t r = ncclCommGetAsyncError(comm_, &state); r != ncclSuccess) {
      broken_ = true;
      return NcclError("ncclCommGetAsyncError", r);
    }
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) {
      broken_ = true;  // aborted, not destroyed, when it is dropped
      return NcclError("the NCCL communicator to shrink", state);
    }
    if (clock_->Now() >= deadline) {
      broken_ = true;
      return absl::DeadlineExceededError("the revoked NCCL communicator did not quiesce");
    }
    ::usleep(100);
  }
}

absl::StatusOr<std::unique_ptr<Communicator>> NcclCommunicator::Shrink(
    const std::vector<int>& excluded, absl::Time deadline) {
#ifndef MUSTER_NCCL_SHRINK
  return Communicator::Shrink(excluded, deadline);
#else
  if (!CanShrink()) return Communicator::Shrink(excluded, deadline);
  if (excluded.empty() || std::count(excluded.begin(), excluded.end(), rank_) > 0) {
    return absl::InvalidArgumentError("a shrink leaves out some ranks, never the caller");
  }
  spent_ = true;
  cudaSetDevice(device_);
  std::vector<int> gone = excluded;  // NCCL sorts it in place
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  // NCCL writes `child` from its own thread when the shrink completes, and
  // reports progress on the parent until then. NCCL_SHRINK_ABORT stops work
  // a failure or an Abort left in flight, and never shares resources with
  // the parent, which is aborted once the child exists.
  ncclComm_t child = nullptr;
  ncclResult_t r = ncclCommShrink(comm_, gone.data(), static_cast<int>(gone.size()), &child,
                                  &config, NCCL_SHRINK_ABORT);
  while (r == ncclSuccess || r == ncclInProgress) {
    ncclResult_t state = ncclInProgress;
    if (ncclResult_t q = ncclCommGetAsyncError(comm_, &state); q != ncclSuccess) {
      r = q;
      break;
    }
    if (state != ncclInProgress) {
      r = state;
      break;
    }
    if (clock_->Now() >= deadline) {
      r = ncclInProgress;
      break;
    }
    ::usleep(100);
  }
  if (r != ncclSuccess || child == nullptr) {
    // Aborting the parent stops its shrink and waits for it; what it made
    // of the child is aborted too.
    ncclCommAbort(comm_);
    aborted_comm_ = true;
    if (child != nullptr) ncclCommAbort(child);
    if (r == ncclInProgress) {
      return absl::DeadlineExceededError("ncclCommShrink did not complete before the deadline");
    }
    return r == ncclSuccess ? absl::InternalError("ncclCommShrink made no communicator")
                            : NcclError("ncclCommShrink", r);
  }
  MUSTER_RETURN_IF_ERROR(AwaitReady(child, ncclInProgress, "ncclCommShrink", deadline, clock_));
  absl::StatusOr<StreamAndEvents> cuda = CreateStreamAndEvents();
  if (!cuda.ok()) {
    ncclCommAbort(child);
    return cuda.status();
  }
  return std::unique_ptr<Communicator>(new NcclCommunicator(
      child, *cuda, RankAfterShrink(rank_, gone), size_ - static_cast<int>(gone.size()),
      device_, clock_, caller_stream_,
      /*shrinkable=*/true));
#endif
}

}  // namespace

int CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

bool IsCudaDeviceMemory(const void* data, size_t bytes, int device) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, data) != cudaSuccess) {
    cudaGetLastError();  // not an error to keep
    return false;
  }
  if (a.type != cudaMemoryTypeDevice || (device >= 0 && a.device != device)) return false;
  if (bytes <= 1) return true;
  cudaPointerAttributes last{};
  const void* end = static_cast<const char*>(data) + bytes - 1;
  if (cudaPointerGetAttributes(&last, end) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return last.type == cudaMemoryTypeDevice && (device < 0 || last.device == device);
}

namespace {

// NCCL refuses the communicator it is asked to build ("invalid usage")
// for a reason every try meets again, most often two of its ranks on one
// GPU: not a failure of this world but a configuration to change. It is
// INVALID_ARGUMENT, which ends the trainer with the reason; an ABORTED
// would be reported, and the next world would fail the same way at once.
absl::Status InitRefused(const absl::Status& s, int size, int device) {
  if (!absl::IsAborted(s) ||
      !absl::StrContains(s.message(), ncclGetErrorString(ncclInvalidUsage))) {
    return s;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      s.message(), ": NCCL refuses a communicator of ", size, " ranks; this rank is on cuda:",
      device, ". NCCL takes one rank per GPU, so two trainers of one NCCL communicator on the "
      "same GPU are refused. Give each trainer of a node its own GPU (a trainer uses GPU local "
      "rank mod the GPUs it sees), or let trainers that share a GPU meet as separate nodes with "
      "--backend hier (NCCL inside a node, Gloo between nodes)"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> NewNcclCommunicator(
    Store* store, int rank, int size, int device, absl::Time deadline, Clock* clock,
    CallerStreamFn caller_stream, bool shrinkable) {
  if (CudaDeviceCount() <= device) {
    return absl::FailedPreconditionError(absl::StrCat("no CUDA device ", device));
  }
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    return CudaError("cudaSetDevice", e);
  }
  ncclUniqueId id;
  if (rank == 0) {
    if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
      return NcclError("ncclGetUniqueId", r);
    }
    if (absl::Status s = store->Set("id", std::string(id.internal, sizeof(id.internal)),
                                    deadline);
        !s.ok()) {
      return s;
    }
  } else {
    auto v = store->Wait({"id"}, deadline);
    if (!v.ok()) return v.status();
    if ((*v)[0].size() != sizeof(id.internal)) {
      return absl::FailedPreconditionError("malformed NCCL unique id in the store");
    }
    std::memcpy(id.internal, (*v)[0].data(), sizeof(id.internal));
  }
  MUSTER_ASSIGN_OR_RETURN(StreamAndEvents cuda, CreateStreamAndEvents());
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  if (absl::Status s = AwaitReady(comm, r, "ncclCommInitRankConfig", deadline, clock, store);
      !s.ok()) {
    cuda.Destroy();
    return InitRefused(s, size, device);
  }
  return std::unique_ptr<Communicator>(
      new NcclCommunicator(comm, cuda, rank, size, device, clock, std::move(caller_stream),
                           shrinkable));
}

}  // namespace muster
