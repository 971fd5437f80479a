// Worlds for the coordinator's unit tests.
#ifndef MUSTER_TESTS_UNIT_WORLD_OF_MEMBERS_H_
#define MUSTER_TESTS_UNIT_WORLD_OF_MEMBERS_H_

#include <string>
#include <utility>
#include <vector>

#include "coordinator/rendezvous.h"

namespace muster {

// One member of a world that MakeWorld makes.
struct MemberSpec {
  std::string id;
  std::string node = "n0";
  uint32_t local_rank = 0;
  uint64_t incarnation = 1;
  std::string state_address = "";
  int64_t step = 0;
};

// A world of `generation` with every one of `members`, placed as
// AssignWorld places them (by node, then local rank).
inline World MakeWorld(uint64_t generation, const std::vector<MemberSpec>& members) {
  std::vector<Candidate> candidates;
  for (const MemberSpec& m : members) {
    Candidate c;
    c.member = {m.id, m.incarnation};
    c.node = m.node;
    c.local_rank = m.local_rank;
    c.state_address = m.state_address;
    c.step = m.step;
    candidates.push_back(std::move(c));
  }
  const auto size = static_cast<uint32_t>(candidates.size());
  return AssignWorld(generation, std::move(candidates), size);
}

// A world of `generation` with members "m0".."m<n-1>", incarnation 1, on
// one node, each reporting step 0.
inline World MakeWorld(uint64_t generation, int n) {
  std::vector<MemberSpec> members;
  for (int i = 0; i < n; ++i) {
    members.push_back({"m" + std::to_string(i), "n0", static_cast<uint32_t>(i)});
  }
  return MakeWorld(generation, members);
}

}  // namespace muster

#endif  // MUSTER_TESTS_UNIT_WORLD_OF_MEMBERS_H_
