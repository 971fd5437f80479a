#include "tests/fuzz/coordinator_harness.h"

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "rpc/credentials.h"

namespace muster::fuzz {
namespace {

// Inputs served by one gRPC server before it is replaced (which frees the
// coordinators retired meanwhile).
constexpr uint64_t kRecycleEvery = 128;
// How long the harness waits for something that should take microseconds.
constexpr absl::Duration kHang = absl::Seconds(10);
// The sequence number of the heartbeat that confirms a new session.
constexpr uint64_t kSentinelSequence = ~uint64_t{0};

bool Authorized(Auth auth) { return auth == Auth::kToken || auth == Auth::kToken2; }

const char* AuthName(Auth auth) {
  switch (auth) {
    case Auth::kToken:
    case Auth::kToken2: return "the job token";
    case Auth::kWrongToken: return "a wrong token";
    case Auth::kNoToken: return "no token";
  }
  return "?";
}

// Codes an rpc may answer to a caller with the token.
bool ExpectedCode(grpc::StatusCode code, bool blocks) {
  switch (code) {
    case grpc::StatusCode::OK:
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::NOT_FOUND:
    case grpc::StatusCode::ALREADY_EXISTS:
    case grpc::StatusCode::PERMISSION_DENIED:
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::ABORTED:
    case grpc::StatusCode::OUT_OF_RANGE:
    case grpc::StatusCode::UNAVAILABLE:
      return true;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return blocks;
    default:
      return false;
  }
}

}  // namespace

void Fail(const std::string& what) {
  std::fprintf(stderr, "\n==== coordinator_fuzz: invariant violated ====\n%s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

// Dispatches every rpc but Shutdown to the current input's service, and
// counts the handler invocations that returned. Session is served on a
// completion queue, as the coordinator serves it (rpc/async_bidi.h).
class CoordinatorHarness::Forwarder final : public CoordinatorServiceBase {
 public:
  explicit Forwarder(CoordinatorHarness* harness) : h_(harness) {}

#define MUSTER_FUZZ_FORWARD(Method)                                                  \
  grpc::ServerUnaryReactor* Method(grpc::CallbackServerContext* ctx,                 \
                                   const v1::Method##Request* req,                   \
                                   v1::Method##Response* resp) override {            \
    return Counted(h_->instance_->service->Method(ctx, req, resp));                  \
  }
  MUSTER_FUZZ_FORWARD(Join)
  MUSTER_FUZZ_FORWARD(Rendezvous)
  MUSTER_FUZZ_FORWARD(Leave)
  MUSTER_FUZZ_FORWARD(Drain)
  MUSTER_FUZZ_FORWARD(KvSet)
  MUSTER_FUZZ_FORWARD(KvGet)
  MUSTER_FUZZ_FORWARD(KvAdd)
  MUSTER_FUZZ_FORWARD(KvCompareAndSet)
  MUSTER_FUZZ_FORWARD(Barrier)
  MUSTER_FUZZ_FORWARD(BeginCheckpoint)
  MUSTER_FUZZ_FORWARD(ReportShard)
  MUSTER_FUZZ_FORWARD(AbortCheckpoint)
  MUSTER_FUZZ_FORWARD(ListCheckpoints)
  MUSTER_FUZZ_FORWARD(GetStatus)
  MUSTER_FUZZ_FORWARD(GetWorld)
#undef MUSTER_FUZZ_FORWARD

  SessionReactor* StartSession(SessionCall* call) {
    return Counted(h_->instance_->service->StartSession(call));
  }

 private:
  template <typename T>
  T* Counted(T* reactor) {
    absl::MutexLock lock(&h_->mu_);
    ++h_->handled_;
    return reactor;
  }

  CoordinatorHarness* const h_;
};

CoordinatorHarness& CoordinatorHarness::Get() {
  static CoordinatorHarness* harness = new CoordinatorHarness();
  return *harness;
}

CoordinatorHarness::CoordinatorHarness() : trace_(std::getenv("MUSTER_FUZZ_TRACE") != nullptr) {
  auto metrics = Metrics::Create("");
  if (!metrics.ok()) Fail(absl::StrCat("Metrics::Create: ", metrics.status().ToString()));
  metrics_ = metrics->release();
  StartServer();
}

void CoordinatorHarness::StartServer() {
  forwarder_ = std::make_unique<Forwarder>(this);
  grpc::ServerBuilder builder;
  builder.RegisterService(forwarder_.get());
  builder.SetMaxReceiveMessageSize(4 << 20);
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> queues;
  queues.push_back(builder.AddCompletionQueue());
  Forwarder* forwarder = forwarder_.get();
  session_queues_ = std::make_unique<AsyncBidiServer<v1::SessionRequest, v1::SessionEvent>>(
      std::move(queues),
      [forwarder](grpc::ServerContext* ctx, SessionCall::Stream* stream,
                  grpc::ServerCompletionQueue* queue, void* tag) {
        forwarder->RequestSession(ctx, stream, queue, queue, tag);
      },
      [forwarder](SessionCall* call) { return forwarder->StartSession(call); });
  server_ = builder.BuildAndStart();
  if (server_ == nullptr) Fail("cannot start the in-process gRPC server");
  session_queues_->Start();
  channel_ = server_->InProcessChannel(grpc::ChannelArguments());
  stub_ = v1::Coordinator::NewStub(channel_);
}

void CoordinatorHarness::RecycleServer() {
  stub_.reset();
  channel_.reset();
  // Waits for every reactor, so the retired coordinators are unreferenced.
  server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  session_queues_->Shutdown();
  server_.reset();
  session_queues_.reset();
  forwarder_.reset();
  retired_.clear();
  StartServer();
}

std::unique_ptr<CoordinatorHarness::Instance> CoordinatorHarness::NewInstance(
    std::shared_ptr<FakeClock> clock, std::shared_ptr<StateStore> store) {
  auto instance = std::make_unique<Instance>();
  instance->clock = std::move(clock);
  instance->store = std::move(store);
  CoordinatorOptions options = options_;
  options.clock = instance->clock.get();
  auto coordinator = Coordinator::Create(options, instance->store.get());
  if (!coordinator.ok()) return nullptr;
  instance->coordinator = *std::move(coordinator);
  instance->service = std::make_unique<CoordinatorService>(
      instance->coordinator.get(), metrics_, kJobToken, /*on_shutdown=*/[] {});
  return instance;
}

bool CoordinatorHarness::Begin(CoordinatorOptions options) {
  options_ = std::move(options);
  generation_ = 0;
  auto store = OpenSqliteStateStore(":memory:");
  if (!store.ok()) Fail(absl::StrCat("OpenSqliteStateStore: ", store.status().ToString()));
  instance_ = NewInstance(std::make_shared<FakeClock>(), std::shared_ptr<StateStore>(
                                                             std::move(*store)));
  return instance_ != nullptr;
}

void CoordinatorHarness::End() {
  // GetStatus must still answer, whatever the input did.
  Unary("GetStatus", &Stub::async::GetStatus, v1::GetStatusRequest(), Auth::kToken,
        /*blocks=*/false);
  const PendingCall& status_call = *calls_.back();
  if (!status_call.status.ok()) {
    Fail(absl::StrCat("GetStatus failed at the end of the input: ",
                      status_call.status.error_message()));
  }
  Retire();
  calls_.clear();
  if (++inputs_ % kRecycleEvery == 0) RecycleServer();
}

void CoordinatorHarness::Restart() {
  if (trace_) std::fprintf(stderr, "[trace] Restart\n");
  std::shared_ptr<FakeClock> clock = instance_->clock;
  std::shared_ptr<StateStore> store = instance_->store;
  Retire();
  instance_ = NewInstance(std::move(clock), std::move(store));
  if (instance_ == nullptr) Fail("a coordinator cannot start on the state its predecessor left");
}

void CoordinatorHarness::Retire() {
  if (absl::Status s = instance_->coordinator->Shutdown("fuzz input done"); !s.ok()) {
    Fail("shutdown did not get the state to disk: " + s.ToString());
  }
  for (ClientSession& s : sessions_) FinishSession(&s, Auth::kToken);
  sessions_.clear();
  for (const auto& call : calls_) WaitDone(call.get());
  {
    absl::MutexLock lock(&mu_);
    auto all_handled = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return handled_ == expected_;
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&all_handled), kHang)) {
      Fail("a call never reached the service");
    }
  }
  retired_.push_back(std::move(instance_));
}

void CoordinatorHarness::AfterOp() {
  const StatusSnapshot s = coordinator()->GetStatus();
  if (s.generation < generation_) {
    Fail(absl::StrCat("the generation went back from ", generation_, " to ", s.generation));
  }
  if (s.world_size > 0 && s.generation == 0) {
    Fail(absl::StrCat("a world of ", s.world_size, " members has generation 0 (",
                      JobStateName(s.job_state), ")"));
  }
  generation_ = s.generation;
}

void CoordinatorHarness::Tick(absl::Duration d) {
  if (trace_) std::fprintf(stderr, "[trace] Tick +%s\n", absl::FormatDuration(d).c_str());
  instance_->clock->Advance(d);
  instance_->coordinator->Tick();
}

std::string CoordinatorHarness::StateFingerprint() {
  Coordinator* c = coordinator();
  StatusSnapshot s = c->GetStatus();
  std::string out = absl::StrCat("job ", JobStateName(s.job_state), " generation ", s.generation,
                                 " world ", s.world_size, " committed ", s.committed_checkpoints,
                                 " latest ", s.latest_committed_step, "\n");
  for (const MemberRow& row : s.members) {
    const MemberInfo& m = row.info;
    absl::StrAppend(&out, "member ", m.key.id, "/", m.key.incarnation, " node ", m.node, " local ",
                    m.local_rank, " ", MemberStateName(m.state), " rank ", row.rank, " step ",
                    m.step, " seen ", absl::FormatTime(m.last_seen), " session ", m.session,
                    " address ", m.state_address, " reason ", m.reason, "\n");
  }
  for (const CheckpointRecord& r : c->ListCheckpoints(/*all=*/true)) {
    absl::StrAppend(&out, "checkpoint ", r.id, " step ", r.step, " generation ", r.generation, " ",
                    CheckpointStateName(r.state), " reported ", r.reported.size(), " files ",
                    r.files.size(), " bytes ", r.total_bytes(), " metric ", r.metric_name, "=",
                    r.metric_value, "\n");
  }
  CoordinatorCounters counters = c->Counters();
  absl::StrAppend(&out, "regroups ", counters.regroups, " failures ", counters.failures,
                  " sessions ", counters.open_sessions, "\n");
  return out;
}

void CoordinatorHarness::Authenticate(grpc::ClientContext* context, Auth auth) {
  switch (auth) {
    case Auth::kToken:
    case Auth::kToken2: AttachToken(context, kJobToken); break;
    case Auth::kWrongToken: AttachToken(context, kWrongToken); break;
    case Auth::kNoToken: break;
  }
}

void CoordinatorHarness::CheckStatus(const char* name, Auth auth, bool blocks,
                                     const grpc::Status& status, const std::string& request) {
  const bool ok = Authorized(auth) ? ExpectedCode(status.error_code(), blocks)
                                   : status.error_code() == grpc::StatusCode::UNAUTHENTICATED;
  if (!ok) {
    Fail(absl::StrCat(name, " with ", AuthName(auth), " answered code ", status.error_code(),
                      ": ", status.error_message(), "\nrequest: ", request));
  }
}

void CoordinatorHarness::Trace(const char* name, Auth auth, const std::string& request,
                               const grpc::Status& status) {
  std::fprintf(stderr, "[trace] %s (%s) {%s} -> %d %s\n", name, AuthName(auth), request.c_str(),
               static_cast<int>(status.error_code()), status.error_message().c_str());
}

uint64_t CoordinatorHarness::Expect() {
  absl::MutexLock lock(&mu_);
  return ++expected_;
}

void CoordinatorHarness::WaitHandled(uint64_t ticket, const char* name) {
  absl::MutexLock lock(&mu_);
  auto handled = [this, ticket]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return handled_ >= ticket;
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&handled), kHang)) {
    Fail(absl::StrCat(name, ": the service did not handle the call"));
  }
}

void CoordinatorHarness::WaitDone(PendingCall* call) {
  absl::MutexLock lock(&mu_);
  if (!mu_.AwaitWithTimeout(absl::Condition(&call->done), kHang)) {
    Fail(absl::StrCat(call->name, " never completed"));
  }
}

void CoordinatorHarness::MarkDone(PendingCall* call) {
  absl::MutexLock lock(&mu_);
  call->done = true;
}

// ---------------------------------------------------------------- sessions

void CoordinatorHarness::OpenSession(const std::vector<v1::SessionRequest>& messages, Auth auth) {
  const std::string before = Authorized(auth) ? std::string() : StateFingerprint();
  ClientSession session;
  session.context = std::make_unique<grpc::ClientContext>();
  // Within libFuzzer's -timeout: a stream the server never ends fails
  // FinishSession's check with DEADLINE_EXCEEDED, naming the session.
  session.context->set_deadline(absl::ToChronoTime(absl::Now() + kHang));
  Authenticate(session.context.get(), auth);
  const uint64_t ticket = Expect();
  session.stream = stub_->Session(session.context.get());
  WaitHandled(ticket, "Session");

  // A hello followed by heartbeats keeps the session open; anything else is
  // a protocol error that the server answers by ending the stream.
  bool stays_open = !messages.empty() && messages[0].has_hello();
  int heartbeats = 0;
  for (size_t i = 1; i < messages.size() && stays_open; ++i) {
    if (messages[i].has_heartbeat()) {
      ++heartbeats;
    } else {
      stays_open = false;
    }
  }
  for (const v1::SessionRequest& m : messages) {
    if (!session.stream->Write(m)) break;
  }
  if (stays_open) {
    // Acknowledged only once the server handled everything before it.
    v1::SessionRequest sentinel;
    sentinel.mutable_heartbeat()->set_step(-1);
    sentinel.mutable_heartbeat()->set_sequence(kSentinelSequence);
    session.stream->Write(sentinel);
    ++heartbeats;
  }
  if (!stays_open) {
    // A node session (node_hello, then attach, rendezvous, ...) stays open
    // until its node closes it, as the agent does; the server must end any
    // other.
    if (!messages.empty() && messages[0].has_node_hello()) session.stream->WritesDone();
    FinishSession(&session, auth);
  } else if (!ReadAcks(&session, heartbeats)) {
    FinishSession(&session, auth);
  } else if (sessions_.size() >= kMaxSessions) {
    session.stream->WritesDone();
    FinishSession(&session, auth);
  } else {
    if (trace_) std::fprintf(stderr, "[trace] Session open (%zu)\n", sessions_.size());
    sessions_.push_back(std::move(session));
  }
  if (!Authorized(auth) && StateFingerprint() != before) {
    Fail("Session without the right token changed the coordinator's state\nbefore:\n" + before +
         "\nafter:\n" + StateFingerprint());
  }
}

void CoordinatorHarness::SessionHeartbeat(size_t index, int64_t step, uint64_t sequence) {
  if (sessions_.empty()) return;
  index %= sessions_.size();
  ClientSession& s = sessions_[index];
  v1::SessionRequest beat;
  beat.mutable_heartbeat()->set_step(step);
  beat.mutable_heartbeat()->set_sequence(sequence);
  if (!s.stream->Write(beat) || !ReadAcks(&s, 1)) {
    FinishSession(&s, Auth::kToken);
    sessions_.erase(sessions_.begin() + static_cast<std::ptrdiff_t>(index));
  }
}

void CoordinatorHarness::CloseSession(size_t index) {
  if (sessions_.empty()) return;
  index %= sessions_.size();
  sessions_[index].stream->WritesDone();
  FinishSession(&sessions_[index], Auth::kToken);
  sessions_.erase(sessions_.begin() + static_cast<std::ptrdiff_t>(index));
}

bool CoordinatorHarness::ReadAcks(ClientSession* session, int acks) {
  v1::SessionEvent event;
  while (acks > 0) {
    if (!session->stream->Read(&event)) return false;
    if (event.has_ack()) --acks;
  }
  return true;
}

void CoordinatorHarness::FinishSession(ClientSession* session, Auth auth) {
  v1::SessionEvent event;
  while (session->stream->Read(&event)) {
  }
  grpc::Status status = session->stream->Finish();
  if (trace_) Trace("Session", auth, "(ended)", status);
  CheckStatus("Session", auth, /*blocks=*/false, status, "(stream)");
}

}  // namespace muster::fuzz
