// The layout of a node's shared-memory segment and the wait loop over it.
// Internal to the shared-memory communicator.
#ifndef MUSTER_TRAINER_COMM_SHM_SHM_SEGMENT_H_
#define MUSTER_TRAINER_COMM_SHM_SHM_SEGMENT_H_

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace muster {
namespace shm {

inline constexpr uint64_t kMagic = 0x6d75737465727368ull;  // "mustersh"
inline constexpr uint32_t kVersion = 1;
inline constexpr size_t kMaxRanks = 256;
inline constexpr size_t kHeaderBytes = 4096 + kMaxRanks * 64;

struct alignas(64) RankControl {
  std::atomic<uint64_t> arrived;  // last barrier this rank reached
  std::atomic<int32_t> pid;
};

struct Header {
  uint64_t magic;
  uint32_t version;
  int32_t size;
  uint64_t slot_bytes;
  std::atomic<int32_t> aborted;
  char reason[256];
  // Barrier: arrivals in the current epoch, and the epoch (a futex word the
  // last arriver bumps and wakes).
  alignas(64) std::atomic<uint32_t> arrivals;
  alignas(64) std::atomic<uint32_t> epoch;
};

// Offsets inside the segment.
inline size_t SegmentBytes(int size, size_t slot_bytes) {
  return kHeaderBytes + 2 * (static_cast<size_t>(size) + 1) * slot_bytes;
}
inline RankControl* Control(void* base, int rank) {
  return reinterpret_cast<RankControl*>(static_cast<char*>(base) + 4096) + rank;
}
// Staging slot of `rank` (rank == size: the result area) in buffer set `set`.
inline char* Slot(void* base, int size, size_t slot_bytes, int set, int rank) {
  return static_cast<char*>(base) + kHeaderBytes +
         (static_cast<size_t>(set) * (size + 1) + rank) * slot_bytes;
}

}  // namespace shm
}  // namespace muster

#endif  // MUSTER_TRAINER_COMM_SHM_SHM_SEGMENT_H_
