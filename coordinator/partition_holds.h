// PartitionHolds: nodes left out of the world because the network between
// them and their peers failed while every one of them still reached the
// coordinator (a data network's port lost, one direction of a link
// dropped).
//
// A member whose world broke reports the ranks it could not reach
// (BrokenWorldReport::unreachable). Forming the same world again would
// break it again, so the coordinator leaves a side out: LeaveOut() picks
// the nodes, and Hold() keeps each out for a while. The choice is stable:
//   - the node named in the most unreachable pairs goes first (one cut from
//     all its peers, rather than each peer that cannot reach it);
//   - on a tie, the node with fewer members of the world, then the one
//     whose first rank is highest: the newer side leaves, whichever side
//     reported first.
// A held node's members stay alive and wait for a world. When the hold
// ends they join again at a step boundary; if the link still fails, the
// probe of the new world reports it again and the node is held twice as
// long (first_hold, doubling up to max_hold; a node with no hold for
// forget_after starts again from first_hold). A link that stays down so
// costs the job one failed world build (about a probe timeout) per
// max_hold, instead of a world that never starts.
//
// Not persisted: a coordinator that takes over forgets the holds, and the
// probes report the link again. Not thread-safe (the coordinator's lock).
#ifndef MUSTER_COORDINATOR_PARTITION_HOLDS_H_
#define MUSTER_COORDINATOR_PARTITION_HOLDS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "coordinator/types.h"

namespace muster {

struct PartitionHoldOptions {
  absl::Duration first_hold = absl::Seconds(10);
  absl::Duration max_hold = absl::Seconds(160);
  absl::Duration forget_after = absl::Minutes(10);
};

class PartitionHolds {
 public:
  explicit PartitionHolds(PartitionHoldOptions options = {}) : options_(options) {}

  // The nodes of `world` to leave out, given that `reporter` (a rank of it)
  // could not reach `unreachable` (ranks of it) and the pairs reported
  // earlier for the same world (kept until a report about another world).
  // Empty when the report names no rank of another node.
  std::vector<std::string> LeaveOut(const World& world, uint32_t reporter,
                                    const std::vector<uint32_t>& unreachable);

  // Holds `node` out from `now`; returns for how long.
  absl::Duration Hold(const std::string& node, absl::Time now);
  // Whether `node` is held out at `now`.
  bool Held(const std::string& node, absl::Time now) const;
  bool empty() const { return held_until_.empty(); }
  // When the next hold ends, if any is held.
  std::optional<absl::Time> NextEnd() const;
  // The nodes whose hold ended by `now` (they are no longer held).
  std::vector<std::string> Ended(absl::Time now);

 private:
  struct Strikes {
    int count = 0;
    absl::Time last;
  };
  PartitionHoldOptions options_;
  absl::flat_hash_map<std::string, absl::Time> held_until_;
  absl::flat_hash_map<std::string, Strikes> strikes_;
  // Unreachable node pairs reported about world `pairs_generation_`.
  uint64_t pairs_generation_ = 0;
  std::vector<std::pair<std::string, std::string>> pairs_;
};

}  // namespace muster

#endif  // MUSTER_COORDINATOR_PARTITION_HOLDS_H_
