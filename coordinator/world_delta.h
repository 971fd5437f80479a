// WorldDelta: a new world told as the change from one its members hold, so
// that a regroup's answer is the same few numbers for every member instead
// of each member's own assignment (docs/scale.md, "Regroups as deltas";
// WorldDelta in coordinator.proto says how a member derives its place).
#ifndef MUSTER_COORDINATOR_WORLD_DELTA_H_
#define MUSTER_COORDINATOR_WORLD_DELTA_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "coordinator/types.h"

namespace muster {

struct WorldDelta {
  uint64_t base_generation = 0;
  uint64_t base_digest = 0;
  // Ranks of the base that are gone, ascending.
  std::vector<uint32_t> removed_ranks;
  // Node ranks of the base that no member remains on, ascending.
  std::vector<uint32_t> removed_nodes;
  // The new world's ranks from here on are appended members.
  uint32_t first_appended = 0;
};

// `next` as the change from `base`, or nullopt when it is not one a member
// of `base` can derive its place from: the base's remaining members must
// come first, in their order, on the nodes and state addresses they had,
// numbered as WorldDelta in coordinator.proto says, and every appended
// member must be new to the base and on a node none of them is on. O(size
// of both worlds), no allocation per member.
std::optional<WorldDelta> MakeWorldDelta(const World& base, const World& next);

// The base rank of the member at `rank` in the new world, or nullopt for an
// appended one: the inverse of "rank = base rank - removed ranks below it".
// O(log removed), no lookup by id.
std::optional<uint32_t> BaseRank(const WorldDelta& delta, uint32_t rank);

}  // namespace muster

#endif  // MUSTER_COORDINATOR_WORLD_DELTA_H_
