#include "common/launch_env.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace muster {
namespace {

// The integer value of `name`, `fallback` when unset.
absl::StatusOr<int> IntEnv(const GetEnv& getenv, const char* name, int fallback) {
  const char* v = getenv(name);
  if (v == nullptr || v[0] == '\0') return fallback;
  int out = 0;
  if (!absl::SimpleAtoi(v, &out) || out < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("environment variable ", name, "='", v, "' is not a non-negative integer"));
  }
  return out;
}

bool Has(const GetEnv& getenv, const char* name) {
  const char* v = getenv(name);
  return v != nullptr && v[0] != '\0';
}

}  // namespace

std::string LaunchIdentity::member_id() const { return absl::StrCat(node, "/", local_rank); }

absl::StatusOr<int> TasksOnNode(const std::string& spec, int node_index) {
  int seen = 0;
  for (absl::string_view part : absl::StrSplit(spec, ',')) {
    int tasks = 0, repeat = 1;
    const size_t paren = part.find("(x");
    if (paren != absl::string_view::npos) {
      if (!absl::SimpleAtoi(part.substr(paren + 2, part.size() - paren - 3), &repeat)) {
        return absl::InvalidArgumentError(absl::StrCat("bad SLURM_TASKS_PER_NODE '", spec, "'"));
      }
      part = part.substr(0, paren);
    }
    if (!absl::SimpleAtoi(part, &tasks)) {
      return absl::InvalidArgumentError(absl::StrCat("bad SLURM_TASKS_PER_NODE '", spec, "'"));
    }
    if (node_index < seen + repeat) return tasks;
    seen += repeat;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("SLURM_TASKS_PER_NODE '", spec, "' has no node ", node_index));
}

absl::StatusOr<LaunchIdentity> ResolveLaunchIdentity(const LaunchFlags& flags,
                                                     const GetEnv& getenv,
                                                     const std::string& hostname) {
  LaunchIdentity id;
  id.node = hostname;
  id.source = "local";
  // A launcher started inside a Slurm allocation (mpirun, torchrun) sees the
  // allocation's SLURM_* variables too, so its own variables come first; the
  // node is then Slurm's name for it, or the host name.
  const std::string slurm_node = Has(getenv, "SLURMD_NODENAME") ? getenv("SLURMD_NODENAME") : "";
  if (Has(getenv, "OMPI_COMM_WORLD_RANK")) {
    id.source = "openmpi";
    if (!slurm_node.empty()) id.node = slurm_node;
    MUSTER_ASSIGN_OR_RETURN(id.local_rank, IntEnv(getenv, "OMPI_COMM_WORLD_LOCAL_RANK", 0));
    MUSTER_ASSIGN_OR_RETURN(id.rank, IntEnv(getenv, "OMPI_COMM_WORLD_RANK", -1));
    MUSTER_ASSIGN_OR_RETURN(id.world_size, IntEnv(getenv, "OMPI_COMM_WORLD_SIZE", -1));
    MUSTER_ASSIGN_OR_RETURN(id.local_world_size,
                            IntEnv(getenv, "OMPI_COMM_WORLD_LOCAL_SIZE", 1));
  } else if (Has(getenv, "LOCAL_RANK") && Has(getenv, "RANK")) {
    id.source = "torchrun";
    if (!slurm_node.empty()) id.node = slurm_node;
    MUSTER_ASSIGN_OR_RETURN(id.local_rank, IntEnv(getenv, "LOCAL_RANK", 0));
    MUSTER_ASSIGN_OR_RETURN(id.rank, IntEnv(getenv, "RANK", -1));
    MUSTER_ASSIGN_OR_RETURN(id.world_size, IntEnv(getenv, "WORLD_SIZE", -1));
    MUSTER_ASSIGN_OR_RETURN(id.local_world_size, IntEnv(getenv, "LOCAL_WORLD_SIZE", 1));
    if (Has(getenv, "GROUP_RANK")) {
      MUSTER_ASSIGN_OR_RETURN(const int group, IntEnv(getenv, "GROUP_RANK", 0));
      id.node = absl::StrCat(id.node, "-", group);
    }
  } else if (Has(getenv, "SLURM_PROCID") || Has(getenv, "SLURM_LOCALID")) {
    id.source = "slurm";
    MUSTER_ASSIGN_OR_RETURN(id.local_rank, IntEnv(getenv, "SLURM_LOCALID", 0));
    MUSTER_ASSIGN_OR_RETURN(id.rank, IntEnv(getenv, "SLURM_PROCID", -1));
    MUSTER_ASSIGN_OR_RETURN(id.world_size, IntEnv(getenv, "SLURM_NTASKS", -1));
    MUSTER_ASSIGN_OR_RETURN(const int node_index, IntEnv(getenv, "SLURM_NODEID", 0));
    id.node = slurm_node.empty() ? absl::StrCat("node", node_index) : slurm_node;
    if (Has(getenv, "SLURM_TASKS_PER_NODE")) {
      MUSTER_ASSIGN_OR_RETURN(id.local_world_size,
                              TasksOnNode(getenv("SLURM_TASKS_PER_NODE"), node_index));
    }
  }
  // muster-agent sets these for its children; they beat the launcher's own
  // variables (under `srun muster-agent` SLURM_LOCALID is the agent's).
  if (Has(getenv, "MUSTER_LOCAL_RANK")) {
    id.source = "muster-agent";
    MUSTER_ASSIGN_OR_RETURN(id.local_rank, IntEnv(getenv, "MUSTER_LOCAL_RANK", 0));
    MUSTER_ASSIGN_OR_RETURN(id.local_world_size, IntEnv(getenv, "MUSTER_LOCAL_WORLD_SIZE", 1));
    if (Has(getenv, "MUSTER_NODE_ID")) id.node = getenv("MUSTER_NODE_ID");
    MUSTER_ASSIGN_OR_RETURN(const int spare, IntEnv(getenv, "MUSTER_SPARE", 0));
    id.spare = spare != 0;
  }
  if (!flags.node_id.empty()) {
    id.node = flags.node_id;
    id.source = "flags";
  }
  if (flags.local_rank >= 0) {
    id.local_rank = flags.local_rank;
    id.source = "flags";
  }
  if (id.local_world_size < 1) id.local_world_size = 1;
  if (id.local_rank >= id.local_world_size) id.local_world_size = id.local_rank + 1;
  return id;
}

}  // namespace muster
