// Plain value types shared by the coordinator's domain classes. No gRPC, no
// LibTorch; copyable; no thread-safety of their own.
#ifndef MUSTER_COORDINATOR_TYPES_H_
#define MUSTER_COORDINATOR_TYPES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"

namespace muster {

// Identity of one trainer process: a stable slot name and a number that is
// new for every process start.
struct MemberKey {
  std::string id;
  uint64_t incarnation = 0;

  bool operator==(const MemberKey& o) const {
    return id == o.id && incarnation == o.incarnation;
  }
  bool operator!=(const MemberKey& o) const { return !(*this == o); }
};

enum class MemberState {
  kWaiting,   // joined, not part of the current world
  kActive,    // part of the current world
  kDraining,  // told to leave at the next step boundary
  kFailed,    // session broke, heartbeat timed out, or fenced
  kLeft,      // left gracefully
  kFinished,  // completed training
};
const char* MemberStateName(MemberState state);

// One member's place in a world.
struct Assignment {
  MemberKey member;
  std::string node;
  std::string state_address;
  uint32_t rank = 0;
  uint32_t node_rank = 0;
  uint32_t local_rank = 0;
  uint32_t local_world_size = 0;
  int64_t step = 0;  // reported when the member entered this generation
};

// The membership fixed by one generation. Members are ordered by rank and the
// ranks of one node are contiguous.
struct World {
  uint64_t generation = 0;  // 0: no world yet
  uint32_t node_count = 0;
  std::vector<Assignment> members;
  uint32_t state_source_rank = 0;
  int64_t state_step = 0;
  // Stored as it paused below min_members (Coordinator::Pause): nobody
  // trains in it, so a coordinator restarted on it does not wait for its
  // members (GenerationState::Loaded).
  bool paused = false;

  uint32_t size() const { return static_cast<uint32_t>(members.size()); }
  // Rank of `id` in this world, or -1. O(1) once Index() ran after the last
  // change to `members` (AssignWorld and the state store do); a linear scan
  // otherwise.
  int RankOf(const std::string& id) const;
  // The same, trying `hint` first: ids are unique in a world, so `hint` is
  // the rank when the member there has the id (no lookup then).
  int RankOf(const std::string& id, uint32_t hint) const;
  // Builds the id -> rank index RankOf uses, the digest and the node sizes.
  void Index();
  // XXH3-64 of every member's id, incarnation, node and rank, in rank
  // order (as of the last Index()).
  uint64_t digest() const { return digest_; }
  // The distinct numbers of members per node, ascending (as of Index()).
  const std::vector<uint32_t>& node_sizes() const { return node_sizes_; }

 private:
  absl::flat_hash_map<std::string, uint32_t> rank_of_;
  uint64_t digest_ = 0;
  std::vector<uint32_t> node_sizes_;
};

// A member's report that the world of `generation` broke under it
// (RendezvousRequest.broken): only the trainers see a broken link between
// two of them, a collective past its deadline, or a peer stuck in compute.
struct BrokenWorldReport {
  uint64_t generation = 0;
  std::string reason;
  // Members of the regroup must come to its rendezvous within this, or are
  // fenced as hung. Zero: CoordinatorOptions::regroup_arrival.
  absl::Duration deadline;
  // Ranks of that world the reporter could not reach over the network.
  std::vector<uint32_t> unreachable;
};

// What happened to the job; kept in the event log.
struct JobEvent {
  absl::Time time;     // the wall clock's (Clock::WallNow): a record
  std::string kind;    // "join", "fail", "regroup", "leave", "checkpoint", ...
  std::string detail;  // human-readable
};

}  // namespace muster

#endif  // MUSTER_COORDINATOR_TYPES_H_
