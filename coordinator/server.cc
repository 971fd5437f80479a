#include "coordinator/server.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "coordinator/catalog_rebuild.h"

namespace muster {
namespace {

// --rebuild-catalog: only into an empty catalog, so nothing recorded is
// overwritten.
absl::Status FillCatalog(StateStore* store, const std::string& checkpoint_dir) {
  MUSTER_ASSIGN_OR_RETURN(std::vector<CheckpointRecord> existing, store->LoadCheckpoints());
  if (!existing.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--rebuild-catalog: the state database already holds ", existing.size(),
        " checkpoint records; it only fills an empty catalog (move coordinator.db aside)"));
  }
  MUSTER_ASSIGN_OR_RETURN(RebuiltCatalog catalog, RebuildCatalog(checkpoint_dir));
  for (const std::string& why : catalog.skipped) {
    MUSTER_LOG(WARNING) << "--rebuild-catalog: skipped " << why;
  }
  uint64_t generation = 0;
  for (const CheckpointRecord& r : catalog.records) {
    MUSTER_RETURN_IF_ERROR(store->SaveCheckpoint(r));
    generation = std::max(generation, r.generation);
  }
  // Generations go on increasing past the checkpoints' own.
  MUSTER_ASSIGN_OR_RETURN(World world, store->LoadWorld());
  if (world.generation < generation) {
    World adopted;
    adopted.generation = generation;
    MUSTER_RETURN_IF_ERROR(store->SaveWorld(adopted));
  }
  MUSTER_LOG(INFO) << "--rebuild-catalog: " << catalog.records.size()
                   << " committed checkpoints from the manifests under " << checkpoint_dir
                   << (catalog.records.empty()
                           ? std::string()
                           : absl::StrCat(" (newest step ", catalog.records.back().step, ")"))
                   << ", " << catalog.skipped.size() << " skipped";
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    ServerOptions options) {
  std::unique_ptr<CoordinatorServer> s(new CoordinatorServer());
  std::string db = ":memory:";
  if (!options.state_dir.empty()) {
    if (::mkdir(options.state_dir.c_str(), 0700) != 0 && errno != EEXIST) {
      return absl::UnavailableError(absl::StrCat("cannot create state dir ", options.state_dir,
                                                 ": ", std::strerror(errno)));
    }
    db = options.state_dir + "/coordinator.db";
  }
  MUSTER_ASSIGN_OR_RETURN(s->store_, OpenSqliteStateStore(db, options.state_sync_delay));
  if (!options.rebuild_catalog.empty()) {
    MUSTER_RETURN_IF_ERROR(FillCatalog(s->store_.get(), options.rebuild_catalog));
  }
  MUSTER_ASSIGN_OR_RETURN(s->coordinator_,
                          Coordinator::Create(options.coordinator, s->store_.get()));
  MUSTER_ASSIGN_OR_RETURN(s->metrics_, Metrics::Create(options.metrics_listen));
  if (!options.http_listen.empty()) {
    MUSTER_ASSIGN_OR_RETURN(s->status_page_, StatusPage::Start(options.http_listen, options.token,
                                                               s->coordinator_.get()));
  }
  CoordinatorServer* self = s.get();
  s->service_ = std::make_unique<CoordinatorService>(
      s->coordinator_.get(), s->metrics_.get(), options.token,
      [self] { self->RequestStop(); });
  MUSTER_ASSIGN_OR_RETURN(auto creds, MakeServerCredentials(options.tls));

  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, creds, &s->port_);
  builder.RegisterService(s->service_.get());
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(64 << 20);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // One coordinator per port: with SO_REUSEPORT (gRPC's default) a second
  // coordinator on the same port would bind too, and joins would split
  // between two jobs' worth of state.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
  // Idle connections, authenticated or not, do not hold descriptors for
  // long (docs/security.md).
  builder.AddChannelArgument(
      GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
      static_cast<int>(absl::ToInt64Milliseconds(options.handshake_timeout)));
  builder.AddChannelArgument(
      GRPC_ARG_MAX_CONNECTION_IDLE_MS,
      static_cast<int>(absl::ToInt64Milliseconds(options.max_connection_idle)));
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen));
  }
  s->options_ = std::move(options);
  s->ticker_ = std::thread([self] { self->TickLoop(); });
  // Stops the server off the rpc threads once a stop is requested.
  s->stopper_ = std::thread([self] {
    self->stop_requested_.WaitForNotification();
    self->coordinator_->Shutdown("coordinator stopping");
    self->server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    self->stopped_.Notify();
  });
  MUSTER_LOG(INFO) << "coordinator listening on port " << s->port_
                   << (s->options_.tls.enabled() ? " (TLS)" : " (plain text)")
                   << (s->options_.token.empty() ? ", no token" : ", token required");
  return s;
}

CoordinatorServer::~CoordinatorServer() {
  // A Start that failed part way has no stopper (and maybe no coordinator):
  // nothing runs that would need stopping.
  if (stopper_.joinable()) {
    Stop("coordinator destroyed");
    Wait();
    stopper_.join();
  }
  if (ticker_.joinable()) ticker_.join();
}

void CoordinatorServer::TickLoop() {
  absl::Time next_metrics = absl::InfinitePast();
  while (!stop_requested_.WaitForNotificationWithTimeout(options_.tick)) {
    coordinator_->Tick();
    if (std::string ended = coordinator_->JobEnded(); !ended.empty()) {
      {
        absl::MutexLock lock(&ended_mu_);
        ended_ = ended;
      }
      Stop(ended);
      return;
    }
    if (absl::Now() >= next_metrics) {
      metrics_->Update(coordinator_->Counters());
      next_metrics = absl::Now() + absl::Seconds(1);
    }
  }
}

void CoordinatorServer::Wait() { stopped_.WaitForNotification(); }

std::string CoordinatorServer::ended() {
  absl::MutexLock lock(&ended_mu_);
  return ended_;
}

void CoordinatorServer::Stop(const std::string& reason) {
  if (!stop_requested_.HasBeenNotified()) {
    MUSTER_LOG(INFO) << "stopping: " << reason;
    coordinator_->Shutdown(reason);
  }
  RequestStop();
}

void CoordinatorServer::RequestStop() {
  std::call_once(stop_once_, [this] { stop_requested_.Notify(); });
}

}  // namespace muster
