// muster-coordinator: the job's control plane. See README.md and
// protos/muster/v1/coordinator.proto.
#include <pthread.h>
#include <signal.h>

#include <cstdlib>
#include <iostream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/flag_names.h"
#include "common/logging.h"
#include "common/process_limits.h"
#include "common/token.h"
#include "coordinator/server.h"

ABSL_FLAG(std::string, listen, "0.0.0.0:29400", "host:port of the gRPC service");
ABSL_FLAG(std::string, state_dir, "",
          "directory for coordinator.db (SQLite: generation, catalog, event log); "
          "empty keeps state in memory only");
ABSL_FLAG(std::string, rebuild_catalog, "",
          "CHECKPOINT_DIR: before serving, fill an empty checkpoint catalog from the "
          "step-*/manifest.json files there (after a damaged coordinator.db was moved aside)");
ABSL_FLAG(std::string, token_file, "",
          "file (mode 0600) holding the job token; default $MUSTER_TOKEN_FILE");
ABSL_FLAG(bool, no_auth, false, "serve without a job token (only on a private machine)");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain: serve TLS");
ABSL_FLAG(std::string, tls_key, "", "PEM private key for --tls-cert");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA: require and verify client certificates (mTLS)");
ABSL_FLAG(std::string, metrics_listen, "", "host:port serving Prometheus text at /metrics");
ABSL_FLAG(std::string, http_listen, "",
          "host:port of the status page and /api/status (the job token required: a login "
          "form or Authorization: Bearer)");
ABSL_FLAG(uint32_t, min_members, 1, "members needed to form a world; below it the job pauses");
ABSL_FLAG(uint32_t, max_members, 1024, "largest world");
ABSL_FLAG(absl::Duration, last_call, absl::Milliseconds(500),
          "extra wait for late joiners once min_members are there");
ABSL_FLAG(absl::Duration, spare_delay, absl::Seconds(10),
          "how long the first world waits for its non-spare members before spares fill it");
ABSL_FLAG(absl::Duration, join_timeout, absl::Seconds(600),
          "longest a rendezvous call waits before the member retries");
ABSL_FLAG(uint32_t, world_size_multiple, 1, "world sizes are a multiple of this");
ABSL_FLAG(absl::Duration, heartbeat_interval, absl::Seconds(1), "member heartbeat period");
ABSL_FLAG(absl::Duration, heartbeat_timeout, absl::Seconds(5),
          "a member silent this long is declared failed");
ABSL_FLAG(uint32_t, max_heartbeat_rate, 5000,
          "heartbeats a second asked for at most, from all session streams together: with "
          "more streams, each beats less often, never less than three times per "
          "--heartbeat-timeout; 0: no bound");
ABSL_FLAG(absl::Duration, reattach_grace, absl::Seconds(30),
          "after a restart, how long the stored generation waits for its members");
ABSL_FLAG(absl::Duration, pause_timeout, absl::ZeroDuration(),
          "end the job (exit 3) when it stays below min_members this long after a failure; "
          "0 waits for members as long as it runs");
ABSL_FLAG(absl::Duration, own_work_limit, absl::Minutes(10),
          "how long a member whose peers gave up waiting for it is still waited for while its "
          "training thread runs the program's own code (an evaluation on one rank)");
ABSL_FLAG(uint32_t, keep_last, 3, "committed checkpoints kept (0 keeps all)");
ABSL_FLAG(std::string, keep_best, "",
          "also keep the best checkpoint by this metric: val_loss (smaller) or val_acc "
          "(larger); any other name counts as smaller-is-better");
ABSL_FLAG(std::string, advertise, "",
          "host:port clients reach this coordinator at (default: --listen, a wildcard host "
          "replaced by this host's name); the lease's holder and the address file's content");
ABSL_FLAG(std::string, address_file, "",
          "write the advertised address here (atomically) once this coordinator holds the "
          "lease and listens; clients given --coordinator file:PATH follow it");
ABSL_FLAG(absl::Duration, lease_timeout, absl::Seconds(3),
          "with --state-dir: a standby takes the lease over once its holder's beats stopped "
          "this long");
ABSL_FLAG(bool, verbose, false, "debug logging");
ABSL_FLAG(int, session_queues, 8,
          "completion queues, one thread each, that serve the members' and nodes' session "
          "streams (docs/scale.md, \"Completion queues\"); more for more than about 20,000 "
          "node streams");
ABSL_FLAG(absl::Duration, state_sync_delay, absl::ZeroDuration(),
          "benchmarks: every fsync of the state file also waits this long, as on a slow shared "
          "file system");

namespace {

// The server's options from the flags; false (after saying why on stderr)
// when the job token is missing or unreadable.
bool OptionsFromFlags(muster::ServerOptions* out) {
  muster::ServerOptions& options = *out;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.state_dir = absl::GetFlag(FLAGS_state_dir);
  options.state_sync_delay = absl::GetFlag(FLAGS_state_sync_delay);
  options.session_queues = absl::GetFlag(FLAGS_session_queues);
  if (options.session_queues < 1 || options.session_queues > 256) {
    std::cerr << "muster-coordinator: --session-queues must be between 1 and 256, not "
              << options.session_queues << "\n";
    return false;
  }
  options.rebuild_catalog = absl::GetFlag(FLAGS_rebuild_catalog);
  options.advertise = absl::GetFlag(FLAGS_advertise);
  options.address_file = absl::GetFlag(FLAGS_address_file);
  options.lease_timeout = absl::GetFlag(FLAGS_lease_timeout);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.http_listen = absl::GetFlag(FLAGS_http_listen);
  options.tls = {absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
                 absl::GetFlag(FLAGS_tls_ca)};
  auto token = muster::ResolveToken(absl::GetFlag(FLAGS_token_file));
  if (!token.ok()) {
    std::cerr << "muster-coordinator: " << token.status() << "\n";
    return false;
  }
  if (token->empty() && !absl::GetFlag(FLAGS_no_auth)) {
    std::cerr << "muster-coordinator: no job token: pass --token-file (or set "
                 "MUSTER_TOKEN_FILE), or --no-auth on a private machine\n";
    return false;
  }
  options.token = *token;
  muster::CoordinatorOptions& c = options.coordinator;
  c.rules.min_members = absl::GetFlag(FLAGS_min_members);
  c.rules.max_members = absl::GetFlag(FLAGS_max_members);
  c.rules.last_call = absl::GetFlag(FLAGS_last_call);
  c.rules.spare_delay = absl::GetFlag(FLAGS_spare_delay);
  c.rules.join_timeout = absl::GetFlag(FLAGS_join_timeout);
  c.rules.world_size_multiple = absl::GetFlag(FLAGS_world_size_multiple);
  c.heartbeat_interval = absl::GetFlag(FLAGS_heartbeat_interval);
  c.heartbeat_timeout = absl::GetFlag(FLAGS_heartbeat_timeout);
  c.max_heartbeat_rate = absl::GetFlag(FLAGS_max_heartbeat_rate);
  c.reattach_grace = absl::GetFlag(FLAGS_reattach_grace);
  c.pause_timeout = absl::GetFlag(FLAGS_pause_timeout);
  c.own_work_limit = absl::GetFlag(FLAGS_own_work_limit);
  c.catalog.keep_last = absl::GetFlag(FLAGS_keep_last);
  c.catalog.keep_best_metric = absl::GetFlag(FLAGS_keep_best);
  c.catalog.keep_best_larger = c.catalog.keep_best_metric == "val_acc";
  return true;
}

void LogOptions(const muster::ServerOptions& options) {
  const muster::CoordinatorOptions& c = options.coordinator;
  MUSTER_LOG(INFO) << "options: listen=" << options.listen << " state_dir="
                   << (options.state_dir.empty() ? "(memory)" : options.state_dir)
                   << " min_members=" << c.rules.min_members
                   << " max_members=" << c.rules.max_members
                   << " last_call=" << absl::FormatDuration(c.rules.last_call)
                   << " spare_delay=" << absl::FormatDuration(c.rules.spare_delay)
                   << " join_timeout=" << absl::FormatDuration(c.rules.join_timeout)
                   << " world_size_multiple=" << c.rules.world_size_multiple
                   << " heartbeat_interval=" << absl::FormatDuration(c.heartbeat_interval)
                   << " heartbeat_timeout=" << absl::FormatDuration(c.heartbeat_timeout)
                   << " max_heartbeat_rate=" << c.max_heartbeat_rate
                   << " reattach_grace=" << absl::FormatDuration(c.reattach_grace)
                   << " pause_timeout=" << absl::FormatDuration(c.pause_timeout)
                   << " keep_last=" << c.catalog.keep_last << " keep_best="
                   << (c.catalog.keep_best_metric.empty() ? "-" : c.catalog.keep_best_metric)
                   << " metrics=" << (options.metrics_listen.empty() ? "-" : options.metrics_listen)
                   << " http=" << (options.http_listen.empty() ? "-" : options.http_listen)
                   << " lease_timeout=" << absl::FormatDuration(options.lease_timeout)
                   << " address_file="
                   << (options.address_file.empty() ? "-" : options.address_file);
}

int Run() {
  if (absl::GetFlag(FLAGS_verbose)) muster::SetMinLogLevel(muster::LogLevel::kDebug);
  muster::ServerOptions options;
  if (!OptionsFromFlags(&options)) return 2;
  LogOptions(options);
  muster::RaiseOpenFileLimit();

  // Signals are taken by one thread with sigwait; block them everywhere else.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  // The signal thread runs from here on: a standby waiting for the lease
  // inside Start stops on SIGTERM too.
  struct Stopper {
    absl::Mutex mu;
    int signal ABSL_GUARDED_BY(mu) = 0;
    muster::CoordinatorServer* server ABSL_GUARDED_BY(mu) = nullptr;
  };
  static Stopper stopper;  // the detached thread may outlive Run
  std::thread([signals]() mutable {
    int sig = 0;
    sigwait(&signals, &sig);
    absl::MutexLock lock(&stopper.mu);
    stopper.signal = sig;
    if (stopper.server != nullptr) stopper.server->Stop(absl::StrCat("signal ", sig));
  }).detach();
  options.cancelled = [] {
    absl::MutexLock lock(&stopper.mu);
    return stopper.signal != 0;
  };
  auto server = muster::CoordinatorServer::Start(std::move(options));
  if (absl::IsCancelled(server.status())) {
    MUSTER_LOG(INFO) << "standby stopped by a signal before taking the lease over";
    return 0;
  }
  if (!server.ok()) {
    std::cerr << "muster-coordinator: " << server.status() << "\n";
    return 1;
  }
  {
    absl::MutexLock lock(&stopper.mu);
    stopper.server = server->get();
    if (stopper.signal != 0) stopper.server->Stop(absl::StrCat("signal ", stopper.signal));
  }
  (*server)->Wait();
  {
    absl::MutexLock lock(&stopper.mu);
    stopper.server = nullptr;
  }
  MUSTER_LOG(INFO) << "coordinator stopped";
  if (const std::string lost = (*server)->lost_lease(); !lost.empty()) {
    std::cerr << "muster-coordinator: " << lost << "\n";
    return 4;
  }
  if (const std::string ended = (*server)->ended(); !ended.empty()) {
    std::cerr << "muster-coordinator: " << ended << "\n";
    return 3;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  muster::ListOwnFlagsInHelp();
  absl::SetProgramUsageMessage(
      "muster-coordinator --listen HOST:PORT --state-dir DIR --token-file FILE [options]\n"
      "The control plane of a muster job: rendezvous, membership, KV, checkpoint catalog.");
  muster::DashesToUnderscores(argc, argv);
  muster::ParseFlags(argc, argv);
  // Debian's Abseil checks every Mutex for lock-order cycles (a debug aid
  // kept on in its build): a process-wide graph updated on each lock and on
  // each Mutex's destruction, a tenth of the coordinator's time at 100,000
  // members. The tests keep it; the served binary does not need it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return Run();
}
