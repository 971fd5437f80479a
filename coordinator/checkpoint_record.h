// Value types of the checkpoint catalog. Copyable, no thread-safety of their
// own.
#ifndef MUSTER_COORDINATOR_CHECKPOINT_RECORD_H_
#define MUSTER_COORDINATOR_CHECKPOINT_RECORD_H_

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace muster {

struct ShardFileRecord {
  std::string member;    // member id that reported the file
  std::string path;
  uint64_t bytes = 0;
  std::string checksum;  // hex xxh3-64
};

enum class CheckpointState { kPending = 1, kCommitted = 2, kAborted = 3, kRetired = 4 };
const char* CheckpointStateName(CheckpointState state);

struct CheckpointRecord {
  uint64_t id = 0;
  int64_t step = 0;
  uint64_t generation = 0;
  // Member ids of the generation's world: the checkpoint commits when each
  // of them has reported.
  std::vector<std::string> expected;
  std::set<std::string> reported;
  CheckpointState state = CheckpointState::kPending;
  // Wall-clock times (Clock::WallNow), stored and shown as dates.
  absl::Time created = absl::UnixEpoch();
  absl::Time committed = absl::UnixEpoch();
  std::vector<ShardFileRecord> files;
  std::string metric_name;  // empty: no metric
  double metric_value = 0;
  std::string reason;       // why it was aborted

  uint32_t world_size() const { return static_cast<uint32_t>(expected.size()); }
  uint64_t total_bytes() const;
};

}  // namespace muster

#endif  // MUSTER_COORDINATOR_CHECKPOINT_RECORD_H_
