// A node's communicator from one world to the next: kept, shrunk or built.
//
// - Kept: a regroup that leaves a node as it was (the same members with the
//   same incarnations, in the same local order) and never touched the
//   node's communicator (no collective of it failed, nothing aborted it)
//   keeps that communicator: the node's shared-memory segment or NCCL
//   communicator goes on into the new world. Node-local communicators of one
//   rank are never aborted for a failure elsewhere (hierarchical.h), so a
//   node that lost nobody keeps its communicator through a failure too.
// - Shrunk: a node that only lost members (the rest in the same order) and
//   whose communicator CanShrink (NCCL) makes the smaller one from it, also
//   after a failure broke it, instead of from nothing.
// - Built: anything else (a member joined or came back as a new
//   incarnation, the order changed, shared memory that failed).
//
// Every rank of a node must decide alike, or some would reuse and some wait
// for a new communicator: they vote through the new world's store and reuse
// only when all vote the same. Shrinking is collective, so a rank that
// cannot get ready for it (ReadyToShrink) votes to build, and a node whose
// shrink failed on any rank builds; a shrink gets half of the time left, so
// that building after it still can. A node of one rank decides alone.
#ifndef MUSTER_TRAINER_COMM_NODE_COMM_H_
#define MUSTER_TRAINER_COMM_NODE_COMM_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "trainer/comm/communicator.h"
#include "trainer/comm/store.h"
#include "trainer/comm/world_info.h"

namespace muster {

// What one world's communicator leaves for the next.
struct KeptNodeCommunicator {
  uint64_t generation = 0;           // of the world it was built for
  std::vector<std::string> members;  // NodeMembers of that world
  // A failure or an abort reached it: it may only shrink.
  bool touched = false;
  std::unique_ptr<Communicator> comm;  // null: nothing kept
};

// The node's members in local-rank order, as "id#incarnation": the same on
// every rank of the node, and the same in two worlds only when the node is
// unchanged.
std::vector<std::string> NodeMembers(const WorldInfo& world);

// What `comm`, the communicator of `world`, leaves for the next world.
KeptNodeCommunicator KeepNodeCommunicator(std::unique_ptr<Communicator> comm,
                                          const WorldInfo& world);

enum class NodeCommPlan { kBuild, kKeep, kShrink };

struct NodeCommChoice {
  NodeCommPlan plan = NodeCommPlan::kBuild;
  std::vector<int> excluded;  // kShrink: the ranks of the kept one that are gone
  // What this rank tells the others of its node: equal exactly when they
  // would reuse the same communicator the same way.
  std::string vote;
};

// Pure: what this rank would do with `kept` in `next`.
NodeCommChoice ChooseNodeComm(const KeptNodeCommunicator& kept, const WorldInfo& next);

// Every rank of `next`'s node calls it with its vote under `topic`; true
// when every rank voted `vote`. A rank that votes kAbstain publishes that
// and returns false at once. Votes go through `node_store` (keys
// "<topic>/<local rank>") unless the node has one rank. Errors: the store's.
inline constexpr char kAbstain[] = "-";
absl::StatusOr<bool> AgreeOnNode(Store* node_store, const WorldInfo& next,
                                 const std::string& topic, const std::string& vote,
                                 absl::Time deadline);

// The node-local communicator of `next` made from `*kept` (consumed), kept
// or shrunk as every rank of the node agrees; null: build one. Every rank
// of the node calls it, with or without something kept. `deadline` is a
// time of `clock`'s Now() (required, not owned).
// Errors: the store's.
absl::StatusOr<std::unique_ptr<Communicator>> ReuseNodeCommunicator(KeptNodeCommunicator* kept,
                                                                    const WorldInfo& next,
                                                                    Store* node_store,
                                                                    absl::Time deadline,
                                                                    Clock* clock);

}  // namespace muster

#endif  // MUSTER_TRAINER_COMM_NODE_COMM_H_
