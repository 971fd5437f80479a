// WorldInfo: a trainer's view of one generation's world, as the coordinator
// answered it to Rendezvous. A plain copyable value.
#ifndef MUSTER_TRAINER_COMM_WORLD_INFO_H_
#define MUSTER_TRAINER_COMM_WORLD_INFO_H_

#include <cstdint>
#include <string>
#include <vector>

namespace muster {

struct PeerInfo {
  std::string member_id;
  uint64_t incarnation = 0;
  std::string node;
  std::string state_address;
  int rank = 0;
  int node_rank = 0;
  int local_rank = 0;
  int local_world_size = 0;
  int64_t step = 0;
};

// What the coordinator tells each member: a fixed-size summary of the world
// plus this member's own node. The full membership is not sent to members
// (CoordinatorClient::GetWorld pages through it on request).
struct WorldInfo {
  uint64_t generation = 0;
  int rank = 0;  // this member
  int world_size = 0;
  int node_count = 0;
  int state_source_rank = 0;
  int64_t state_step = 0;
  PeerInfo state_source;
  // This member's assignment.
  PeerInfo self;
  // The members of this member's node, itself included, by local rank.
  std::vector<PeerInfo> node_peers;
  // The distinct numbers of members per node, ascending.
  std::vector<int> node_sizes;
  // Digest of the whole membership; equal for every member of the world.
  uint64_t digest = 0;

  int node_rank() const { return self.node_rank; }
  int local_rank() const { return self.local_rank; }
  int local_world_size() const { return self.local_world_size; }
};

}  // namespace muster

#endif  // MUSTER_TRAINER_COMM_WORLD_INFO_H_
