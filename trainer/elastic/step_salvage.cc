#include "trainer/elastic/step_salvage.h"

#include <cmath>

#include "common/logging.h"
#include "common/status_macros.h"
#include "trainer/comm/values.h"

namespace muster {

absl::StatusOr<SalvagePlan> AgreeOnSalvage(const SalvageClaim& mine, Communicator* comm,
                                           absl::Time deadline) {
  // Sums (exact in float64 for any realistic world): contributors, their old
  // generations and sizes with squares (all equal iff n * sum(x^2) ==
  // sum(x)^2), then one word per rank of the new world: in a step or not.
  const int world = comm->size();
  std::vector<double> head(5 + static_cast<size_t>(world), 0.0);
  if (mine.contributes) {
    const double g = static_cast<double>(mine.generation), w = mine.world;
    head[0] = 1;
    head[1] = g;
    head[2] = g * g;
    head[3] = w;
    head[4] = w * w;
  }
  if (mine.in_step) head[5 + comm->rank()] = 1;
  MUSTER_RETURN_IF_ERROR(
      AllReduceValues(comm, head.data(), head.size(), DataType::kFloat64, ReduceOp::kSum,
                      deadline));
  SalvagePlan plan;
  for (int r = 0; r < world; ++r) {
    if (head[5 + r] == 0) continue;
    ++plan.steppers;
    if (plan.first_stepper < 0) plan.first_stepper = r;
  }
  const double n = head[0];
  if (n == 0 || plan.steppers == 0) return plan;
  if (n * head[2] != head[1] * head[1] || n * head[4] != head[3] * head[3]) {
    MUSTER_LOG(WARNING) << "not salvaging: the gradients held come from different worlds";
    return plan;
  }
  plan.contributors = static_cast<int>(n);
  plan.old_world = static_cast<int>(std::lround(head[3] / n));
  std::vector<double> shares(static_cast<size_t>(plan.old_world), 0.0);
  if (mine.contributes && mine.rank >= 0 && mine.rank < plan.old_world) shares[mine.rank] = 1;
  MUSTER_RETURN_IF_ERROR(AllReduceValues(comm, shares.data(), shares.size(),
                                         DataType::kFloat64, ReduceOp::kSum, deadline));
  for (int r = 0; r < plan.old_world; ++r) {
    if (shares[r] == 0) plan.lost.push_back(r);
  }
  return plan;
}

}  // namespace muster
