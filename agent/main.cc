// muster-agent: one per node; starts and restarts that node's trainers.
//
//   muster-agent --nproc-per-node N [--coordinator HOST:PORT] -- muster-train ARGS...
#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/time/time.h"
#include "agent/agent.h"
#include "common/flag_names.h"
#include "common/host_name.h"
#include "common/launch_env.h"
#include "common/token.h"

ABSL_FLAG(int, nproc_per_node, 1, "trainers to run on this node (one per GPU or CPU slot)");
ABSL_FLAG(int, spares, 0,
          "extra trainers kept warm on this node: they wait outside a full world and take the "
          "place of a member that fails in the next generation");
ABSL_FLAG(int, max_restarts, 3, "restarts per trainer before the agent gives up on it");
ABSL_FLAG(absl::Duration, restart_backoff, absl::Milliseconds(250),
          "delay before the first restart; doubles per restart of the same trainer");
ABSL_FLAG(absl::Duration, max_restart_backoff, absl::Seconds(30), "cap on the restart delay");
ABSL_FLAG(absl::Duration, stop_grace, absl::Seconds(60),
          "after forwarding SIGTERM/SIGINT/SIGUSR1, SIGKILL trainers still running this long");
ABSL_FLAG(absl::Duration, stopped_limit, absl::Seconds(1),
          "a trainer held stopped this long (SIGSTOP, a debugger) is detached and the world goes "
          "on without it; one with a thread held stopped while the others run is hung and is "
          "ended and restarted (0: never)");
ABSL_FLAG(std::string, coordinator, "",
          "host:port of the coordinator (or $MUSTER_COORDINATOR): the agent then holds one "
          "session for this node's trainers; without it each trainer holds its own");
ABSL_FLAG(std::string, token_file, "", "job token file (or $MUSTER_TOKEN_FILE)");
ABSL_FLAG(std::string, tls_ca, "", "CA certificate to verify the coordinator's TLS certificate");
ABSL_FLAG(std::string, node_id, "",
          "node identity passed to the trainers (default: from Slurm/torchrun/OpenMPI or the "
          "host name)");

int main(int argc, char** argv) {
  muster::ListOwnFlagsInHelp();
  absl::SetProgramUsageMessage(
      "muster-agent --nproc-per-node N [--max-restarts K] -- muster-train ARGS...");
  muster::DashesToUnderscores(argc, argv);
  // absl stops at "--" and returns everything after it as positional args.
  std::vector<char*> rest = muster::ParseFlags(argc, argv);
  muster::AgentOptions o;
  for (size_t i = 1; i < rest.size(); ++i) o.command.emplace_back(rest[i]);
  o.nproc = absl::GetFlag(FLAGS_nproc_per_node);
  o.spares = absl::GetFlag(FLAGS_spares);
  o.supervisor.slots = o.nproc + std::max(0, o.spares);
  o.supervisor.max_restarts = absl::GetFlag(FLAGS_max_restarts);
  o.supervisor.backoff_initial = absl::GetFlag(FLAGS_restart_backoff);
  o.supervisor.backoff_max = absl::GetFlag(FLAGS_max_restart_backoff);
  o.stop_grace = absl::GetFlag(FLAGS_stop_grace);
  o.stopped_limit = absl::GetFlag(FLAGS_stopped_limit);
  if (o.command.empty()) {
    std::cerr << "muster-agent: no trainer command: put it after --, e.g. "
                 "muster-agent --nproc-per-node 2 -- muster-train --coordinator HOST:PORT\n";
    return muster::kExitBadFlags;
  }
  if (o.nproc < 0 || o.nproc > 1024 || (o.nproc == 0 && o.spares < 1)) {
    std::cerr << "muster-agent: --nproc-per-node must be in 1..1024 (0 only for a node of "
                 "spares, with --spares), not "
              << o.nproc << "\n";
    return muster::kExitBadFlags;
  }
  if (o.spares < 0 || o.spares > 1024) {
    std::cerr << "muster-agent: --spares must be in 0..1024, not " << o.spares << "\n";
    return muster::kExitBadFlags;
  }
  if (o.supervisor.max_restarts < 0 || o.supervisor.backoff_initial < absl::ZeroDuration() ||
      o.stop_grace < absl::ZeroDuration() || o.stopped_limit < absl::ZeroDuration()) {
    std::cerr << "muster-agent: --max-restarts, --restart-backoff, --stop-grace and "
                 "--stopped-limit must not be negative\n";
    return muster::kExitBadFlags;
  }
  auto id = muster::ResolveLaunchIdentity({absl::GetFlag(FLAGS_node_id), -1},
                                          [](const char* n) { return std::getenv(n); },
                                          muster::HostName());
  if (!id.ok()) {
    std::cerr << "muster-agent: " << id.status() << "\n";
    return muster::kExitBadFlags;
  }
  o.node_id = id->node;
  o.node_session.coordinator = absl::GetFlag(FLAGS_coordinator);
  if (const char* env = std::getenv("MUSTER_COORDINATOR");
      o.node_session.coordinator.empty() && env != nullptr) {
    o.node_session.coordinator = env;
  }
  if (!o.node_session.coordinator.empty()) {
    auto token = muster::ResolveToken(absl::GetFlag(FLAGS_token_file));
    if (!token.ok()) {
      std::cerr << "muster-agent: " << token.status() << "\n";
      return muster::kExitBadFlags;
    }
    o.node_session.token = *token;
    o.trainer_env["MUSTER_COORDINATOR"] = o.node_session.coordinator;
    if (const std::string file = absl::GetFlag(FLAGS_token_file); !file.empty()) {
      o.trainer_env["MUSTER_TOKEN_FILE"] = file;
    }
    o.node_session.tls.ca = absl::GetFlag(FLAGS_tls_ca);
    o.node_session.node = o.node_id;
    if (const char* tmp = std::getenv("TMPDIR"); tmp != nullptr && *tmp != '\0') {
      o.node_session.runtime_dir = tmp;
    }
  }
  return muster::RunAgent(o);
}
