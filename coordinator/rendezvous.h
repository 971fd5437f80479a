// Rendezvous rules: when a new world forms and who gets which rank.
//
// Rules follow torchelastic's: a world forms once at least `min_members`
// candidates wait, after an extra `last_call` window to collect late joiners
// (or at once when `max_members` are there). A failure forms the next world
// at once from the survivors. A world's size is rounded down to a multiple of
// `world_size_multiple`.
//
// RendezvousTimer is not thread-safe (owned by Coordinator under its mutex);
// the free functions are pure.
#ifndef MUSTER_COORDINATOR_RENDEZVOUS_H_
#define MUSTER_COORDINATOR_RENDEZVOUS_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "coordinator/types.h"

namespace muster {

struct RendezvousRules {
  uint32_t min_members = 1;
  uint32_t max_members = 1024;
  // Extra wait once min_members is reached, for more members to join.
  absl::Duration last_call = absl::Milliseconds(500);
  // How long the job's first world waits for the members meant for it
  // before spares fill it (they may start sooner): from the first moment it
  // could form. Later worlds take spares after last call, a failure's at
  // once.
  absl::Duration spare_delay = absl::Seconds(10);
  // Longest a Rendezvous call blocks before DEADLINE_EXCEEDED.
  absl::Duration join_timeout = absl::Seconds(600);
  uint32_t world_size_multiple = 1;

  // INVALID_ARGUMENT naming the rule when min > max, min == 0, etc.
  absl::Status Validate() const;
};

// A member that could be part of the next world.
struct Candidate {
  MemberKey member;
  std::string node;
  uint32_t local_rank = 0;
  std::string state_address;
  int64_t step = 0;
  bool incumbent = false;  // part of the current world
  int current_rank = -1;   // its rank there when incumbent (AssignWorld ignores it)
  bool spare = false;      // started as a hot spare: taken after the others
  absl::Time joined;
};

// How many of `candidates` the next world takes: min(candidates, max)
// rounded down to the multiple, or 0 when that is below min_members.
uint32_t UsableWorldSize(uint32_t candidates, const RendezvousRules& rules);

// Builds the world of `generation` from the first `size` candidates, taking
// incumbents before newcomers and newcomers in join order. Nodes are ordered
// by name; ranks are contiguous per node, ordered by local rank then id.
// When `taken` is given it receives, for each rank, the index in
// `candidates` of the candidate that holds it.
World AssignWorld(uint64_t generation, std::vector<Candidate> candidates, uint32_t size,
                  std::vector<uint32_t>* taken = nullptr);

// Sets state_source_rank/state_step to the member with the highest step
// (the lowest rank among equals).
void ChooseStateSource(World* world);

enum class FormDecision {
  kNothing,    // the candidates are the current world
  kNotEnough,  // below min_members: wait (the job pauses)
  kWait,       // last call is running; ask again at deadline()
  kNow,        // form the next world now
};

// Tracks the last-call window between decisions.
class RendezvousTimer {
 public:
  explicit RendezvousTimer(const RendezvousRules& rules) : rules_(rules) {}

  // `candidates`: how many members could take part, `preferred` how many of
  // them are not spares (incumbents count as preferred); `changed`: whether
  // they differ from the current world; `urgent`: form without last call (a
  // failure or a leave). Reaching max_members forms at once only with
  // preferred candidates: spares fill what is left when last call ends, or
  // for the job's `first_world`, when spare_delay ends.
  FormDecision Decide(uint32_t candidates, uint32_t preferred, bool changed, bool urgent,
                      absl::Time now, bool first_world = false);
  // Forgets the running window (after a world formed).
  void Reset() {
    opened_.reset();
    form_at_.reset();
  }
  // When the window that runs ends (the last decision's).
  std::optional<absl::Time> deadline() const { return form_at_; }
  const RendezvousRules& rules() const { return rules_; }

 private:
  RendezvousRules rules_;
  std::optional<absl::Time> opened_;
  std::optional<absl::Time> form_at_;
};

}  // namespace muster

#endif  // MUSTER_COORDINATOR_RENDEZVOUS_H_
