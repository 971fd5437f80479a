#include "coordinator/rendezvous.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace muster {

absl::Status RendezvousRules::Validate() const {
  if (min_members == 0) return absl::InvalidArgumentError("min_members must be at least 1");
  if (max_members < min_members) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_members (", max_members, ") is below min_members (", min_members, ")"));
  }
  if (world_size_multiple == 0) {
    return absl::InvalidArgumentError("world_size_multiple must be at least 1");
  }
  if (UsableWorldSize(max_members, *this) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no world size between min_members ", min_members, " and max_members ",
        max_members, " is a multiple of ", world_size_multiple));
  }
  if (last_call < absl::ZeroDuration() || join_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("last_call must be >= 0 and join_timeout > 0");
  }
  if (spare_delay < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("spare_delay must be >= 0");
  }
  return absl::OkStatus();
}

uint32_t UsableWorldSize(uint32_t candidates, const RendezvousRules& rules) {
  uint32_t size = std::min(candidates, rules.max_members);
  size -= size % rules.world_size_multiple;
  return size < rules.min_members ? 0 : size;
}

World AssignWorld(uint64_t generation, std::vector<Candidate> candidates,
                  uint32_t size) {
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const Candidate& a, const Candidate& b) {
                     if (a.incumbent != b.incumbent) return a.incumbent;
                     return std::tie(a.spare, a.joined, a.member.id) <
                            std::tie(b.spare, b.joined, b.member.id);
                   });
  if (candidates.size() > size) candidates.resize(size);
  std::sort(candidates.begin(), candidates.end(),
            [](const Candidate& a, const Candidate& b) {
              return std::tie(a.node, a.local_rank, a.member.id) <
                     std::tie(b.node, b.local_rank, b.member.id);
            });
  std::map<std::string, uint32_t> per_node;
  for (const Candidate& c : candidates) ++per_node[c.node];

  World world;
  world.generation = generation;
  world.node_count = static_cast<uint32_t>(per_node.size());
  uint32_t node_rank = 0;
  uint32_t local_rank = 0;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const Candidate& c = candidates[i];
    if (i > 0 && c.node != candidates[i - 1].node) {
      ++node_rank;
      local_rank = 0;
    }
    Assignment a;
    a.member = c.member;
    a.node = c.node;
    a.state_address = c.state_address;
    a.rank = static_cast<uint32_t>(i);
    a.node_rank = node_rank;
    a.local_rank = local_rank++;
    a.local_world_size = per_node[c.node];
    a.step = c.step;
    world.members.push_back(std::move(a));
  }
  world.Index();
  ChooseStateSource(&world);
  return world;
}

void ChooseStateSource(World* world) {
  world->state_source_rank = 0;
  world->state_step = world->members.empty() ? 0 : world->members[0].step;
  for (const Assignment& a : world->members) {
    if (a.step > world->state_step) {
      world->state_step = a.step;
      world->state_source_rank = a.rank;
    }
  }
}

FormDecision RendezvousTimer::Decide(uint32_t candidates, uint32_t preferred, bool changed,
                                     bool urgent, absl::Time now, bool first_world) {
  if (!changed) {
    Reset();
    return FormDecision::kNothing;
  }
  if (UsableWorldSize(candidates, rules_) == 0) {
    Reset();
    return FormDecision::kNotEnough;
  }
  if (urgent || preferred >= rules_.max_members) return FormDecision::kNow;
  if (!opened_) opened_ = now;
  form_at_ = *opened_ + rules_.last_call;
  const bool spares_fill =
      UsableWorldSize(preferred, rules_) < UsableWorldSize(candidates, rules_);
  if (first_world && spares_fill) form_at_ = std::max(*form_at_, *opened_ + rules_.spare_delay);
  return now >= *form_at_ ? FormDecision::kNow : FormDecision::kWait;
}

}  // namespace muster
