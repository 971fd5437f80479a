// Where a trainer is: its node and local rank, taken from the launcher's
// environment. Pure parsing (the environment is passed in), no side effects.
//
// Precedence: explicit flags, then muster-agent's MUSTER_NODE_ID /
// MUSTER_LOCAL_RANK / MUSTER_LOCAL_WORLD_SIZE, then OpenMPI
// (OMPI_COMM_WORLD_*), then torchrun (RANK/LOCAL_RANK/WORLD_SIZE/
// LOCAL_WORLD_SIZE/GROUP_RANK), then Slurm (SLURM_*), then a single local
// process on this host. mpirun and torchrun come before Slurm because inside
// an allocation they inherit its SLURM_* variables; their node is then
// SLURMD_NODENAME.
#ifndef MUSTER_COMMON_LAUNCH_ENV_H_
#define MUSTER_COMMON_LAUNCH_ENV_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"

namespace muster {

struct LaunchIdentity {
  std::string node;          // node identity (Slurm node name, or host name)
  int local_rank = 0;
  int local_world_size = 1;  // trainers on this node, if the launcher says
  int rank = -1;             // launcher's global rank (-1: unknown)
  int world_size = -1;       // launcher's world size (-1: unknown)
  bool spare = false;        // muster-agent started it as a hot spare (MUSTER_SPARE=1)
  std::string source;        // "flags", "slurm", "torchrun", "openmpi", "muster-agent",
                             // "local"

  // The stable member id of this trainer slot: "<node>/<local_rank>".
  std::string member_id() const;
};

struct LaunchFlags {
  std::string node_id;  // --node-id ("" = not given)
  int local_rank = -1;  // --local-rank (-1 = not given)
};

using GetEnv = std::function<const char*(const char*)>;

// Errors: INVALID_ARGUMENT naming the variable when a launcher variable is
// present but not a valid number (or out of range).
absl::StatusOr<LaunchIdentity> ResolveLaunchIdentity(const LaunchFlags& flags,
                                                     const GetEnv& getenv,
                                                     const std::string& hostname);

// Parses Slurm's SLURM_TASKS_PER_NODE ("2(x3),1") for node `node_index`.
absl::StatusOr<int> TasksOnNode(const std::string& spec, int node_index);

}  // namespace muster

#endif  // MUSTER_COMMON_LAUNCH_ENV_H_
