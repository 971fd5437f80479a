// muster-relay: carries agents' and trainers' calls to the coordinator on a
// few shared connections (relay/relay.h, docs/relay.md).
#include <pthread.h>
#include <signal.h>

#include <iostream>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/synchronization/mutex.h"
#include "common/flag_names.h"
#include "common/logging.h"
#include "common/process_limits.h"
#include "common/token.h"
#include "relay/relay.h"

ABSL_FLAG(std::string, listen, "0.0.0.0:29401",
          "host:port that agents and trainers dial instead of the coordinator");
ABSL_FLAG(std::string, coordinator, "",
          "the coordinator: host:port, file:PATH (its address file, followed on failover) or "
          "a comma-separated list of these (or $MUSTER_COORDINATOR)");
ABSL_FLAG(int, connections, 1, "connections to the coordinator that the relayed calls share");
ABSL_FLAG(std::string, token_file, "",
          "job token file (or $MUSTER_TOKEN_FILE): calls without the token are refused here; "
          "without one, the coordinator refuses them");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain: serve TLS to agents and trainers");
ABSL_FLAG(std::string, tls_key, "", "PEM private key for --tls-cert");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA: require and verify callers' client certificates");
ABSL_FLAG(std::string, coordinator_tls_ca, "",
          "CA certificate to verify the coordinator's TLS certificate (TLS towards it)");
ABSL_FLAG(std::string, coordinator_tls_cert, "", "client certificate towards the coordinator");
ABSL_FLAG(std::string, coordinator_tls_key, "", "its key");
ABSL_FLAG(bool, verbose, false, "debug logging");

namespace {

int Run() {
  if (absl::GetFlag(FLAGS_verbose)) muster::SetMinLogLevel(muster::LogLevel::kDebug);
  muster::RelayOptions options;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.coordinator = absl::GetFlag(FLAGS_coordinator);
  if (options.coordinator.empty()) {
    if (const char* env = std::getenv("MUSTER_COORDINATOR")) options.coordinator = env;
  }
  options.connections = absl::GetFlag(FLAGS_connections);
  options.tls = {absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
                 absl::GetFlag(FLAGS_tls_ca)};
  options.coordinator_tls = {absl::GetFlag(FLAGS_coordinator_tls_cert),
                             absl::GetFlag(FLAGS_coordinator_tls_key),
                             absl::GetFlag(FLAGS_coordinator_tls_ca)};
  auto token = muster::ResolveToken(absl::GetFlag(FLAGS_token_file));
  if (!token.ok()) {
    std::cerr << "muster-relay: " << token.status() << "\n";
    return 2;
  }
  options.token = *token;
  muster::RaiseOpenFileLimit();

  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  absl::StatusOr<std::unique_ptr<muster::Relay>> relay = muster::Relay::Start(options);
  if (!relay.ok()) {
    std::cerr << "muster-relay: " << relay.status() << "\n";
    return absl::IsInvalidArgument(relay.status()) || absl::IsNotFound(relay.status()) ? 2 : 1;
  }
  MUSTER_LOG(INFO) << "muster-relay: listening on port " << (*relay)->port() << ", relaying to "
                   << options.coordinator << " on " << options.connections << " connection"
                   << (options.connections == 1 ? "" : "s");
  int sig = 0;
  sigwait(&signals, &sig);
  const muster::RelayCounts counts = (*relay)->counts();
  MUSTER_LOG(INFO) << "muster-relay: signal " << sig << ": stopping after " << counts.calls
                   << " calls (" << counts.refused << " refused, " << counts.open
                   << " under way)";
  (*relay)->Shutdown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  muster::ListOwnFlagsInHelp();
  absl::SetProgramUsageMessage(
      "muster-relay --coordinator HOST:PORT [--listen HOST:PORT] [options]\n"
      "Carries agents' and trainers' calls to the coordinator on a few connections.");
  muster::DashesToUnderscores(argc, argv);
  muster::ParseFlags(argc, argv);
  // As muster-coordinator: Debian's Abseil would check every lock of every
  // relayed call for lock-order cycles.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return Run();
}
