// muster: command line client of a running job.
//
//   muster --coordinator HOST:PORT [--token-file F]
//          status|world|checkpoints|events|drain NODE|pull-weights|shutdown [--json] [--all]
//
// Exit codes: 0 success, 1 the rpc failed (the gRPC status is printed),
// 2 bad usage. Each command lives in cli/<command>_command.cc.
#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/command.h"
#include "common/clock.h"
#include "common/flag_names.h"
#include "common/token.h"
#include "rpc/coordinator_channel.h"
#include "rpc/credentials.h"

ABSL_FLAG(std::string, coordinator, "", "host:port of the coordinator (default $MUSTER_COORDINATOR)");
ABSL_FLAG(std::string, token_file, "", "job token file (default $MUSTER_TOKEN_FILE)");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA to verify a TLS coordinator");
ABSL_FLAG(std::string, tls_cert, "", "PEM client certificate (mutual TLS)");
ABSL_FLAG(std::string, tls_key, "", "PEM client key (mutual TLS)");
ABSL_FLAG(bool, json, false, "print JSON instead of tables");
ABSL_FLAG(bool, all, false, "checkpoints: include pending, aborted and retired ones");
ABSL_FLAG(bool, verify, false, "checkpoints: re-read every file and check its xxh3 checksum");
ABSL_FLAG(std::string, consolidate, "",
          "checkpoints: a checkpoint directory (DIR/step-S) of sharded optimizer state: write its "
          "optimizer.safetensors from the shard files (no coordinator needed)");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(10), "rpc deadline");
ABSL_FLAG(std::string, since, "",
          "events: only those since this time: a duration ago (10m, 2h) or an RFC 3339 time");
ABSL_FLAG(uint32_t, limit, 1000, "events: at most this many, the newest (up to 10,000)");
ABSL_FLAG(bool, watch, false,
          "status: redraw the table in place every --interval until Ctrl-C");
ABSL_FLAG(absl::Duration, interval, absl::Seconds(1), "status --watch: the redraw period");
ABSL_FLAG(std::string, out, "", "pull-weights: the safetensors file to write");
ABSL_FLAG(int64_t, at_step, 0,
          "pull-weights: the state after this step (the first step boundary at or after it; "
          "0: the next one)");
ABSL_FLAG(std::string, member, "",
          "pull-weights: pull from this member (default: the active member furthest ahead)");
ABSL_FLAG(absl::Duration, pull_timeout, absl::Seconds(120),
          "pull-weights: how long to wait for the step and the transfer");

namespace muster::cli {
namespace {

struct Command {
  const char* name;
  const char* usage;  // its line in --help
  int (*run)(const Invocation& in);
};

constexpr Command kCommands[] = {
    {"status", "status [--watch [--interval D]]   the world, its members and recent events",
     Status},
    {"world", "world                  the current world's membership by rank (paged GetWorld)",
     World},
    {"checkpoints",
     "checkpoints [--all] [--verify] | --consolidate DIR   the checkpoint catalog (--verify "
     "re-reads the files); one sharded checkpoint's optimizer.safetensors",
     Checkpoints},
    {"events", "events [--since T] [--limit N]   the coordinator's event log (--json: JSON lines)",
     Events},
    {"drain", "drain NODE             the node's trainers leave at the next step boundary", Drain},
    {"pull-weights", "pull-weights --out FILE [--at-step N]   a trainer's weights as safetensors",
     PullWeights},
    {"shutdown", "shutdown               stop the job", Shutdown},
};

std::string CommandNames() {
  std::vector<std::string> names;
  for (const Command& c : kCommands) names.push_back(c.name);
  return absl::StrJoin(names, ", ");
}

std::string Usage() {
  std::string usage =
      "muster --coordinator HOST:PORT [--token-file F] COMMAND [--json]\nCOMMAND is one of";
  for (const Command& c : kCommands) absl::StrAppend(&usage, "\n  ", c.usage);
  return usage;
}

// --coordinator, or $MUSTER_COORDINATOR; "" when neither.
std::string Target() {
  std::string target = absl::GetFlag(FLAGS_coordinator);
  if (target.empty() && std::getenv("MUSTER_COORDINATOR") != nullptr) {
    target = std::getenv("MUSTER_COORDINATOR");
  }
  return target;
}

int Run(const std::vector<char*>& args) {
  if (args.size() < 2) {
    std::cerr << "muster: missing command (" << CommandNames() << ")\n";
    return 2;
  }
  const std::string name = args[1];
  const Command* command = nullptr;
  for (const Command& c : kCommands) {
    if (name == c.name) command = &c;
  }
  if (command == nullptr) {
    std::cerr << "muster: unknown command " << name << " (" << CommandNames() << ")\n";
    return 2;
  }
  if (command->run == Checkpoints && !absl::GetFlag(FLAGS_consolidate).empty()) {
    return Consolidate(absl::GetFlag(FLAGS_consolidate));
  }
  const std::string target = Target();
  if (target.empty()) {
    std::cerr << "muster: no coordinator: pass --coordinator HOST:PORT or set "
                 "MUSTER_COORDINATOR\n";
    return 2;
  }
  absl::StatusOr<std::string> token = ResolveToken(absl::GetFlag(FLAGS_token_file));
  if (!token.ok()) {
    std::cerr << "muster: " << token.status() << "\n";
    return 2;
  }
  const TlsFiles tls{absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
                     absl::GetFlag(FLAGS_tls_ca)};
  if (command->run == Status && absl::GetFlag(FLAGS_watch)) {
    if (absl::GetFlag(FLAGS_interval) < absl::Milliseconds(100)) {
      std::cerr << "muster: --interval must be at least 100ms\n";
      return 2;
    }
    return WatchStatus(target, tls, *token, absl::GetFlag(FLAGS_interval), RealClock::Get());
  }
  // file:PATH: the address file the coordinator holding the lease wrote.
  const absl::StatusOr<std::string> address = ResolveCoordinator(target);
  if (!address.ok()) {
    std::cerr << "muster: " << address.status() << "\n";
    return 2;
  }
  auto channel = MakeChannel(*address, tls);
  if (!channel.ok()) {
    std::cerr << "muster: " << channel.status() << "\n";
    return 2;
  }
  // gRPC fails a call at once on a channel whose first connection attempt
  // failed. A coordinator whose machine is busy can take long enough over a
  // TLS handshake that it closes the connection (its handshake_timeout,
  // coordinator/server.h), where a second attempt would get through. So
  // the channel gets up to 3 s (within --timeout) to connect, attempts
  // included, before the command's call; with no coordinator the command
  // fails that much later, with the same error.
  Clock* const clock = RealClock::Get();  // the one clock of this command
  const absl::Time now = clock->Now();
  const absl::Time deadline = now + absl::GetFlag(FLAGS_timeout);
  (*channel)->WaitForConnected(
      SystemDeadline(std::min(deadline, now + absl::Seconds(3)), clock));
  std::unique_ptr<v1::Coordinator::Stub> stub = v1::Coordinator::NewStub(*channel);
  grpc::ClientContext ctx;
  Prepare(&ctx, *token, clock);
  ctx.set_deadline(SystemDeadline(deadline, clock));  // the wait counts against --timeout
  Invocation in{stub.get(), &ctx, *token, tls, absl::GetFlag(FLAGS_json),
                std::vector<std::string>(args.begin() + 2, args.end()), clock};
  return command->run(in);
}

}  // namespace
}  // namespace muster::cli

int main(int argc, char** argv) {
  muster::ListOwnFlagsInHelp();
  static const std::string usage = muster::cli::Usage();
  absl::SetProgramUsageMessage(usage);
  muster::DashesToUnderscores(argc, argv);
  std::vector<char*> args = muster::ParseFlags(argc, argv);
  return muster::cli::Run(args);
}
