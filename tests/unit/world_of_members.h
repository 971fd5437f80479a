// Worlds for the coordinator's unit tests.
#ifndef MUSTER_TESTS_UNIT_WORLD_OF_MEMBERS_H_
#define MUSTER_TESTS_UNIT_WORLD_OF_MEMBERS_H_

#include <string>
#include <utility>
#include <vector>

#include "coordinator/rendezvous.h"

namespace muster {

// A world of `generation` with members "m0".."m<n-1>", incarnation 1, on
// one node, each reporting step 0.
inline World MakeWorld(uint64_t generation, int n) {
  std::vector<Candidate> candidates;
  for (int i = 0; i < n; ++i) {
    Candidate c;
    c.member = {"m" + std::to_string(i), 1};
    c.node = "n0";
    c.local_rank = static_cast<uint32_t>(i);
    candidates.push_back(c);
  }
  return AssignWorld(generation, std::move(candidates), static_cast<uint32_t>(n));
}

}  // namespace muster

#endif  // MUSTER_TESTS_UNIT_WORLD_OF_MEMBERS_H_
