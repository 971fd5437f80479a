#include "coordinator/proto_convert.h"

namespace muster {

MemberKey ToKey(const v1::MemberRef& ref) { return MemberKey{ref.member_id(), ref.incarnation()}; }

void ToProto(const MemberKey& key, v1::MemberRef* out) {
  out->set_member_id(key.id);
  out->set_incarnation(key.incarnation);
}

void ToProto(const Assignment& a, v1::Assignment* m) {
  ToProto(a.member, m->mutable_member());
  m->set_node(a.node);
  m->set_rank(a.rank);
  m->set_node_rank(a.node_rank);
  m->set_local_rank(a.local_rank);
  m->set_local_world_size(a.local_world_size);
  m->set_state_address(a.state_address);
  m->set_step(a.step);
}

void ToProto(const World& world, v1::World* out) {
  out->set_generation(world.generation);
  out->set_world_size(world.size());
  out->set_node_count(world.node_count);
  out->set_state_source_rank(world.state_source_rank);
  out->set_state_step(world.state_step);
  if (world.state_source_rank < world.size()) {
    ToProto(world.members[world.state_source_rank], out->mutable_state_source());
  }
  for (uint32_t size : world.node_sizes()) out->add_node_sizes(size);
  out->set_digest(world.digest());
}

// Ranks of a node are contiguous.
void ToProto(const World& world, uint32_t rank, v1::RendezvousResponse* out) {
  ToProto(world, out->mutable_world());
  out->set_rank(rank);
  const Assignment& self = world.members[rank];
  ToProto(self, out->mutable_self());
  const uint32_t first = rank - self.local_rank;
  for (uint32_t r = first; r < first + self.local_world_size && r < world.size(); ++r) {
    ToProto(world.members[r], out->add_node_members());
  }
}

void ToProto(const RendezvousResult& result, v1::RendezvousResponse* out) {
  if (result.delta == nullptr) return ToProto(*result.world, result.rank, out);
  const World& world = *result.world;
  const WorldDelta& d = *result.delta;
  ToProto(world, out->mutable_world());
  v1::WorldDelta* m = out->mutable_delta();
  m->set_base_generation(d.base_generation);
  m->set_base_digest(d.base_digest);
  m->mutable_removed_ranks()->Add(d.removed_ranks.begin(), d.removed_ranks.end());
  m->mutable_removed_nodes()->Add(d.removed_nodes.begin(), d.removed_nodes.end());
  m->set_appended_count(world.size() - d.first_appended);
}

BrokenWorldReport FromProto(const v1::BrokenWorld& broken) {
  BrokenWorldReport r;
  r.generation = broken.generation();
  r.reason = broken.reason();
  r.deadline = absl::Milliseconds(broken.deadline_ms());
  r.unreachable.assign(broken.unreachable_ranks().begin(), broken.unreachable_ranks().end());
  return r;
}

}  // namespace muster
