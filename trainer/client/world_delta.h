// A member's view of a new world from a Rendezvous answer that is a delta
// (RendezvousResponse.delta): derived from the view it holds, or, when it
// cannot hold that (it missed a generation, or its world is not the delta's
// base), built from the whole membership that GetWorld pages out.
#ifndef MUSTER_TRAINER_CLIENT_WORLD_DELTA_H_
#define MUSTER_TRAINER_CLIENT_WORLD_DELTA_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "muster/v1/coordinator.pb.h"
#include "trainer/comm/world_info.h"

namespace muster {

// The view of `world` (the new world's summary) that the member holding
// `held` derives from `delta`; its own step is `step`. Node peers' steps
// stay those of `held` (the delta does not carry them). Errors:
// FAILED_PRECONDITION when `held` is not the delta's base (another
// generation or digest) or the delta removes or cannot place this member;
// INVALID_ARGUMENT when the delta does not hold together.
absl::StatusOr<WorldInfo> ApplyWorldDelta(const WorldInfo& held, const v1::World& world,
                                          const v1::WorldDelta& delta, int64_t step);

// The view of `world` of member `member_id` (incarnation `incarnation`),
// from every member's assignment in rank order (GetWorld's pages). NOT_FOUND
// when it is not a member.
absl::StatusOr<WorldInfo> WorldFromMembers(const v1::World& world,
                                           const std::vector<v1::Assignment>& members,
                                           const std::string& member_id, uint64_t incarnation);

// The summary fields of `world` and, given, the member's assignment and
// node (a full Rendezvous answer).
WorldInfo FromProto(const v1::RendezvousResponse& resp);
PeerInfo FromProto(const v1::Assignment& a);

}  // namespace muster

#endif  // MUSTER_TRAINER_CLIENT_WORLD_DELTA_H_
