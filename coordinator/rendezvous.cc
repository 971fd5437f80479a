#include "coordinator/rendezvous.h"

#include <algorithm>
#include <numeric>
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

World AssignWorld(uint64_t generation, std::vector<Candidate> candidates, uint32_t size,
                  std::vector<uint32_t>* taken) {
  // Candidates are ordered by index (each holds three strings; at 100,000
  // members moving them through two sorts cost more than the rest).
  std::vector<uint32_t> order(candidates.size());
  std::iota(order.begin(), order.end(), 0u);
  if (candidates.size() > size) {
    // Who is kept: incumbents, then newcomers (spares last) in join order.
    std::stable_sort(order.begin(), order.end(), [&](uint32_t x, uint32_t y) {
      const Candidate& a = candidates[x];
      const Candidate& b = candidates[y];
      if (a.incumbent != b.incumbent) return a.incumbent;
      return std::tie(a.spare, a.joined, a.member.id) < std::tie(b.spare, b.joined, b.member.id);
    });
    order.resize(size);
  }
  auto by_place = [&](uint32_t x, uint32_t y) {
    const Candidate& a = candidates[x];
    const Candidate& b = candidates[y];
    return std::tie(a.node, a.local_rank, a.member.id) <
           std::tie(b.node, b.local_rank, b.member.id);
  };
  // The coordinator lists its members by id, and ids mostly name their node:
  // the candidates then come in this order already, and checking it costs a
  // comparison each where sorting costs log n of them.
  if (!std::is_sorted(order.begin(), order.end(), by_place)) {
    std::sort(order.begin(), order.end(), by_place);
  }

  World world;
  world.generation = generation;
  world.members.reserve(order.size());
  // A node's members are contiguous: each run gets the next node rank, and
  // its size once it ends.
  size_t run = 0;
  auto end_run = [&world, &run] {
    for (size_t j = run; j < world.members.size(); ++j) {
      world.members[j].local_world_size = static_cast<uint32_t>(world.members.size() - run);
    }
    run = world.members.size();
  };
  for (uint32_t index : order) {
    Candidate& c = candidates[index];
    if (!world.members.empty() && c.node != world.members.back().node) end_run();
    Assignment a;
    a.rank = static_cast<uint32_t>(world.members.size());
    a.node_rank = world.members.empty() ? 0
                  : run == world.members.size() ? world.members.back().node_rank + 1
                                                : world.members.back().node_rank;
    a.local_rank = static_cast<uint32_t>(world.members.size() - run);
    a.member = std::move(c.member);
    a.node = std::move(c.node);
    a.state_address = std::move(c.state_address);
    a.step = c.step;
    world.members.push_back(std::move(a));
  }
  end_run();
  world.node_count = world.members.empty() ? 0 : world.members.back().node_rank + 1;
  world.Index();
  if (taken != nullptr) *taken = std::move(order);
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
