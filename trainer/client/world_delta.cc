#include "trainer/client/world_delta.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace muster {
namespace {

void SummaryFromProto(const v1::World& pw, WorldInfo* w) {
  w->generation = pw.generation();
  w->world_size = static_cast<int>(pw.world_size());
  w->node_count = static_cast<int>(pw.node_count());
  w->state_source_rank = static_cast<int>(pw.state_source_rank());
  w->state_step = pw.state_step();
  w->state_source = FromProto(pw.state_source());
  w->node_sizes.clear();
  for (uint32_t size : pw.node_sizes()) w->node_sizes.push_back(static_cast<int>(size));
  w->digest = pw.digest();
}

// How many of the ascending `sorted` are below `value`.
int Below(const google::protobuf::RepeatedField<uint32_t>& sorted, int value) {
  return static_cast<int>(std::lower_bound(sorted.begin(), sorted.end(),
                                           static_cast<uint32_t>(value)) -
                          sorted.begin());
}

bool Ascending(const google::protobuf::RepeatedField<uint32_t>& v, int below) {
  for (int i = 0; i < v.size(); ++i) {
    if (static_cast<int64_t>(v[i]) >= below || (i > 0 && v[i] <= v[i - 1])) return false;
  }
  return true;
}

}  // namespace

PeerInfo FromProto(const v1::Assignment& a) {
  PeerInfo p;
  p.member_id = a.member().member_id();
  p.incarnation = a.member().incarnation();
  p.node = a.node();
  p.state_address = a.state_address();
  p.rank = static_cast<int>(a.rank());
  p.node_rank = static_cast<int>(a.node_rank());
  p.local_rank = static_cast<int>(a.local_rank());
  p.local_world_size = static_cast<int>(a.local_world_size());
  p.step = a.step();
  return p;
}

WorldInfo FromProto(const v1::RendezvousResponse& resp) {
  WorldInfo w;
  SummaryFromProto(resp.world(), &w);
  w.rank = static_cast<int>(resp.rank());
  w.self = FromProto(resp.self());
  for (const v1::Assignment& a : resp.node_members()) w.node_peers.push_back(FromProto(a));
  return w;
}

absl::StatusOr<WorldInfo> ApplyWorldDelta(const WorldInfo& held, const v1::World& world,
                                          const v1::WorldDelta& delta, int64_t step) {
  if (held.generation != delta.base_generation() || held.digest != delta.base_digest()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this member holds generation ", held.generation, " (digest ", held.digest,
        "), the delta is from generation ", delta.base_generation(), " (digest ",
        delta.base_digest(), ")"));
  }
  const auto& removed = delta.removed_ranks();
  if (!Ascending(removed, held.world_size) || !Ascending(delta.removed_nodes(), held.node_count)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the delta's removed ranks or nodes are not ascending below ", held.world_size,
        " members and ", held.node_count, " nodes"));
  }
  if (std::binary_search(removed.begin(), removed.end(), static_cast<uint32_t>(held.rank))) {
    return absl::FailedPreconditionError(
        absl::StrCat("the delta removes this member (rank ", held.rank, ")"));
  }
  const int64_t expected =
      int64_t{held.world_size} - removed.size() + int64_t{delta.appended_count()};
  if (static_cast<int>(world.world_size()) != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the delta leaves ", expected, " members, the world has ", world.world_size()));
  }
  WorldInfo w;
  SummaryFromProto(world, &w);
  const int node_rank = held.node_rank() - Below(delta.removed_nodes(), held.node_rank());
  for (const PeerInfo& p : held.node_peers) {
    if (std::binary_search(removed.begin(), removed.end(), static_cast<uint32_t>(p.rank))) {
      continue;
    }
    PeerInfo q = p;
    q.rank = p.rank - Below(removed, p.rank);
    q.node_rank = node_rank;
    w.node_peers.push_back(std::move(q));
  }
  const int local_size = static_cast<int>(w.node_peers.size());
  for (int i = 0; i < local_size; ++i) {
    w.node_peers[i].local_rank = i;
    w.node_peers[i].local_world_size = local_size;
    if (w.node_peers[i].member_id == held.self.member_id) {
      w.node_peers[i].step = step;
      w.self = w.node_peers[i];
    }
  }
  w.rank = w.self.rank;
  return w;
}

absl::StatusOr<WorldInfo> WorldFromMembers(const v1::World& world,
                                           const std::vector<v1::Assignment>& members,
                                           const std::string& member_id, uint64_t incarnation) {
  WorldInfo w;
  SummaryFromProto(world, &w);
  const auto self = std::find_if(members.begin(), members.end(), [&](const v1::Assignment& a) {
    return a.member().member_id() == member_id && a.member().incarnation() == incarnation;
  });
  if (self == members.end()) {
    return absl::NotFoundError(absl::StrCat("member ", member_id, " incarnation ", incarnation,
                                            " is not in generation ", world.generation()));
  }
  w.self = FromProto(*self);
  w.rank = w.self.rank;
  // Ranks of a node are contiguous.
  const int first = w.self.rank - w.self.local_rank;
  for (int r = std::max(first, 0);
       r < first + w.self.local_world_size && r < static_cast<int>(members.size()); ++r) {
    w.node_peers.push_back(FromProto(members[r]));
  }
  return w;
}

}  // namespace muster
