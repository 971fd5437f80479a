#include "coordinator/server.h"

#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file_system.h"
#include "common/host_name.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/monotonic_wait.h"
#include "coordinator/catalog_rebuild.h"
#include "coordinator/lease.h"
#include "coordinator/tcp_table.h"

// gperftools' C interface, present when the coordinator is linked with
// tcmalloc (MUSTER_TCMALLOC); a weak reference is null otherwise.
extern "C" int MallocExtension_GetNumericProperty(const char* property, size_t* value)
    __attribute__((weak));
extern "C" void MallocExtension_ReleaseToSystem(size_t num_bytes) __attribute__((weak));

namespace muster {
namespace {

// How often the ticker refreshes the metrics: every second, or less often
// once the membership is so large that counting it (under the coordinator's
// lock, a walk of every member: about 12 ms at 100,000) would cost a visible
// share of a core and of the heartbeats' latency: a second per 10,000
// members, at most 10 s.
absl::Duration MetricsPeriod(const std::map<std::string, uint64_t>& members_by_state) {
  uint64_t members = 0;
  for (const auto& [state, n] : members_by_state) members += n;
  return std::clamp(absl::Seconds(static_cast<double>(members) / 10'000), absl::Seconds(1),
                    absl::Seconds(10));
}

// Hands the allocator's free pages back to the system. tcmalloc keeps free
// pages up to a quarter of the bytes in use, about what the next regroup
// allocates and frees again: handing back all of them made each regroup of
// 10,000 members fault them in anew (7% of its CPU in a profile; docs/scale.md,
// "Where a 10,000-member regroup goes"). The C library cannot keep a share,
// so it trims them all.
void ReleaseFreeMemory() {
  size_t free_bytes = 0;
  size_t in_use = 0;
  if (MallocExtension_GetNumericProperty != nullptr && MallocExtension_ReleaseToSystem != nullptr &&
      MallocExtension_GetNumericProperty("tcmalloc.pageheap_free_bytes", &free_bytes) != 0 &&
      MallocExtension_GetNumericProperty("generic.current_allocated_bytes", &in_use) != 0) {
    const size_t kept = in_use / 4;
    if (free_bytes > kept) MallocExtension_ReleaseToSystem(free_bytes - kept);
    return;
  }
#ifdef __GLIBC__
  ::malloc_trim(0);
#endif
}

// --rebuild-catalog: only into an empty catalog, so nothing recorded is
// overwritten.
absl::Status FillCatalog(StateStore* store, const std::string& checkpoint_dir, Clock* clock) {
  MUSTER_ASSIGN_OR_RETURN(std::vector<CheckpointRecord> existing, store->LoadCheckpoints());
  if (!existing.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--rebuild-catalog: the state database already holds ", existing.size(),
        " checkpoint records; it only fills an empty catalog (move coordinator.db aside)"));
  }
  MUSTER_ASSIGN_OR_RETURN(RebuiltCatalog catalog, RebuildCatalog(checkpoint_dir, clock));
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

// `listen` as clients reach it: a wildcard host becomes this host's name.
std::string Advertised(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  const std::string host = colon == std::string::npos ? "" : listen.substr(0, colon);
  if (host != "0.0.0.0" && host != "[::]" && !host.empty()) return listen;
  return absl::StrCat(HostName(), listen.substr(colon == std::string::npos ? listen.size() : colon));
}

// Blocks until this coordinator holds the lease on `store`, or `cancelled`.
absl::StatusOr<Lease> HoldLease(StateStore* store, const std::string& holder,
                                const ServerOptions& options) {
  LeaseClaim claim(store, holder, options.lease_timeout);
  bool told = false;
  std::string last_error;
  for (;;) {
    absl::StatusOr<std::optional<Lease>> polled = claim.Poll(options.coordinator.clock->Now());
    // A busy or briefly unreachable state file (another coordinator opening
    // or writing it, a file system hiccup): look again.
    if (!polled.ok() && !absl::IsUnavailable(polled.status())) return polled.status();
    if (!polled.ok() && polled.status().message() != last_error) {
      // E.g. "database is locked": a holder that hangs inside a write keeps
      // SQLite's lock, and nobody can write the state until it is gone.
      last_error = std::string(polled.status().message());
      MUSTER_LOG(WARNING) << "standby: cannot take the lease yet: " << polled.status();
    }
    const std::optional<Lease> lease = polled.ok() ? *polled : std::nullopt;
    if (lease.has_value()) {
      MUSTER_LOG(INFO) << "lease of " << options.state_dir << ": epoch " << lease->epoch
                       << ", held by " << holder;
      return *lease;
    }
    if (!told && polled.ok()) {
      told = true;
      MUSTER_LOG(INFO) << "standby: the lease of " << options.state_dir << " is held by "
                       << claim.seen().holder << " (epoch " << claim.seen().epoch
                       << "); taking over once its beats stop for "
                       << absl::FormatDuration(options.lease_timeout);
    }
    if (options.cancelled && options.cancelled()) {
      return absl::CancelledError("stopped while waiting for the lease as a standby");
    }
    absl::SleepFor(std::clamp(options.lease_timeout / 20, absl::Milliseconds(10),
                              absl::Milliseconds(100)));
  }
}

// `listen` with its port replaced by `port`.
std::string WithPort(const std::string& listen, int port) {
  return absl::StrCat(listen.substr(0, listen.rfind(':')), ":", port);
}

}  // namespace

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    ServerOptions options) {
  std::unique_ptr<CoordinatorServer> s(new CoordinatorServer());
  s->options_ = std::move(options);
  // The coordinator's composition root: the one real clock, unless the
  // caller gave one.
  if (s->options_.coordinator.clock == nullptr) s->options_.coordinator.clock = RealClock::Get();
  const ServerOptions& o = s->options_;
  MUSTER_RETURN_IF_ERROR(s->OpenState());
  // A holder of the lease may let it lapse while it hears from nobody, for
  // long enough that a standby takes over (docs/failover.md).
  if (s->epoch_ != 0) s->options_.coordinator.silence_hold = 2 * o.lease_timeout;
  MUSTER_ASSIGN_OR_RETURN(s->coordinator_, Coordinator::Create(o.coordinator, s->store_.get()));
  MUSTER_ASSIGN_OR_RETURN(s->metrics_, Metrics::Create(o.metrics_listen));
  if (!o.http_listen.empty()) {
    MUSTER_ASSIGN_OR_RETURN(s->status_page_,
                            StatusPage::Start(o.http_listen, o.token, s->coordinator_.get()));
  }
  MUSTER_ASSIGN_OR_RETURN(s->credentials_, MakeServerCredentials(o.tls));
  MUSTER_RETURN_IF_ERROR(s->Listen());
  CoordinatorServer* self = s.get();
  s->ticker_ = std::thread([self] { self->TickLoop(); });
  if (o.listener_check > absl::ZeroDuration()) {
    s->watchdog_ = std::make_unique<ListenerWatchdog>(
        ListenerWatchdogOptions{s->port_, o.listener_check, o.listener_stuck_after, s->clock()},
        [self](absl::Duration waited) { return self->RebuildListener(waited); });
  }
  s->stopper_ = std::thread([self] { self->StopWhenAsked(); });
  MUSTER_LOG(INFO) << "coordinator listening on port " << s->port_
                   << (o.tls.enabled() ? " (TLS)" : " (plain text)")
                   << (o.token.empty() ? ", no token" : ", token required");
  return s;
}

std::string CoordinatorServer::AdvertisedAddress() const {
  return options_.advertise.empty() ? Advertised(options_.listen) : options_.advertise;
}

absl::Status CoordinatorServer::OpenState() {
  const ServerOptions& o = options_;
  std::string db = ":memory:";
  if (!o.state_dir.empty()) {
    if (::mkdir(o.state_dir.c_str(), 0700) != 0 && errno != EEXIST) {
      return absl::UnavailableError(
          absl::StrCat("cannot create state dir ", o.state_dir, ": ", std::strerror(errno)));
    }
    db = o.state_dir + "/coordinator.db";
  }
  MUSTER_ASSIGN_OR_RETURN(store_, OpenSqliteStateStore(db, o.state_sync_delay));
  if (!o.state_dir.empty()) {
    // Port 0 is not an address yet: such a coordinator never counts as
    // the restart of another (the pid tells processes apart).
    const std::string advertised = AdvertisedAddress();
    const std::string holder = absl::EndsWith(advertised, ":0")
                                   ? absl::StrCat(advertised, "#", ::getpid())
                                   : advertised;
    MUSTER_ASSIGN_OR_RETURN(Lease lease, HoldLease(store_.get(), holder, o));
    epoch_ = lease.epoch;
  }
  if (!o.rebuild_catalog.empty()) {
    MUSTER_RETURN_IF_ERROR(FillCatalog(store_.get(), o.rebuild_catalog, clock()));
  }
  return absl::OkStatus();
}

absl::Status CoordinatorServer::Listen() {
  {
    absl::MutexLock lock(&servers_mu_);
    MUSTER_ASSIGN_OR_RETURN(std::unique_ptr<Listener> listener,
                            StartGrpc(options_.listen, &port_));
    listeners_.push_back(std::move(listener));
  }
  if (options_.address_file.empty()) return absl::OkStatus();
  std::string advertised = AdvertisedAddress();
  if (absl::EndsWith(advertised, ":0")) {
    advertised = absl::StrCat(advertised.substr(0, advertised.size() - 1), port_);
  }
  return WriteFileAtomically(DefaultFileSystem(), options_.address_file, advertised + "\n");
}

void CoordinatorServer::StopWhenAsked() {
  stop_requested_.WaitForNotification();
  if (watchdog_ != nullptr) watchdog_->Stop();
  if (lost_lease().empty()) {
    coordinator_->Shutdown("coordinator stopping").IgnoreError();  // logged
    ShutDownServers(clock()->Now() + absl::Seconds(2));
    if (epoch_ != 0) {
      if (absl::Status s = store_->ReleaseLease(epoch_); !s.ok()) {
        MUSTER_LOG(WARNING) << "could not release the lease: " << s;
      }
    }
  } else {
    // Members are not stopped: their sessions and calls end UNAVAILABLE,
    // and they go to the coordinator that took over.
    coordinator_->Abandon(lost_lease());
    ShutDownServers(clock()->Now() + absl::Milliseconds(200));
  }
  stopped_.Notify();
}

std::unique_ptr<CoordinatorService> CoordinatorServer::NewService() {
  return std::make_unique<CoordinatorService>(
      coordinator_.get(), metrics_.get(), options_.token, [this] { RequestStop(); }, epoch_);
}

absl::StatusOr<std::unique_ptr<CoordinatorServer::Listener>> CoordinatorServer::StartGrpc(
    const std::string& listen, int* port) {
  auto listener = std::make_unique<Listener>();
  listener->service = NewService();
  CoordinatorService* service = listener->service.get();
  if (service->has_synchronous_methods()) {
    return absl::InternalError("a method of the Coordinator service has no handler");
  }
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen, credentials_, port);
  builder.RegisterService(service);
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> queues;
  for (int i = 0; i < std::max(1, options_.session_queues); ++i) {
    queues.push_back(builder.AddCompletionQueue());
  }
  builder.SetMaxReceiveMessageSize(options_.max_message_bytes);
  builder.SetMaxSendMessageSize(64 << 20);
  ApplyServerConnectionRules(&builder, options_.handshake_timeout, options_.max_connection_idle);
  listener->sessions = std::make_unique<AsyncBidiServer<v1::SessionRequest, v1::SessionEvent>>(
      std::move(queues),
      [service](grpc::ServerContext* ctx, SessionCall::Stream* stream,
                grpc::ServerCompletionQueue* queue,
                void* tag) { service->RequestSession(ctx, stream, queue, queue, tag); },
      [service](SessionCall* call) { return service->StartSession(call); });
  listener->server = builder.BuildAndStart();
  if (listener->server == nullptr || *port == 0) {
    // Never started: the queues hold nothing (no call was requested).
    listener->sessions->Shutdown();
    return absl::UnavailableError(absl::StrCat("cannot listen on ", listen));
  }
  listener->sessions->Start();
  return listener;
}

absl::Status CoordinatorServer::RebuildListener(absl::Duration waited) {
  MUSTER_LOG(WARNING) << "the listener on port " << port_
                      << " stopped accepting (a connection waited "
                      << absl::FormatDuration(waited)
                      << " in its queue; out of file descriptors?): replacing it, open "
                         "connections and sessions go on";
  MUSTER_ASSIGN_OR_RETURN(const int shut, ShutDownListeningSockets(port_));
  int port = 0;
  MUSTER_ASSIGN_OR_RETURN(std::unique_ptr<Listener> listener,
                          StartGrpc(WithPort(options_.listen, port_), &port));
  absl::MutexLock lock(&servers_mu_);
  listeners_.push_back(std::move(listener));
  metrics_->CountListenerRebuild();
  MUSTER_LOG(WARNING) << "listening on port " << port_ << " again (listener rebuilt; "
                      << shut << " dead listening socket(s) shut down, "
                      << listeners_.size() << " gRPC servers)";
  return absl::OkStatus();
}

void CoordinatorServer::ShutDownServers(absl::Time deadline) {
  absl::MutexLock lock(&servers_mu_);
  for (const std::unique_ptr<Listener>& listener : listeners_) {
    listener->server->Shutdown(SystemDeadline(deadline, clock()));
  }
  // Every server is down: each ended its calls (at the deadline, by
  // cancelling them), and their Session streams end now.
  for (const std::unique_ptr<Listener>& listener : listeners_) listener->sessions->Shutdown();
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
  absl::Time next_trim_check = absl::InfinitePast();
  uint64_t worlds_completed = 0;
  bool trim_due = false;
  LeaseRenewal lease(options_.lease_timeout, clock()->Now());
  bool holding = false;
  // Relative sleeps: absl's timed waits would stall as long as the wall
  // clock is set back (common/monotonic_wait.h).
  while (!SleepUnlessNotified(stop_requested_, options_.tick)) {
    const LeaseTurn turn = TendLease(&lease, &holding);
    if (turn == LeaseTurn::kStop) return;
    if (turn == LeaseTurn::kHold) continue;
    coordinator_->Tick();
    if (std::string ended = coordinator_->JobEnded(); !ended.empty()) {
      {
        absl::MutexLock lock(&ended_mu_);
        ended_ = ended;
      }
      Stop(ended);
      return;
    }
    if (clock()->Now() >= next_metrics) {
      const CoordinatorCounters counters = coordinator_->Counters();
      metrics_->Update(counters);
      next_metrics = clock()->Now() + MetricsPeriod(counters.members_by_state);
    }
    if (clock()->Now() >= next_trim_check) {
      // A completed world's answers and pushes are freed once written, but
      // the allocator keeps the pages (glibc's: 350 of 740 MB at 100,000
      // members): hand them back a second after the last completion.
      const uint64_t completed = coordinator_->WorldsCompleted();
      if (completed != worlds_completed) {
        worlds_completed = completed;
        trim_due = true;
      } else if (trim_due) {
        trim_due = false;
        ReleaseFreeMemory();  // glibc's: 26 ms after 100,000 members rendezvous
      }
      next_trim_check = clock()->Now() + absl::Seconds(1);
    }
  }
}

CoordinatorServer::LeaseTurn CoordinatorServer::TendLease(LeaseRenewal* lease, bool* holding) {
  if (epoch_ == 0) return LeaseTurn::kTick;  // no state dir: no lease, nobody to take over
  const absl::Duration unheard = coordinator_->Unheard();
  if ((unheard > absl::ZeroDuration()) != *holding) {
    *holding = !*holding;
    if (*holding) {
      MUSTER_LOG(WARNING) << "no member heard for " << absl::FormatDuration(unheard)
                          << ", on two nodes or more: this coordinator may be the one cut off."
                          << " It lets its lease lapse, so that a standby can take over, and"
                          << " fails no member for this silence for up to "
                          << absl::FormatDuration(options_.coordinator.silence_hold);
    } else {
      MUSTER_LOG(INFO) << "the hold ends (members heard again, or no standby took the lease"
                       << " over): renewing the lease";
      lease->BeatNow();
    }
  }
  // Renew before the coordinator acts on time (heartbeat timeouts): a
  // coordinator that was frozen past the lease timeout finds out that it
  // lost the lease before it fails members that were never gone.
  const absl::Time asked = clock()->Now();
  if (lease->BeatDue(asked)) {
    const absl::Status beat =
        *holding ? CheckLeaseHeld(store_.get(), epoch_) : store_->RenewLease(epoch_);
    if (absl::IsAborted(beat)) {
      MUSTER_LOG(ERROR) << "stopping: " << beat.message();
      {
        absl::MutexLock lock(&ended_mu_);
        lost_lease_ = std::string(beat.message());
      }
      RequestStop();
      return LeaseTurn::kStop;
    }
    // The file system may come back; a standby takes over if it does not.
    if (!beat.ok()) {
      MUSTER_LOG(WARNING) << "could not " << (*holding ? "read" : "renew") << " the lease: "
                          << beat;
    }
    // Renewed as of the call, not its return: a standby counts from the
    // beat it saw, which a disk that stalled in the sync showed it early.
    if (beat.ok() && !*holding) lease->Renewed(asked);
  }
  // Not sure of the lease any more: decide nothing on time until it is.
  return *holding || !lease->Sure(clock()->Now()) ? LeaseTurn::kHold : LeaseTurn::kTick;
}

void CoordinatorServer::Wait() { stopped_.WaitForNotification(); }

std::string CoordinatorServer::lost_lease() {
  absl::MutexLock lock(&ended_mu_);
  return lost_lease_;
}

std::string CoordinatorServer::ended() {
  absl::MutexLock lock(&ended_mu_);
  return ended_;
}

void CoordinatorServer::Stop(const std::string& reason) {
  if (!stop_requested_.HasBeenNotified()) {
    MUSTER_LOG(INFO) << "stopping: " << reason;
    coordinator_->Shutdown(reason).IgnoreError();  // logged
  }
  RequestStop();
}

void CoordinatorServer::RequestStop() {
  std::call_once(stop_once_, [this] { stop_requested_.Notify(); });
}

}  // namespace muster
