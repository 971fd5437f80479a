#include "coordinator/grpc_service.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "coordinator/limits.h"
#include "coordinator/proto_convert.h"
#include "coordinator/session_reactor.h"
#include "rpc/credentials.h"
#include "rpc/peer_address.h"
#include "rpc/status.h"

namespace muster {
namespace {

void ToProto(const CheckpointRecord& r, v1::Checkpoint* out) {
  out->set_checkpoint_id(r.id);
  out->set_step(r.step);
  out->set_generation(r.generation);
  out->set_world_size(r.world_size());
  out->set_state(static_cast<v1::Checkpoint::State>(r.state));
  out->set_created_unix_ms(absl::ToUnixMillis(r.created));
  out->set_committed_unix_ms(r.state == CheckpointState::kCommitted ||
                                     r.state == CheckpointState::kRetired
                                 ? absl::ToUnixMillis(r.committed)
                                 : 0);
  out->set_total_bytes(r.total_bytes());
  for (const ShardFileRecord& f : r.files) {
    v1::ShardFile* pf = out->add_files();
    pf->set_path(f.path);
    pf->set_bytes(f.bytes);
    pf->set_checksum(f.checksum);
  }
  out->set_metric_name(r.metric_name);
  out->set_metric_value(r.metric_value);
}

absl::Duration Millis(uint32_t ms) { return absl::Milliseconds(ms); }

}  // namespace

CoordinatorService::CoordinatorService(Coordinator* coordinator, Metrics* metrics,
                                       std::string token, std::function<void()> on_shutdown,
                                       uint64_t epoch)
    : coordinator_(coordinator),
      metrics_(metrics),
      token_(std::move(token)),
      on_shutdown_(std::move(on_shutdown)),
      epoch_(epoch) {}

absl::Duration CoordinatorService::Elapsed(absl::Time start) const {
  return coordinator_->options().clock->Now() - start;
}

grpc::ServerUnaryReactor* CoordinatorService::Reply(grpc::CallbackServerContext* ctx,
                                                    const char* method, absl::Time start,
                                                    const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (metrics_ != nullptr) metrics_->ObserveRpc(method, status.code(), Elapsed(start));
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

// A blocking call. Finished exactly once: by the coordinator's answer
// (Answer) or by the client's cancellation (OnCancel), whichever claims it
// first; gRPC frees the call once it is finished, so a cancelled wait holds
// nothing of it. The claim is shared with the coordinator's completion,
// which may run after the reactor is gone.
class CoordinatorService::Waiting final : public grpc::ServerUnaryReactor {
 public:
  using Claim = std::shared_ptr<std::atomic<bool>>;

  // `counted`: the call holds one of its caller's waits.
  Waiting(CoordinatorService* service, const char* method, absl::Time start, std::string caller,
          bool counted)
      : service_(service),
        method_(method),
        start_(start),
        caller_(std::move(caller)),
        counted_(counted) {}

  const Claim& claim() const { return claim_; }
  // Finished already (refused); the caller returns it as it is.
  bool finished() const { return claim_->load(); }
  // The coordinator's answer: `fill` writes the response, then the call is
  // finished with `status`. Nothing happens once the call was cancelled.
  static void Answer(const Claim& claim, Waiting* call, const absl::Status& status,
                     const std::function<void()>& fill = nullptr) {
    if (claim->exchange(true)) return;
    if (status.ok() && fill) fill();
    call->End(status);
  }
  void End(const absl::Status& status) {
    if (counted_) service_->Released(caller_);
    if (service_->metrics_ != nullptr) {
      service_->metrics_->ObserveRpc(method_, status.code(), service_->Elapsed(start_));
    }
    Finish(ToGrpcStatus(status));
  }
  void OnCancel() override {
    if (!claim_->exchange(true)) End(absl::CancelledError("the client cancelled the call"));
  }
  void OnDone() override { delete this; }

 private:
  CoordinatorService* const service_;
  const char* const method_;
  const absl::Time start_;
  const std::string caller_;
  const bool counted_;
  const Claim claim_ = std::make_shared<std::atomic<bool>>(false);
};

CoordinatorService::Waiting* CoordinatorService::StartWaiting(const char* method, absl::Time start,
                                                              const std::string& caller) {
  const int cap = coordinator_->options().limits.max_waits_per_caller;
  {
    absl::MutexLock lock(&waits_mu_);
    int& n = waits_[caller];
    if (n < cap) {
      ++n;
      return new Waiting(this, method, start, caller, /*counted=*/true);
    }
  }
  auto* refused = new Waiting(this, method, start, caller, /*counted=*/false);
  Waiting::Answer(refused->claim(), refused,
                  absl::ResourceExhaustedError(absl::StrCat(
                      Printable(caller, 200), " already has ", cap,
                      " blocking calls waiting (the coordinator's cap per caller)")));
  return refused;
}

void CoordinatorService::Released(const std::string& caller) {
  absl::MutexLock lock(&waits_mu_);
  auto it = waits_.find(caller);
  if (it != waits_.end() && --it->second <= 0) waits_.erase(it);
}

#define MUSTER_AUTHORIZE(method)                                   \
  const absl::Time start = coordinator_->options().clock->Now();   \
  if (absl::Status auth = CheckToken(*ctx, token_); !auth.ok()) {  \
    return Reply(ctx, method, start, auth);                        \
  }

grpc::ServerUnaryReactor* CoordinatorService::Join(grpc::CallbackServerContext* ctx,
                                                   const v1::JoinRequest* req,
                                                   v1::JoinResponse* resp) {
  MUSTER_AUTHORIZE("Join");
  JoinSpec spec;
  spec.key = ToKey(req->member());
  spec.node = req->node();
  spec.local_rank = req->local_rank();
  spec.spare = req->spare();
  spec.state_address = req->state_address();
  spec.step = req->step();
  // A member that does not know its own address is reached where its call
  // comes from (JoinRequest.state_address).
  const std::string observed = CallerHost(*ctx);
  if (absl::StartsWith(spec.state_address, ":") && !observed.empty()) {
    spec.state_address = JoinHostPort(observed, spec.state_address.substr(1));
  }
  absl::StatusOr<JoinResult> result = coordinator_->Join(spec);
  if (result.ok()) {
    resp->set_observed_host(observed);
    resp->set_heartbeat_interval_ms(
        static_cast<uint32_t>(absl::ToInt64Milliseconds(coordinator_->HeartbeatInterval())));
    resp->set_heartbeat_timeout_ms(static_cast<uint32_t>(
        absl::ToInt64Milliseconds(coordinator_->options().heartbeat_timeout)));
    resp->set_current_generation(result->generation);
    resp->set_reattached(result->reattached);
  }
  return Reply(ctx, "Join", start, result.status());
}

SessionReactor* CoordinatorService::StartSession(SessionCall* call) {
  return new SessionReactor(call, coordinator_, metrics_, CheckToken(*call->context(), token_),
                            epoch_);
}

grpc::ServerUnaryReactor* CoordinatorService::Rendezvous(grpc::CallbackServerContext* ctx,
                                                         const v1::RendezvousRequest* req,
                                                         v1::RendezvousResponse* resp) {
  MUSTER_AUTHORIZE("Rendezvous");
  Waiting* call = StartWaiting("Rendezvous", start, "member " + req->member().member_id());
  if (call->finished()) return call;
  if (req->has_broken()) ReportBroken(coordinator_, *req);
  coordinator_->Rendezvous(
      ToKey(req->member()), req->after_generation(), req->step(), Millis(req->timeout_ms()),
      [resp, call, claim = call->claim(), epoch = epoch_](absl::StatusOr<RendezvousResult> result) {
        Waiting::Answer(claim, call, result.status(), [&] {
          ToProto(*result, resp);
          resp->set_epoch(epoch);
        });
      },
      req->takes_delta());
  return call;
}

grpc::ServerUnaryReactor* CoordinatorService::GetWorld(grpc::CallbackServerContext* ctx,
                                                       const v1::GetWorldRequest* req,
                                                       v1::GetWorldResponse* resp) {
  MUSTER_AUTHORIZE("GetWorld");
  constexpr uint32_t kDefaultPage = 1'000, kMaxPage = 10'000;
  const std::shared_ptr<const World> world = coordinator_->CurrentWorld();
  if (world == nullptr) {
    return Reply(ctx, "GetWorld", start, absl::NotFoundError("no world has formed yet"));
  }
  if (req->generation() != 0 && req->generation() != world->generation) {
    return Reply(ctx, "GetWorld", start,
                 absl::NotFoundError(absl::StrCat("generation ", req->generation(),
                                                  " is not the current one (",
                                                  world->generation, ")")));
  }
  if (req->start_rank() > world->size()) {
    return Reply(ctx, "GetWorld", start,
                 absl::InvalidArgumentError(absl::StrCat("start_rank ", req->start_rank(),
                                                         " is beyond the world's ",
                                                         world->size(), " members")));
  }
  const uint32_t page =
      req->max_members() == 0 ? kDefaultPage : std::min(req->max_members(), kMaxPage);
  const uint32_t end = world->size() - req->start_rank() < page ? world->size()
                                                                 : req->start_rank() + page;
  ToProto(*world, resp->mutable_world());
  for (uint32_t r = req->start_rank(); r < end; ++r) {
    ToProto(world->members[r], resp->add_members());
  }
  resp->set_next_rank(end);
  return Reply(ctx, "GetWorld", start, absl::OkStatus());
}

grpc::ServerUnaryReactor* CoordinatorService::Leave(grpc::CallbackServerContext* ctx,
                                                    const v1::LeaveRequest* req,
                                                    v1::LeaveResponse* /*resp*/) {
  MUSTER_AUTHORIZE("Leave");
  absl::Status s;
  switch (req->reason()) {
    case v1::LeaveRequest::FINISHED:
      s = coordinator_->Leave(ToKey(req->member()), LeaveReason::kFinished, req->step());
      break;
    case v1::LeaveRequest::GRACEFUL:
      s = coordinator_->Leave(ToKey(req->member()), LeaveReason::kGraceful, req->step());
      break;
    case v1::LeaveRequest::STOPPED:
      s = coordinator_->Leave(ToKey(req->member()), LeaveReason::kStopped, req->step());
      break;
    default:
      s = absl::InvalidArgumentError("reason must be FINISHED, GRACEFUL or STOPPED");
  }
  return Reply(ctx, "Leave", start, s);
}

grpc::ServerUnaryReactor* CoordinatorService::Drain(grpc::CallbackServerContext* ctx,
                                                    const v1::DrainRequest* req,
                                                    v1::DrainResponse* resp) {
  MUSTER_AUTHORIZE("Drain");
  absl::StatusOr<uint32_t> n = coordinator_->Drain(req->node());
  if (n.ok()) resp->set_members_drained(*n);
  return Reply(ctx, "Drain", start, n.status());
}

grpc::ServerUnaryReactor* CoordinatorService::KvSet(grpc::CallbackServerContext* ctx,
                                                    const v1::KvSetRequest* req,
                                                    v1::KvSetResponse* /*resp*/) {
  MUSTER_AUTHORIZE("KvSet");
  return Reply(ctx, "KvSet", start,
               coordinator_->KvSet(req->generation(), req->key(), req->value()));
}

grpc::ServerUnaryReactor* CoordinatorService::KvGet(grpc::CallbackServerContext* ctx,
                                                    const v1::KvGetRequest* req,
                                                    v1::KvGetResponse* resp) {
  MUSTER_AUTHORIZE("KvGet");
  Waiting* call = StartWaiting("KvGet", start, "connection " + ctx->peer());
  if (call->finished()) return call;
  std::vector<std::string> keys(req->keys().begin(), req->keys().end());
  coordinator_->KvGet(req->generation(), std::move(keys), Millis(req->wait_ms()),
                      [resp, call, claim = call->claim()](
                          absl::StatusOr<std::vector<std::string>> values) {
                        Waiting::Answer(claim, call, values.status(), [&] {
                          for (std::string& v : *values) resp->add_values(std::move(v));
                        });
                      });
  return call;
}

grpc::ServerUnaryReactor* CoordinatorService::KvAdd(grpc::CallbackServerContext* ctx,
                                                    const v1::KvAddRequest* req,
                                                    v1::KvAddResponse* resp) {
  MUSTER_AUTHORIZE("KvAdd");
  absl::StatusOr<int64_t> v = coordinator_->KvAdd(req->generation(), req->key(), req->delta());
  if (v.ok()) resp->set_value(*v);
  return Reply(ctx, "KvAdd", start, v.status());
}

grpc::ServerUnaryReactor* CoordinatorService::KvCompareAndSet(
    grpc::CallbackServerContext* ctx, const v1::KvCompareAndSetRequest* req,
    v1::KvCompareAndSetResponse* resp) {
  MUSTER_AUTHORIZE("KvCompareAndSet");
  std::optional<std::string> expected;
  if (!req->expect_absent()) expected = req->expected();
  absl::StatusOr<CasResult> r =
      coordinator_->KvCompareAndSet(req->generation(), req->key(), expected, req->desired());
  if (r.ok()) {
    resp->set_swapped(r->swapped);
    resp->set_present(r->current.has_value());
    if (r->current) resp->set_current(*r->current);
  }
  return Reply(ctx, "KvCompareAndSet", start, r.status());
}

grpc::ServerUnaryReactor* CoordinatorService::Barrier(grpc::CallbackServerContext* ctx,
                                                      const v1::BarrierRequest* req,
                                                      v1::BarrierResponse* /*resp*/) {
  MUSTER_AUTHORIZE("Barrier");
  Waiting* call = StartWaiting("Barrier", start, "member " + req->member().member_id());
  if (call->finished()) return call;
  coordinator_->Barrier(req->generation(), ToKey(req->member()), req->name(),
                        Millis(req->timeout_ms()),
                        [call, claim = call->claim()](absl::Status s) {
                          Waiting::Answer(claim, call, s);
                        });
  return call;
}

grpc::ServerUnaryReactor* CoordinatorService::BeginCheckpoint(
    grpc::CallbackServerContext* ctx, const v1::BeginCheckpointRequest* req,
    v1::BeginCheckpointResponse* resp) {
  MUSTER_AUTHORIZE("BeginCheckpoint");
  absl::StatusOr<uint64_t> id =
      coordinator_->BeginCheckpoint(req->generation(), ToKey(req->member()), req->step());
  if (id.ok()) resp->set_checkpoint_id(*id);
  return Reply(ctx, "BeginCheckpoint", start, id.status());
}

grpc::ServerUnaryReactor* CoordinatorService::ReportShard(grpc::CallbackServerContext* ctx,
                                                          const v1::ReportShardRequest* req,
                                                          v1::ReportShardResponse* resp) {
  MUSTER_AUTHORIZE("ReportShard");
  ShardReport report;
  for (const v1::ShardFile& f : req->files()) {
    report.files.push_back(ShardFileRecord{"", f.path(), f.bytes(), f.checksum()});
  }
  report.metric_name = req->metric_name();
  report.metric_value = req->metric_value();
  if (!std::isfinite(report.metric_value)) {
    return Reply(ctx, "ReportShard", start,
                 absl::InvalidArgumentError(absl::StrCat("metric_value is not a finite number (",
                                                         report.metric_value, ")")));
  }
  absl::StatusOr<bool> committed =
      coordinator_->ReportShard(req->checkpoint_id(), ToKey(req->member()), std::move(report));
  if (committed.ok()) resp->set_committed(*committed);
  return Reply(ctx, "ReportShard", start, committed.status());
}

grpc::ServerUnaryReactor* CoordinatorService::AbortCheckpoint(
    grpc::CallbackServerContext* ctx, const v1::AbortCheckpointRequest* req,
    v1::AbortCheckpointResponse* /*resp*/) {
  MUSTER_AUTHORIZE("AbortCheckpoint");
  return Reply(ctx, "AbortCheckpoint", start,
               coordinator_->AbortCheckpoint(req->checkpoint_id(), ToKey(req->member()),
                                             req->reason()));
}

grpc::ServerUnaryReactor* CoordinatorService::ListCheckpoints(
    grpc::CallbackServerContext* ctx, const v1::ListCheckpointsRequest* req,
    v1::ListCheckpointsResponse* resp) {
  MUSTER_AUTHORIZE("ListCheckpoints");
  for (const CheckpointRecord& r : coordinator_->ListCheckpoints(req->include_all())) {
    ToProto(r, resp->add_checkpoints());
  }
  return Reply(ctx, "ListCheckpoints", start, absl::OkStatus());
}

grpc::ServerUnaryReactor* CoordinatorService::GetStatus(grpc::CallbackServerContext* ctx,
                                                        const v1::GetStatusRequest* /*req*/,
                                                        v1::GetStatusResponse* resp) {
  MUSTER_AUTHORIZE("GetStatus");
  StatusSnapshot s = coordinator_->GetStatus();
  resp->set_job_state(JobStateName(s.job_state));
  resp->set_generation(s.generation);
  resp->set_world_size(s.world_size);
  resp->set_committed_checkpoints(static_cast<uint32_t>(s.committed_checkpoints));
  resp->set_latest_committed_step(s.latest_committed_step);
  resp->set_min_members(s.rules.min_members);
  resp->set_max_members(s.rules.max_members);
  resp->set_uptime_ms(absl::ToInt64Milliseconds(s.uptime));
  for (const MemberRow& row : s.members) {
    v1::MemberStatus* m = resp->add_members();
    ToProto(row.info.key, m->mutable_member());
    m->set_node(row.info.node);
    m->set_local_rank(row.info.local_rank);
    m->set_state(row.spare ? "spare" : MemberStateName(row.info.state));
    m->set_rank(row.rank);
    m->set_step(row.info.step);
    m->set_heartbeat_age_ms(absl::ToInt64Milliseconds(s.now - row.info.last_seen));
    m->set_state_address(row.info.state_address);
  }
  return Reply(ctx, "GetStatus", start, absl::OkStatus());
}

grpc::ServerUnaryReactor* CoordinatorService::ListEvents(grpc::CallbackServerContext* ctx,
                                                         const v1::ListEventsRequest* req,
                                                         v1::ListEventsResponse* resp) {
  MUSTER_AUTHORIZE("ListEvents");
  constexpr uint32_t kDefault = 1'000, kMax = 10'000;
  const uint32_t limit = req->limit() == 0 ? kDefault : std::min(req->limit(), kMax);
  absl::StatusOr<std::vector<JobEvent>> events = coordinator_->RecentEvents(limit);
  if (!events.ok()) return Reply(ctx, "ListEvents", start, events.status());
  for (const JobEvent& e : *events) {
    const int64_t ms = absl::ToUnixMillis(e.time);
    if (ms < req->since_unix_ms()) continue;
    v1::Event* out = resp->add_events();
    out->set_unix_ms(ms);
    out->set_kind(e.kind);
    out->set_detail(e.detail);
  }
  return Reply(ctx, "ListEvents", start, absl::OkStatus());
}

grpc::ServerUnaryReactor* CoordinatorService::Shutdown(grpc::CallbackServerContext* ctx,
                                                       const v1::ShutdownRequest* req,
                                                       v1::ShutdownResponse* /*resp*/) {
  MUSTER_AUTHORIZE("Shutdown");
  if (absl::Status bad = CheckOptional("reason", req->reason(), 1024); !bad.ok()) {
    return Reply(ctx, "Shutdown", start, bad);
  }
  // The job stops either way; the caller hears whether its state got to
  // disk (a restart on this state dir then repeats what did not).
  const absl::Status flushed = coordinator_->Shutdown(
      req->reason().empty() ? "shutdown requested" : req->reason().substr(0, 1024));
  grpc::ServerUnaryReactor* reactor = Reply(ctx, "Shutdown", start, flushed);
  if (on_shutdown_) on_shutdown_();
  return reactor;
}

}  // namespace muster
