#include "trainer/comm/node_comm.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace muster {
namespace {

// The ranks of `before` missing from `after`, when `after` is `before`
// less those, in the same order; nullopt otherwise.
std::optional<std::vector<int>> Gone(const std::vector<std::string>& before,
                                     const std::vector<std::string>& after) {
  std::vector<int> gone;
  size_t next = 0;
  for (size_t r = 0; r < before.size(); ++r) {
    if (next < after.size() && before[r] == after[next]) {
      ++next;
    } else {
      gone.push_back(static_cast<int>(r));
    }
  }
  if (next != after.size()) return std::nullopt;
  return gone;
}

std::string RanksText(const std::vector<int>& ranks) {
  return absl::StrCat(ranks.size() == 1 ? "local rank " : "local ranks ",
                      absl::StrJoin(ranks, ", "));
}

}  // namespace

std::vector<std::string> NodeMembers(const WorldInfo& world) {
  std::vector<std::string> out;
  for (const PeerInfo& p : world.node_peers) {
    out.push_back(absl::StrCat(p.member_id, "#", p.incarnation));
  }
  return out;
}

KeptNodeCommunicator KeepNodeCommunicator(std::unique_ptr<Communicator> comm,
                                          const WorldInfo& world) {
  KeptNodeCommunicator kept;
  if (comm == nullptr) return kept;
  kept.comm = comm->ReleaseNodeCommunicator(&kept.touched);
  if (kept.comm == nullptr) return kept;
  kept.generation = world.generation;
  kept.members = NodeMembers(world);
  return kept;
}

NodeCommChoice ChooseNodeComm(const KeptNodeCommunicator& kept, const WorldInfo& next) {
  NodeCommChoice choice;
  choice.vote = kAbstain;
  const Communicator* comm = kept.comm.get();
  if (comm == nullptr || kept.members.empty() || kept.generation >= next.generation ||
      comm->size() != static_cast<int>(kept.members.size()) || comm->rank() < 0 ||
      comm->rank() >= comm->size()) {
    return choice;
  }
  const std::vector<std::string> members = NodeMembers(next);
  std::optional<std::vector<int>> gone = Gone(kept.members, members);
  if (!gone.has_value()) return choice;
  const int rank = comm->rank();
  if (std::count(gone->begin(), gone->end(), rank) > 0 ||
      RankAfterShrink(rank, *gone) != next.local_rank()) {
    return choice;
  }
  const std::string of = absl::StrCat(kept.generation, " ", absl::StrJoin(kept.members, ","));
  if (gone->empty()) {
    if (kept.touched) return choice;  // it broke, and nobody left to shrink it for
    choice.plan = NodeCommPlan::kKeep;
    choice.vote = absl::StrCat("keep ", of);
  } else if (comm->CanShrink()) {
    choice.plan = NodeCommPlan::kShrink;
    choice.excluded = *std::move(gone);
    choice.vote = absl::StrCat("shrink ", of);
  }
  return choice;
}

absl::StatusOr<bool> AgreeOnNode(Store* node_store, const WorldInfo& next,
                                 const std::string& topic, const std::string& vote,
                                 absl::Time deadline) {
  const int n = next.local_world_size();
  if (n <= 1) return vote != kAbstain;
  MUSTER_RETURN_IF_ERROR(
      node_store->Set(absl::StrCat(topic, "/", next.local_rank()), vote, deadline));
  if (vote == kAbstain) return false;
  std::vector<std::string> keys;
  for (int l = 0; l < n; ++l) keys.push_back(absl::StrCat(topic, "/", l));
  MUSTER_ASSIGN_OR_RETURN(const std::vector<std::string> votes, node_store->Wait(keys, deadline));
  return std::all_of(votes.begin(), votes.end(), [&](const std::string& v) { return v == vote; });
}

absl::StatusOr<std::unique_ptr<Communicator>> ReuseNodeCommunicator(KeptNodeCommunicator* kept,
                                                                    const WorldInfo& next,
                                                                    Store* node_store,
                                                                    absl::Time deadline,
                                                                    Clock* clock) {
  KeptNodeCommunicator mine = std::move(*kept);
  *kept = {};
  NodeCommChoice choice = ChooseNodeComm(mine, next);
  // A shrink that hangs leaves the other half of the time to build.
  const absl::Time shrink_by = clock->Now() + Remaining(deadline, clock) / 2;
  if (choice.plan == NodeCommPlan::kShrink) {
    // Shrinking is collective: a rank that cannot take part says so first.
    if (absl::Status s = mine.comm->ReadyToShrink(shrink_by); !s.ok()) {
      MUSTER_LOG(WARNING) << "this node's communicator (" << mine.comm->name()
                          << ") cannot shrink: " << s << "; building a new one";
      choice = NodeCommChoice{NodeCommPlan::kBuild, {}, kAbstain};
    }
  }
  MUSTER_ASSIGN_OR_RETURN(const bool all,
                          AgreeOnNode(node_store, next, "reuse", choice.vote, deadline));
  if (!all) return nullptr;
  const int n = next.local_world_size();
  const std::string was = absl::StrCat(mine.comm->name(), " of ", mine.comm->size(),
                                       mine.comm->size() == 1 ? " rank" : " ranks");
  if (choice.plan == NodeCommPlan::kKeep) {
    MUSTER_LOG(INFO) << "kept this node's communicator (" << was << ") from generation "
                     << mine.generation;
    return std::move(mine.comm);
  }
  // kShrink: every rank of the node shrinks; if any fails, all build.
  absl::StatusOr<std::unique_ptr<Communicator>> shrunk =
      mine.comm->Shrink(choice.excluded, shrink_by);
  mine.comm.reset();  // spent either way
  if (!shrunk.ok()) {
    MUSTER_LOG(WARNING) << "shrinking this node's communicator (" << was << ") without "
                        << RanksText(choice.excluded) << " failed: " << shrunk.status()
                        << "; building a new one";
  }
  MUSTER_ASSIGN_OR_RETURN(
      const bool everyone,
      AgreeOnNode(node_store, next, "shrunk", shrunk.ok() ? "ok" : kAbstain, deadline));
  if (!everyone) {
    if (shrunk.ok()) {
      MUSTER_LOG(WARNING) << "another rank of this node could not shrink its communicator; "
                             "building a new one";
    }
    return nullptr;
  }
  MUSTER_LOG(INFO) << "shrank this node's communicator (" << was << ") from generation "
                   << mine.generation << " to " << n << (n == 1 ? " rank" : " ranks")
                   << " without " << RanksText(choice.excluded);
  return std::move(*shrunk);
}

}  // namespace muster
