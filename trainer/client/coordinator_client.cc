#include "trainer/client/coordinator_client.h"

#include <grpcpp/grpcpp.h>

#include <unistd.h>

#include <algorithm>

#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/atomic_max.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/session_liveness.h"
#include "common/status_macros.h"
#include "muster/v1/coordinator.grpc.pb.h"
#include "rpc/agent_protocol.h"
#include "rpc/coordinator_channel.h"
#include "rpc/credentials.h"
#include "rpc/status.h"
#include "trainer/client/world_delta.h"

namespace muster {

// One session stream, shared by its reader and its heartbeat thread.
struct CoordinatorClient::OpenSession {
  // `now`: the client's clock's Now() as the stream opens.
  OpenSession(std::unique_ptr<grpc::ClientReaderWriter<v1::SessionRequest, v1::SessionEvent>> s,
              absl::Time now)
      : stream(std::move(s)), heard_ms(absl::ToUnixMillis(now)) {}
  std::unique_ptr<grpc::ClientReaderWriter<v1::SessionRequest, v1::SessionEvent>> stream;
  bool write_ok = false;  // hello went out; set before the heartbeats start
  std::atomic<bool> done{false};
  // When the stream last carried an event: monotonic ms (the client's
  // clock's Now()).
  std::atomic<int64_t> heard_ms;
  absl::Mutex write_mu;  // Write and Finish
};

struct CoordinatorClient::Impl {
  std::unique_ptr<CoordinatorChannel> coordinator;
  // Under muster-agent: where the session stream and Rendezvous go.
  std::shared_ptr<v1::Coordinator::Stub> agent_stub;
  absl::Mutex mu;
  // The stub of coordinator's channel as of the last Refresh.
  std::shared_ptr<v1::Coordinator::Stub> stub ABSL_GUARDED_BY(mu);
  // The live session's context, so the destructor can cancel it.
  grpc::ClientContext* session_ctx ABSL_GUARDED_BY(mu) = nullptr;

  std::shared_ptr<v1::Coordinator::Stub> Stub() {
    absl::MutexLock lock(&mu);
    return stub;
  }
  // Where the session stream and Rendezvous go: the agent, or the
  // coordinator.
  std::shared_ptr<v1::Coordinator::Stub> SessionStub() {
    return agent_stub != nullptr ? agent_stub : Stub();
  }
  // Follows a coordinator that moved (an address file target).
  void Refresh() {
    if (!coordinator->Refresh()) return;
    MUSTER_LOG(INFO) << "coordinator now at " << coordinator->address();
    absl::MutexLock lock(&mu);
    stub = v1::Coordinator::NewStub(coordinator->get());
  }
};

namespace {

v1::MemberRef Ref(const ClientOptions& o) {
  v1::MemberRef r;
  r.set_member_id(o.member_id);
  r.set_incarnation(o.incarnation);
  return r;
}

// The answer is what the communicators are built from: refuse one that does
// not hold together rather than build from it.
absl::Status CheckWorld(const WorldInfo& w, const std::string& me) {
  const auto bad = [&](const std::string& what) {
    return absl::InternalError(absl::StrCat("the coordinator's world for generation ",
                                            w.generation, " is inconsistent: ", what));
  };
  if (w.rank < 0 || w.rank >= w.world_size || w.self.rank != w.rank) {
    return bad(absl::StrCat("rank ", w.rank, " of ", w.world_size));
  }
  if (w.self.member_id != me) {
    return bad(absl::StrCat("it assigns rank ", w.rank, " to ", w.self.member_id));
  }
  if (w.local_world_size() < 1 ||
      static_cast<int>(w.node_peers.size()) != w.local_world_size() ||
      w.local_rank() >= w.local_world_size() ||
      w.node_peers[w.local_rank()].member_id != me) {
    return bad(absl::StrCat(w.node_peers.size(), " node members for local rank ",
                            w.local_rank(), " of ", w.local_world_size()));
  }
  if (w.node_sizes.empty() || w.node_count < 1 || w.node_count > w.world_size) {
    return bad(absl::StrCat(w.node_count, " nodes"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CoordinatorClient>> CoordinatorClient::Create(
    ClientOptions options) {
  if (options.clock == nullptr) {
    return absl::InvalidArgumentError("ClientOptions::clock is required");
  }
  if (options.incarnation == 0) {
    absl::BitGen gen;
    options.incarnation = absl::Uniform<uint64_t>(gen, 1, UINT64_MAX);
  }
  std::unique_ptr<CoordinatorClient> c(new CoordinatorClient(std::move(options)));
  MUSTER_ASSIGN_OR_RETURN(c->impl_->coordinator,
                          CoordinatorChannel::Create(c->options_.target, c->options_.tls));
  {
    absl::MutexLock lock(&c->impl_->mu);
    c->impl_->stub = v1::Coordinator::NewStub(c->impl_->coordinator->get());
  }
  if (!c->options_.session_via.empty()) {
    if (!absl::StartsWith(c->options_.session_via, "unix:")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the agent's session address must be unix:PATH, not ", c->options_.session_via));
    }
    // A private Unix socket of the same user: no TLS (the token still goes).
    c->impl_->agent_stub = v1::Coordinator::NewStub(
        grpc::CreateChannel(c->options_.session_via, grpc::InsecureChannelCredentials()));
  }
  return c;
}

CoordinatorClient::CoordinatorClient(ClientOptions options)
    : options_(std::move(options)), impl_(std::make_unique<Impl>()) {}

CoordinatorClient::~CoordinatorClient() {
  stopping_ = true;
  {
    absl::MutexLock lock(&impl_->mu);
    if (impl_->session_ctx != nullptr) impl_->session_ctx->TryCancel();
  }
  if (session_thread_.joinable()) session_thread_.join();
}

absl::Status CoordinatorClient::Retry(absl::Time deadline,
                                      const std::function<absl::Status(absl::Time)>& call) {
  Backoff backoff(options_.backoff);
  while (true) {
    impl_->Refresh();  // the coordinator may have moved meanwhile
    absl::Status s = call(deadline);
    // CANCELLED: these calls are never cancelled here, so the server ended
    // it (a coordinator stopping, or one taken over): as UNAVAILABLE.
    if (absl::IsCancelled(s) && !stopping_) s = absl::UnavailableError(s.message());
    if (!absl::IsUnavailable(s)) return s;
    const absl::Duration wait = backoff.Next();
    if (options_.clock->Now() + wait >= deadline || stopping_) {
      return absl::DeadlineExceededError(
          absl::StrCat("coordinator unreachable until the deadline: ", s.message()));
    }
    // Not connected (the coordinator is down or restarting): the channel
    // reconnects on its own schedule (rpc/credentials.cc) and the call goes
    // again as soon as it has, instead of at the end of a backoff that grew
    // with the outage. Connected: the coordinator itself answered
    // UNAVAILABLE, so back off in full.
    impl_->Refresh();
    std::shared_ptr<grpc::Channel> channel = impl_->coordinator->get();
    if (channel->GetState(/*try_to_connect=*/true) != GRPC_CHANNEL_READY) {
      channel->WaitForConnected(SystemDeadline(options_.clock->Now() + wait, options_.clock));
    } else {
      absl::SleepFor(wait);
    }
  }
}

#define MUSTER_CONTEXT(ctx, deadline)                                   \
  grpc::ClientContext ctx;                                              \
  AttachToken(&ctx, options_.token);                                    \
  ctx.set_deadline(SystemDeadline(deadline, options_.clock))

absl::Status CoordinatorClient::Join(int64_t step, absl::Time deadline) {
  return Retry(deadline, [&](absl::Time d) {
    MUSTER_CONTEXT(ctx, std::min(d, options_.clock->Now() + absl::Seconds(10)));
    v1::JoinRequest req;
    *req.mutable_member() = Ref(options_);
    req.set_node(options_.node);
    req.set_local_rank(options_.local_rank);
    req.set_spare(options_.spare);
    req.set_state_address(options_.state_address);
    req.set_step(step);
    v1::JoinResponse resp;
    absl::Status s = FromGrpcStatus(impl_->Stub()->Join(&ctx, req, &resp));
    if (s.ok()) {
      heartbeat_ms_ = std::max<int64_t>(10, resp.heartbeat_interval_ms());
      RaiseTo(latest_generation_, resp.current_generation());
      absl::MutexLock lock(&observed_mu_);
      observed_host_ = resp.observed_host();
    }
    return s;
  });
}

std::string CoordinatorClient::observed_host() const {
  absl::MutexLock lock(&observed_mu_);
  return observed_host_;
}

absl::Status CoordinatorClient::StartSession(
    std::function<void(const SessionNotice&)> on_notice) {
  if (session_thread_.joinable()) return absl::FailedPreconditionError("session already started");
  session_thread_ = std::thread([this, on_notice] { SessionLoop(on_notice); });
  return absl::OkStatus();
}

void CoordinatorClient::SessionLoop(std::function<void(const SessionNotice&)> on_notice) {
  Backoff backoff(options_.backoff);
  while (!stopping_) {
    bool heard = false;
    const absl::Status s = RunSession(on_notice, &backoff, &heard);
    if (stopping_) return;
    if (absl::IsAborted(s) || absl::IsFailedPrecondition(s) || absl::IsUnauthenticated(s) ||
        (s.ok() && heard)) {
      // Fenced, refused, or stopped by the coordinator: this incarnation is over.
      SessionNotice n;
      n.kind = SessionNotice::Kind::kSessionLost;
      n.reason = s.ok() ? "the coordinator ended the session" : std::string(s.message());
      on_notice(n);
      return;
    }
    // The coordinator went away (restart): reconnect and re-register.
    MUSTER_LOG(WARNING) << "session lost (" << s << "); reconnecting";
    absl::SleepFor(backoff.Next());
    impl_->Refresh();
    // Under muster-agent, UNAVAILABLE is the agent's node stream breaking.
    // The next session waits at the agent until it has reconnected, and a
    // coordinator restarted on its state still knows the member: it
    // reattaches without joining again. (One that forgot it ends the
    // session with NOT_FOUND, and the member joins before the next.)
    if (impl_->agent_stub != nullptr && absl::IsUnavailable(s)) continue;
    absl::Status rejoin = Join(step_, options_.clock->Now() + absl::Seconds(30));
    if (absl::IsAborted(rejoin)) {
      SessionNotice n;
      n.kind = SessionNotice::Kind::kSessionLost;
      n.reason = std::string(rejoin.message());
      on_notice(n);
      return;
    }
  }
}

absl::Status CoordinatorClient::RunSession(
    const std::function<void(const SessionNotice&)>& on_notice, Backoff* backoff, bool* heard) {
  grpc::ClientContext ctx;
  AttachToken(&ctx, options_.token);
  if (impl_->agent_stub != nullptr) {
    ctx.AddMetadata(kTrainerPidMetadata, std::to_string(::getpid()));
  }
  {
    absl::MutexLock lock(&impl_->mu);
    if (stopping_) return absl::CancelledError("stopping");
    impl_->session_ctx = &ctx;
  }
  // The stub (and its channel) must outlive the stream.
  const std::shared_ptr<v1::Coordinator::Stub> stub = impl_->SessionStub();
  OpenSession session(stub->Session(&ctx), options_.clock->Now());
  // A new stream goes where the address file points now; a coordinator
  // restarted on a new state dir counts epochs from 1 again.
  epoch_ = 0;
  v1::SessionRequest hello;
  *hello.mutable_hello() = Ref(options_);
  session.write_ok = session.stream->Write(hello);
  std::thread beater([this, &session, &ctx] { Heartbeats(&session, &ctx); });
  v1::SessionEvent ev;
  while (session.stream->Read(&ev)) {
    if (!FromCurrentEpoch(ev.epoch())) {
      // A coordinator fenced by a takeover, not yet told: it steers
      // nobody, and its silence will end this stream.
      MUSTER_LOG(WARNING) << "dropped an event of lease epoch " << ev.epoch() << " (epoch "
                          << epoch_.load() << " is current)";
      continue;
    }
    *heard = true;
    session.heard_ms = absl::ToUnixMillis(options_.clock->Now());
    backoff->Reset();
    if (std::optional<SessionNotice> n = Notice(ev)) on_notice(*n);
  }
  session.done = true;
  grpc::Status status;
  {
    absl::MutexLock lock(&session.write_mu);
    status = session.stream->Finish();
  }
  beater.join();
  {
    absl::MutexLock lock(&impl_->mu);
    impl_->session_ctx = nullptr;
  }
  return FromGrpcStatus(status);
}

void CoordinatorClient::Heartbeats(OpenSession* session, grpc::ClientContext* ctx) {
  uint64_t seq = 0;
  // The first heartbeat follows hello at once: the step is then known
  // from the session's start (a muster-agent reports a member from it).
  bool first = true;
  while (!session->done && !stopping_ && session->write_ok) {
    if (!first) absl::SleepFor(absl::Milliseconds(heartbeat_ms_.load()));
    first = false;
    if (session->done || stopping_) break;
    const int64_t silent =
        absl::ToUnixMillis(options_.clock->Now()) - session->heard_ms.load();
    if (silent > absl::ToInt64Milliseconds(SilenceLimit(absl::Milliseconds(heartbeat_ms_.load())))) {
      MUSTER_LOG(WARNING) << "no word from the coordinator for " << silent << " ms; reconnecting";
      ctx->TryCancel();
      break;
    }
    v1::SessionRequest hb;
    hb.mutable_heartbeat()->set_step(step_);
    hb.mutable_heartbeat()->set_samples(samples_);
    hb.mutable_heartbeat()->set_stalled_ms(
        options_.progress != nullptr ? options_.progress->stalled_ms() : 0);
    hb.mutable_heartbeat()->set_working(options_.progress != nullptr &&
                                        options_.progress->Working());
    hb.mutable_heartbeat()->set_sequence(++seq);
    {
      absl::MutexLock memory_lock(&memory_mu_);
      if (memory_.total() > 0) {
        v1::MemoryBytes* m = hb.mutable_heartbeat()->mutable_memory();
        m->set_parameters(static_cast<uint64_t>(memory_.parameters));
        m->set_gradients(static_cast<uint64_t>(memory_.gradients));
        m->set_optimizer_state(static_cast<uint64_t>(memory_.optimizer_state));
        m->set_communication(static_cast<uint64_t>(memory_.communication));
        m->set_staging(static_cast<uint64_t>(memory_.staging));
        m->set_transfer(static_cast<uint64_t>(memory_.transfer));
      }
    }
    absl::MutexLock lock(&session->write_mu);
    if (!session->stream->Write(hb)) break;
  }
}

std::optional<SessionNotice> CoordinatorClient::Notice(const v1::SessionEvent& ev) {
  if (ev.has_ack()) {
    RaiseTo(latest_generation_, ev.ack().current_generation());
    // The coordinator asks for longer periods as its sessions grow in number.
    if (ev.ack().heartbeat_interval_ms() > 0) {
      heartbeat_ms_ = std::max<int64_t>(10, ev.ack().heartbeat_interval_ms());
    }
    return std::nullopt;
  }
  SessionNotice n;
  if (ev.has_regroup()) {
    n.kind = SessionNotice::Kind::kRegroup;
    n.generation = ev.regroup().generation();
    n.abort = ev.regroup().abort();
    n.leave = ev.regroup().leave();
    n.paused = ev.regroup().paused();
    n.reason = ev.regroup().reason();
    RaiseTo(latest_generation_, n.generation);
  } else if (ev.has_stop()) {
    n.kind = SessionNotice::Kind::kStop;
    n.reason = ev.stop().reason();
  }
  return n;
}

bool CoordinatorClient::FromCurrentEpoch(uint64_t epoch) {
  if (impl_->agent_stub != nullptr) return true;
  return epoch >= RaiseTo(epoch_, epoch);
}

absl::StatusOr<WorldInfo> CoordinatorClient::Rendezvous(uint64_t after, int64_t step,
                                                        absl::Time deadline,
                                                        const BrokenWorld* broken) {
  WorldInfo w;
  MUSTER_RETURN_IF_ERROR(Retry(deadline, [&](absl::Time d) {
    MUSTER_CONTEXT(ctx, d + absl::Seconds(2));
    v1::RendezvousResponse resp;
    v1::RendezvousRequest req;
    *req.mutable_member() = Ref(options_);
    req.set_after_generation(after);
    req.set_step(step);
    req.set_takes_delta(true);
    req.set_timeout_ms(static_cast<uint32_t>(
        std::max<int64_t>(1, absl::ToInt64Milliseconds(Remaining(d, options_.clock)))));
    if (broken != nullptr) {
      v1::BrokenWorld* b = req.mutable_broken();
      b->set_generation(after);
      b->set_reason(broken->reason.substr(0, 1000));
      b->set_deadline_ms(static_cast<uint32_t>(
          std::clamp<int64_t>(absl::ToInt64Milliseconds(broken->deadline), 0, 3'600'000)));
      for (int r : broken->unreachable) b->add_unreachable_ranks(static_cast<uint32_t>(r));
    }
    // Under muster-agent: the agent relays it on the node's stream.
    absl::Status s = FromGrpcStatus(impl_->SessionStub()->Rendezvous(&ctx, req, &resp));
    if (s.ok() && !FromCurrentEpoch(resp.epoch())) {
      impl_->Refresh();
      return absl::UnavailableError(absl::StrCat("an answer of lease epoch ", resp.epoch(),
                                                 " (epoch ", epoch_.load(), " is current)"));
    }
    if (!s.ok()) return s;
    absl::StatusOr<WorldInfo> answered = WorldOf(resp, step, d);
    if (answered.ok()) w = std::move(*answered);
    return answered.status();
  }));
  MUSTER_RETURN_IF_ERROR(CheckWorld(w, options_.member_id));
  RaiseTo(latest_generation_, w.generation);
  {
    absl::MutexLock lock(&held_mu_);
    held_ = w;
  }
  return w;
}

absl::StatusOr<WorldInfo> CoordinatorClient::WorldOf(const v1::RendezvousResponse& resp,
                                                     int64_t step, absl::Time deadline) {
  if (!resp.has_delta()) return FromProto(resp);
  WorldInfo held;
  {
    absl::MutexLock lock(&held_mu_);
    held = held_;
  }
  absl::StatusOr<WorldInfo> derived = ApplyWorldDelta(held, resp.world(), resp.delta(), step);
  if (absl::IsInvalidArgument(derived.status())) {
    return absl::InternalError(absl::StrCat("the coordinator's delta to generation ",
                                            resp.world().generation(),
                                            " is inconsistent: ", derived.status().message()));
  }
  if (derived.ok()) ++deltas_applied_;
  if (!absl::IsFailedPrecondition(derived.status())) return derived;
  MUSTER_LOG(INFO) << "generation " << resp.world().generation()
                   << " came as a delta this member cannot apply (" << derived.status().message()
                   << "); fetching the whole world";
  absl::StatusOr<WorldInfo> fetched = FetchWorld(resp.world(), deadline);
  // A newer world formed meanwhile: ask again (Retry), to be answered by it.
  if (absl::IsNotFound(fetched.status())) return absl::UnavailableError(fetched.status().message());
  return fetched;
}

absl::StatusOr<WorldInfo> CoordinatorClient::FetchWorld(const v1::World& answered,
                                                        absl::Time deadline) {
  const uint64_t generation = answered.generation();
  std::vector<v1::Assignment> members;
  v1::World world;
  uint32_t next = 0;
  do {
    MUSTER_CONTEXT(ctx, deadline);
    v1::GetWorldRequest req;
    req.set_generation(generation);
    req.set_start_rank(next);
    req.set_max_members(10'000);
    v1::GetWorldResponse resp;
    MUSTER_RETURN_IF_ERROR(FromGrpcStatus(impl_->Stub()->GetWorld(&ctx, req, &resp)));
    if (resp.next_rank() <= next && next < resp.world().world_size()) {
      return absl::InternalError(absl::StrCat("GetWorld's page at rank ", next, " is empty"));
    }
    for (v1::Assignment& a : *resp.mutable_members()) members.push_back(std::move(a));
    world = resp.world();
    next = resp.next_rank();
  } while (next < world.world_size());
  // Pages of another world (another coordinator's, in a failover) are not
  // the one answered: ask again.
  if (world.digest() != answered.digest() || members.size() != world.world_size()) {
    return absl::UnavailableError(absl::StrCat("the world fetched for generation ", generation,
                                               " is not the one answered (digest ",
                                               world.digest(), ", not ", answered.digest(), ")"));
  }
  ++worlds_fetched_;
  return WorldFromMembers(world, members, options_.member_id, options_.incarnation);
}

absl::Status CoordinatorClient::Leave(Departure departure, int64_t step) {
  // A stopping job does not wait long on a coordinator that may be stopping
  // with it (a preempted allocation): it then sees the sessions close.
  const absl::Duration patience =
      departure == Departure::kStopping ? absl::Seconds(2) : absl::Seconds(10);
  return Retry(options_.clock->Now() + patience, [&](absl::Time d) {
    MUSTER_CONTEXT(ctx, d);
    v1::LeaveRequest req;
    *req.mutable_member() = Ref(options_);
    switch (departure) {
      case Departure::kLeaving: req.set_reason(v1::LeaveRequest::GRACEFUL); break;
      case Departure::kFinished: req.set_reason(v1::LeaveRequest::FINISHED); break;
      case Departure::kStopping: req.set_reason(v1::LeaveRequest::STOPPED); break;
    }
    req.set_step(step);
    v1::LeaveResponse resp;
    return FromGrpcStatus(impl_->Stub()->Leave(&ctx, req, &resp));
  });
}

absl::Status CoordinatorClient::KvSet(uint64_t generation, const std::string& key,
                                      const std::string& value, absl::Time deadline) {
  return Retry(deadline, [&](absl::Time d) {
    MUSTER_CONTEXT(ctx, d);
    v1::KvSetRequest req;
    req.set_generation(generation);
    req.set_key(key);
    req.set_value(value);
    v1::KvSetResponse resp;
    return FromGrpcStatus(impl_->Stub()->KvSet(&ctx, req, &resp));
  });
}

absl::StatusOr<std::vector<std::string>> CoordinatorClient::KvWait(
    uint64_t generation, const std::vector<std::string>& keys, absl::Time deadline) {
  v1::KvGetResponse resp;
  MUSTER_RETURN_IF_ERROR(Retry(deadline, [&](absl::Time d) {
    MUSTER_CONTEXT(ctx, d + absl::Seconds(2));
    v1::KvGetRequest req;
    req.set_generation(generation);
    for (const std::string& k : keys) req.add_keys(k);
    req.set_wait_ms(static_cast<uint32_t>(
        std::clamp<int64_t>(absl::ToInt64Milliseconds(Remaining(d, options_.clock)), 1, 600'000)));
    return FromGrpcStatus(impl_->Stub()->KvGet(&ctx, req, &resp));
  }));
  return std::vector<std::string>(resp.values().begin(), resp.values().end());
}

absl::StatusOr<int64_t> CoordinatorClient::KvAdd(uint64_t generation, const std::string& key,
                                                 int64_t delta, absl::Time deadline) {
  v1::KvAddResponse resp;
  MUSTER_RETURN_IF_ERROR(Retry(deadline, [&](absl::Time d) {
    MUSTER_CONTEXT(ctx, d);
    v1::KvAddRequest req;
    req.set_generation(generation);
    req.set_key(key);
    req.set_delta(delta);
    return FromGrpcStatus(impl_->Stub()->KvAdd(&ctx, req, &resp));
  }));
  return resp.value();
}

absl::Status CoordinatorClient::Barrier(uint64_t generation, const std::string& name,
                                        absl::Time deadline) {
  return Retry(deadline, [&](absl::Time d) {
    MUSTER_CONTEXT(ctx, d + absl::Seconds(2));
    v1::BarrierRequest req;
    req.set_generation(generation);
    *req.mutable_member() = Ref(options_);
    req.set_name(name);
    req.set_timeout_ms(static_cast<uint32_t>(
        std::clamp<int64_t>(absl::ToInt64Milliseconds(Remaining(d, options_.clock)), 1, 600'000)));
    v1::BarrierResponse resp;
    return FromGrpcStatus(impl_->Stub()->Barrier(&ctx, req, &resp));
  });
}

absl::StatusOr<uint64_t> CoordinatorClient::BeginCheckpoint(uint64_t generation, int64_t step,
                                                             absl::Time deadline) {
  v1::BeginCheckpointResponse resp;
  MUSTER_RETURN_IF_ERROR(Retry(deadline, [&](absl::Time d) {
    MUSTER_CONTEXT(ctx, d);
    v1::BeginCheckpointRequest req;
    req.set_generation(generation);
    *req.mutable_member() = Ref(options_);
    req.set_step(step);
    return FromGrpcStatus(impl_->Stub()->BeginCheckpoint(&ctx, req, &resp));
  }));
  return resp.checkpoint_id();
}

absl::StatusOr<bool> CoordinatorClient::ReportShard(uint64_t id,
                                                    const std::vector<CatalogFile>& files,
                                                    absl::Time deadline) {
  v1::ReportShardResponse resp;
  MUSTER_RETURN_IF_ERROR(Retry(deadline, [&](absl::Time d) {
    MUSTER_CONTEXT(ctx, d);
    v1::ReportShardRequest req;
    req.set_checkpoint_id(id);
    *req.mutable_member() = Ref(options_);
    for (const CatalogFile& f : files) {
      v1::ShardFile* pf = req.add_files();
      pf->set_path(f.path);
      pf->set_bytes(f.bytes);
      pf->set_checksum(f.xxh3);
    }
    return FromGrpcStatus(impl_->Stub()->ReportShard(&ctx, req, &resp));
  }));
  return resp.committed();
}

absl::Status CoordinatorClient::AbortCheckpoint(uint64_t id, const std::string& reason,
                                                absl::Time deadline) {
  return Retry(deadline, [&](absl::Time d) {
    MUSTER_CONTEXT(ctx, d);
    v1::AbortCheckpointRequest req;
    req.set_checkpoint_id(id);
    *req.mutable_member() = Ref(options_);
    req.set_reason(reason.substr(0, 1000));
    v1::AbortCheckpointResponse resp;
    return FromGrpcStatus(impl_->Stub()->AbortCheckpoint(&ctx, req, &resp));
  });
}

absl::StatusOr<std::vector<CatalogEntry>> CoordinatorClient::ListCommitted(absl::Time deadline) {
  v1::ListCheckpointsResponse resp;
  MUSTER_RETURN_IF_ERROR(Retry(deadline, [&](absl::Time d) {
    MUSTER_CONTEXT(ctx, d);
    return FromGrpcStatus(impl_->Stub()->ListCheckpoints(&ctx, v1::ListCheckpointsRequest(), &resp));
  }));
  std::vector<CatalogEntry> out;
  for (const v1::Checkpoint& c : resp.checkpoints()) {
    if (c.state() != v1::Checkpoint::COMMITTED) continue;
    CatalogEntry e;
    e.id = c.checkpoint_id();
    e.step = c.step();
    for (const v1::ShardFile& f : c.files()) e.files.push_back({f.path(), f.bytes(), f.checksum()});
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace muster
