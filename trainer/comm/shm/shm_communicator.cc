#include "trainer/comm/shm/shm_communicator.h"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <linux/futex.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/random/random.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/clock.h"
#include "common/logging.h"
#include "trainer/comm/reduce.h"
#include "trainer/comm/shm/shm_segment.h"

namespace muster {
namespace {

std::string Sanitize(const std::string& s) {
  std::string out;
  for (char c : s) out.push_back(std::isalnum(static_cast<unsigned char>(c)) || c == '_' ? c : '_');
  return out.substr(0, 64);
}

std::string Prefix(const std::string& job) { return "muster-" + Sanitize(job) + "-"; }

// Waits while *word == expected, at most `timeout_us` (spurious wake-ups are
// fine: callers re-check).
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeout_us) {
  timespec ts{static_cast<time_t>(timeout_us / 1'000'000),
              static_cast<long>((timeout_us % 1'000'000) * 1000)};
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr,
            nullptr, 0);
}


// Removes segments a crash left for older generations of this node.
void SweepStale(const std::string& job, const std::string& node, uint64_t generation) {
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return;
  const std::string prefix = Prefix(job) + "g";
  const std::string node_part = "-" + Sanitize(node) + "-";
  while (dirent* e = ::readdir(dir)) {
    const std::string name = e->d_name;
    if (name.rfind(prefix, 0) != 0 || name.find(node_part) == std::string::npos) continue;
    uint64_t gen = 0;
    const std::string rest = name.substr(prefix.size());
    if (!absl::SimpleAtoi(rest.substr(0, rest.find('-')), &gen) || gen >= generation) continue;
    if (::shm_unlink(("/" + name).c_str()) == 0) {
      MUSTER_LOG(INFO) << "removed stale shared memory segment /dev/shm/" << name;
    }
  }
  ::closedir(dir);
}

class ShmCommunicator : public Communicator {
 public:
  ShmCommunicator(void* base, size_t bytes, int rank, int size, size_t slot_bytes, Clock* clock)
      : base_(base),
        bytes_(bytes),
        rank_(rank),
        size_(size),
        slot_bytes_(slot_bytes),
        clock_(clock) {}
  ~ShmCommunicator() override { ::munmap(base_, bytes_); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "shm"; }

  absl::Status AllReduce(void* data, size_t count, DataType type, ReduceOp op,
                         absl::Time deadline) override {
    return Rounds(data, EvenSplit(count, size_), type, op, /*reduce=*/true, /*gather=*/true,
                  deadline);
  }
  absl::Status ReduceScatter(void* data, const std::vector<size_t>& counts, DataType type,
                             ReduceOp op, absl::Time deadline) override {
    if (absl::Status s = CheckCounts(counts, size_); !s.ok()) return s;
    return Rounds(data, counts, type, op, /*reduce=*/true, /*gather=*/false, deadline);
  }
  absl::Status AllGather(void* data, const std::vector<size_t>& counts, DataType type,
                         absl::Time deadline) override {
    if (absl::Status s = CheckCounts(counts, size_); !s.ok()) return s;
    return Rounds(data, counts, type, ReduceOp::kSum, /*reduce=*/false, /*gather=*/true,
                  deadline);
  }
  absl::Status Broadcast(void* data, size_t count, DataType type, int root,
                         absl::Time deadline) override;
  absl::Status Barrier(absl::Time deadline) override { return Arrive(deadline); }
  void Abort(const absl::Status& why) override;

  // Waits until every rank reached the next barrier. `store`, while the
  // ranks attach: gives up (ABORTED) once its generation is over, since a
  // peer that learnt of the newer world first never attaches.
  absl::Status Arrive(absl::Time deadline, const Store* store = nullptr);

 private:
  shm::Header* header() const { return static_cast<shm::Header*>(base_); }
  absl::Status Aborted() const;
  absl::Status Rounds(void* data, const std::vector<size_t>& counts, DataType type,
                      ReduceOp op, bool reduce, bool gather, absl::Time deadline);
  char* SlotOf(int set, int rank) const {
    return shm::Slot(base_, size_, slot_bytes_, set, rank);
  }

  void* const base_;
  const size_t bytes_;
  const int rank_;
  const int size_;
  const size_t slot_bytes_;
  Clock* const clock_;  // deadlines are times of its Now()
  uint64_t seq_ = 0;    // barriers passed; touched by the calling thread only
  uint64_t round_ = 0;  // rounds run; picks the staging set
  std::atomic<bool> local_abort_{false};
};

void ShmCommunicator::Abort(const absl::Status& why) {
  local_abort_ = true;
  if (header()->aborted.exchange(1) == 0) {
    const std::string msg = absl::StrCat("rank ", rank_, ": ", why.message());
    std::strncpy(header()->reason, msg.c_str(), sizeof(header()->reason) - 1);
  }
  FutexWakeAll(&header()->epoch);
}

absl::Status ShmCommunicator::Aborted() const {
  return absl::AbortedError(absl::StrCat("shared memory communicator aborted (",
                                         std::string(header()->reason), ")"));
}

absl::Status ShmCommunicator::Arrive(absl::Time deadline, const Store* store) {
  ++seq_;
  shm::Header* h = header();
  if (local_abort_ || h->aborted.load() != 0) return Aborted();
  const uint32_t epoch = h->epoch.load(std::memory_order_acquire);
  if (h->arrivals.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(size_)) {
    h->arrivals.store(0, std::memory_order_relaxed);
    h->epoch.store(epoch + 1, std::memory_order_release);
    FutexWakeAll(&h->epoch);
    return absl::OkStatus();
  }
  for (uint64_t i = 0;; ++i) {
    if (h->epoch.load(std::memory_order_acquire) != epoch) return absl::OkStatus();
    if (local_abort_.load(std::memory_order_relaxed) ||
        h->aborted.load(std::memory_order_relaxed) != 0) {
      local_abort_ = true;
      return Aborted();
    }
    if (i < 256) {
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
      continue;
    }
    // Sleep in the kernel until the last arriver wakes us; wake up every
    // 2 ms to look at the deadline, the abort flag and the peers.
    FutexWait(&h->epoch, epoch, 2000);
    if ((i & 7) != 0) continue;
    if (clock_->Now() >= deadline) {
      Abort(absl::DeadlineExceededError("deadline passed in a shared memory barrier"));
      return absl::DeadlineExceededError(
          "shared memory barrier timed out waiting for local ranks");
    }
    if (store != nullptr && store->Over()) {
      Abort(absl::AbortedError("a newer world exists"));
      return Aborted();
    }
    for (int p = 0; p < size_; ++p) {
      const int32_t pid = shm::Control(base_, p)->pid.load(std::memory_order_relaxed);
      if (pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH) {
        Abort(absl::AbortedError(absl::StrCat("local rank ", p, " (pid ", pid, ") exited")));
        return Aborted();
      }
    }
  }
}

absl::Status ShmCommunicator::Rounds(void* data, const std::vector<size_t>& counts,
                                     DataType type, ReduceOp op, bool reduce, bool gather,
                                     absl::Time deadline) {
  if (local_abort_ || header()->aborted != 0) return Aborted();
  const size_t es = DataTypeSize(type);
  const size_t q = slot_bytes_ / (static_cast<size_t>(size_) * es);
  std::vector<size_t> offset(size_ + 1, 0);
  size_t rounds = 0;
  for (int s = 0; s < size_; ++s) {
    offset[s + 1] = offset[s] + counts[s];
    rounds = std::max(rounds, (counts[s] + q - 1) / q);
  }
  char* base = static_cast<char*>(data);
  auto part = [&](int s, size_t lo) { return lo < counts[s] ? std::min(q, counts[s] - lo) : 0; };
  auto at = [&](int s, size_t lo) { return base + (offset[s] + lo) * es; };
  for (size_t k = 0; k < rounds; ++k) {
    const int set = static_cast<int>(round_++ & 1);
    const size_t lo = k * q;
    char* result = SlotOf(set, size_);
    char* own = at(rank_, lo);
    const size_t n = part(rank_, lo);
    if (reduce) {
      char* mine = SlotOf(set, rank_);
      for (int s = 0; s < size_; ++s) {
        if (s != rank_) std::memcpy(mine + s * q * es, at(s, lo), part(s, lo) * es);
      }
      if (absl::Status st = Arrive(deadline); !st.ok()) return st;
      // In rank order; half types accumulate in float32 and round once.
      std::vector<const void*> peers;
      for (int p = 0; p < size_; ++p) {
        if (p != rank_) peers.push_back(SlotOf(set, p) + rank_ * q * es);
      }
      SumAll(type, own, own, peers, n, op == ReduceOp::kAverage ? size_ : 1);
    }
    if (!gather) continue;
    std::memcpy(result + rank_ * q * es, own, n * es);
    if (absl::Status st = Arrive(deadline); !st.ok()) return st;
    for (int s = 0; s < size_; ++s) {
      if (s != rank_) std::memcpy(at(s, lo), result + s * q * es, part(s, lo) * es);
    }
  }
  if (rounds == 0) return Arrive(deadline);  // keep ranks in step for empty calls
  return absl::OkStatus();
}

absl::Status ShmCommunicator::Broadcast(void* data, size_t count, DataType type, int root,
                                        absl::Time deadline) {
  if (root < 0 || root >= size_) {
    return absl::InvalidArgumentError(absl::StrCat("root ", root, " is not a rank of ", size_));
  }
  if (local_abort_ || header()->aborted != 0) return Aborted();
  const size_t bytes = count * DataTypeSize(type);
  char* base = static_cast<char*>(data);
  for (size_t lo = 0; lo < bytes || (lo == 0 && bytes == 0); lo += slot_bytes_) {
    const size_t n = std::min(slot_bytes_, bytes - lo);
    char* result = SlotOf(static_cast<int>(round_++ & 1), size_);
    if (rank_ == root) std::memcpy(result, base + lo, n);
    if (absl::Status st = Arrive(deadline); !st.ok()) return st;
    if (rank_ != root) std::memcpy(base + lo, result, n);
    if (bytes == 0) break;
  }
  return absl::OkStatus();
}

absl::StatusOr<void*> MapSegment(const std::string& name, size_t bytes, bool create) {
  const int fd = create ? ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600)
                        : ::shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("shm_open ", name, ": ", std::strerror(errno)));
  }
  if (create && ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int err = errno;
    ::close(fd);
    ::shm_unlink(name.c_str());
    return absl::UnavailableError(absl::StrCat("ftruncate ", name, " to ", bytes,
                                               " bytes: ", std::strerror(err)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < bytes) {
    ::close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("shared memory segment ", name, " is smaller than ", bytes, " bytes"));
  }
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);
  if (base == MAP_FAILED) {
    if (create) ::shm_unlink(name.c_str());
    return absl::UnavailableError(absl::StrCat("mmap ", name, ": ", std::strerror(err)));
  }
  return base;
}

}  // namespace

std::vector<std::string> ListShmSegments(const std::string& job) {
  std::vector<std::string> out;
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return out;
  const std::string prefix = Prefix(job);
  while (dirent* e = ::readdir(dir)) {
    if (std::string(e->d_name).rfind(prefix, 0) == 0) out.push_back(e->d_name);
  }
  ::closedir(dir);
  return out;
}

absl::StatusOr<std::unique_ptr<Communicator>> NewShmCommunicator(Store* store, int rank,
                                                                 int size,
                                                                 const ShmOptions& options,
                                                                 absl::Time deadline) {
  if (size < 1 || static_cast<size_t>(size) > shm::kMaxRanks || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " of size ", size,
                                                   " (at most ", shm::kMaxRanks, " ranks)"));
  }
  if (options.slot_bytes < static_cast<size_t>(size) * 8) {
    return absl::InvalidArgumentError("slot_bytes is too small for this many ranks");
  }
  const size_t bytes = shm::SegmentBytes(size, options.slot_bytes);
  std::string name;
  void* base = nullptr;
  if (rank == 0) {
    SweepStale(options.job, options.node, options.generation);
    absl::BitGen gen;
    name = absl::StrFormat("/%sg%d-%s-%08x", Prefix(options.job), options.generation,
                           Sanitize(options.node), absl::Uniform<uint32_t>(gen));
    auto mapped = MapSegment(name, bytes, /*create=*/true);
    if (!mapped.ok()) return mapped.status();
    base = *mapped;
    auto* h = static_cast<shm::Header*>(base);
    h->version = shm::kVersion;
    h->size = size;
    h->slot_bytes = options.slot_bytes;
    h->aborted.store(0);
    h->reason[0] = '\0';
    h->arrivals.store(0);
    h->epoch.store(0);
    for (int p = 0; p < size; ++p) {
      shm::Control(base, p)->arrived.store(0);
      shm::Control(base, p)->pid.store(0);
    }
    std::atomic_thread_fence(std::memory_order_release);
    h->magic = shm::kMagic;
    if (absl::Status s = store->Set("segment", name, deadline); !s.ok()) {
      ::munmap(base, bytes);
      ::shm_unlink(name.c_str());
      return s;
    }
  } else {
    auto value = store->Wait({"segment"}, deadline);
    if (!value.ok()) return value.status();
    name = (*value)[0];
    auto mapped = MapSegment(name, bytes, /*create=*/false);
    if (!mapped.ok()) return mapped.status();
    base = *mapped;
    auto* h = static_cast<shm::Header*>(base);
    if (h->magic != shm::kMagic || h->version != shm::kVersion || h->size != size ||
        h->slot_bytes != options.slot_bytes) {
      ::munmap(base, bytes);
      return absl::FailedPreconditionError(
          absl::StrCat("shared memory segment ", name, " has another layout"));
    }
  }
  shm::Control(base, rank)->pid.store(static_cast<int32_t>(::getpid()));
  auto comm = std::make_unique<ShmCommunicator>(base, bytes, rank, size, options.slot_bytes,
                                                options.clock);
  absl::Status attached = comm->Arrive(deadline, store);
  if (rank == 0) ::shm_unlink(name.c_str());  // every rank mapped it (or gave up)
  if (!attached.ok()) return attached;
  return std::unique_ptr<Communicator>(std::move(comm));
}

}  // namespace muster
