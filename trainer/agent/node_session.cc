#include "trainer/agent/node_session.h"

#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "muster/v1/coordinator.grpc.pb.h"
#include "rpc/agent_protocol.h"
#include "rpc/coordinator_channel.h"
#include "rpc/credentials.h"
#include "rpc/status.h"
#include "rpc/write_queue.h"
#include "trainer/agent/supervisor.h"

namespace muster {
namespace {

using Queue = WriteQueue<v1::SessionRequest, v1::SessionEvent>;
using Upstream = grpc::ClientReaderWriter<v1::SessionRequest, v1::SessionEvent>;

// How a child that has ended (and is not reaped yet) ended, or "" when it
// has not ended or is not our child.
std::string EndedChild(pid_t pid) {
  if (pid <= 0) return "";
  siginfo_t info;
  std::memset(&info, 0, sizeof(info));
  if (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0 ||
      info.si_pid != pid) {
    return "";
  }
  const bool signaled = info.si_code != CLD_EXITED;
  return ProcessEnd{signaled, info.si_status}.Describe();
}

class NodeSessionImpl;

// One trainer's stream to the agent. Deletes itself when gRPC is done with
// it; the queue it writes through is shared with the relay's table and
// ignores writes once closed.
class LocalSession : public grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionEvent> {
 public:
  LocalSession(NodeSessionImpl* relay, const absl::Status& auth, pid_t pid);
  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override { out_->WriteDone(ok); }
  void OnDone() override { delete this; }

 private:
  NodeSessionImpl* const relay_;
  const pid_t pid_;
  const std::shared_ptr<Queue> out_;
  v1::SessionRequest request_;
  // Touched only from OnReadDone, which gRPC never runs concurrently with
  // itself.
  std::string member_;  // "" until hello
  uint64_t incarnation_ = 0;
};

// One trainer's Rendezvous, relayed as a NodeRendezvous on the node stream.
// Finished exactly once, by whoever takes it out of the relay's table: the
// answer, the node stream breaking, or the trainer cancelling. Deletes
// itself when gRPC is done with it.
class RelayedRendezvous : public grpc::ServerUnaryReactor {
 public:
  RelayedRendezvous(NodeSessionImpl* relay, v1::RendezvousResponse* response)
      : relay_(relay), response_(response) {}
  void Start(const absl::Status& auth, const v1::RendezvousRequest& request);
  // The coordinator's answer.
  void Answer(const v1::RendezvousAnswer& answer);
  void Fail(const absl::Status& status) { Finish(ToGrpcStatus(status)); }
  void OnCancel() override;
  void OnDone() override { delete this; }

 private:
  NodeSessionImpl* const relay_;
  v1::RendezvousResponse* const response_;
  // Set once relayed; with cancelled_, whichever of Start and OnCancel
  // comes second sees the other's write.
  std::atomic<uint64_t> call_{0};
  std::atomic<bool> cancelled_{false};
};

class NodeSessionImpl final : public NodeSession,
                              public v1::Coordinator::CallbackService {
 public:
  explicit NodeSessionImpl(NodeSessionOptions o) : o_(std::move(o)) {}
  ~NodeSessionImpl() override;

  absl::Status Init();
  std::string address() const override { return "unix:" + socket_; }
  void ProcessEnded(pid_t pid, const std::string& how) override;

  // --- for LocalSession ---
  // Attaches a trainer's member; errors close its stream.
  absl::Status Attach(const v1::MemberRef& member, pid_t pid, std::shared_ptr<Queue> out);
  // A trainer's heartbeat: records the step, acknowledges it.
  void LocalBeat(const std::string& member, uint64_t incarnation, const v1::Heartbeat& beat,
                 Queue* out);
  // A trainer's stream ended (its read side): detach, unless already gone.
  void LocalEnded(const std::string& member, uint64_t incarnation, pid_t pid);

  grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionEvent>* Session(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* Rendezvous(grpc::CallbackServerContext* ctx,
                                       const v1::RendezvousRequest* request,
                                       v1::RendezvousResponse* response) override;

  // --- for RelayedRendezvous ---
  // Queues `request` on the node stream under a new call number; while the
  // stream is down the call waits for the next connection.
  uint64_t Relay(RelayedRendezvous* call, const v1::RendezvousRequest& request);
  // Takes `call` out of the table; false when it was already taken.
  bool Forget(uint64_t call);

 private:
  struct Member {
    uint64_t incarnation = 0;
    pid_t pid = 0;
    std::shared_ptr<Queue> out;
    int64_t step = 0;
    int64_t samples = 0;
    uint32_t stalled_ms = 0;  // as of last_beat
    absl::Time last_beat;
    // Whether its attach went out on the current connection; a member that
    // attached while the node stream was down waits for the next one.
    bool attached = false;
  };
  struct Call {
    RelayedRendezvous* call = nullptr;
    // Relayed on the current connection, or waiting for the next one with
    // its request.
    bool sent = false;
    v1::SessionRequest parked;
  };

  // Connects, relays, and reconnects with backoff until the destructor.
  void ConnectLoop();
  // One connection's life; returns how it ended.
  absl::Status Connection();
  // Writes queued requests and the periodic heartbeat until the
  // connection ends.
  void WriteLoop(Upstream* stream);
  void Route(v1::SessionEvent event);
  // Removes `id` from the table and queues its detach; returns its stream,
  // for the caller to close once mu_ is released (gRPC may run a reactor's
  // callbacks inline, and they take mu_).
  std::shared_ptr<Queue> DetachLocked(const std::string& id, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Send(v1::SessionRequest request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // On a new connection: the attaches and calls that waited for it.
  void SendParkedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after Init.
  const NodeSessionOptions o_;
  std::string dir_, socket_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<CoordinatorChannel> coordinator_;
  std::thread thread_;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // The live connection's context (to cancel it), and whether it is up.
  grpc::ClientContext* ctx_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool connected_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<v1::SessionRequest> outgoing_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Member> members_ ABSL_GUARDED_BY(mu_);
  // Trainers' Rendezvous calls waiting for their answer, by call number.
  std::map<uint64_t, Call> rendezvous_ ABSL_GUARDED_BY(mu_);
  uint64_t last_call_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  // The newest lease epoch heard on the live connection (SessionEvent.epoch):
  // events of an older one come from a coordinator fenced by a takeover and
  // are dropped. The trainers rely on this filter. Each connection starts
  // afresh: it goes where the address file points, and a coordinator
  // restarted on a new state dir counts epochs from 1 again.
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  // When the coordinator last sent anything on the live connection.
  absl::Time last_heard_ ABSL_GUARDED_BY(mu_);
  absl::Duration interval_ ABSL_GUARDED_BY(mu_) = absl::Seconds(1);
};

LocalSession::LocalSession(NodeSessionImpl* relay, const absl::Status& auth, pid_t pid)
    : relay_(relay), pid_(pid), out_(std::make_shared<Queue>(this)) {
  if (!auth.ok()) {
    out_->Close(auth);
    return;
  }
  StartRead(&request_);
}

void LocalSession::OnReadDone(bool ok) {
  if (!ok) {
    if (!member_.empty()) relay_->LocalEnded(member_, incarnation_, pid_);
    out_->Close(absl::OkStatus());
    return;
  }
  if (member_.empty()) {
    if (!request_.has_hello()) {
      out_->Close(absl::FailedPreconditionError("the first message of a session must be hello"));
      return;
    }
    if (absl::Status s = relay_->Attach(request_.hello(), pid_, out_); !s.ok()) {
      out_->Close(s);
      return;
    }
    member_ = request_.hello().member_id();
    incarnation_ = request_.hello().incarnation();
  } else if (request_.has_heartbeat()) {
    relay_->LocalBeat(member_, incarnation_, request_.heartbeat(), out_.get());
  } else {
    relay_->LocalEnded(member_, incarnation_, pid_);
    out_->Close(absl::InvalidArgumentError("only heartbeats may follow hello"));
    return;
  }
  StartRead(&request_);
}

void RelayedRendezvous::Start(const absl::Status& auth, const v1::RendezvousRequest& request) {
  if (!auth.ok()) {
    Fail(auth);
    return;
  }
  const uint64_t call = relay_->Relay(this, request);
  call_ = call;
  if (cancelled_ && relay_->Forget(call)) Fail(absl::CancelledError("the trainer cancelled"));
}

void RelayedRendezvous::Answer(const v1::RendezvousAnswer& answer) {
  const absl::Status status(static_cast<absl::StatusCode>(answer.code()), answer.message());
  if (status.ok()) *response_ = answer.response();
  Fail(status);
}

void RelayedRendezvous::OnCancel() {
  // The coordinator's waiter stays until the world forms or its timeout;
  // the answer then finds no call and is dropped.
  cancelled_ = true;
  const uint64_t call = call_;
  if (call != 0 && relay_->Forget(call)) Fail(absl::CancelledError("the trainer cancelled"));
}

absl::Status NodeSessionImpl::Init() {
  if (o_.coordinator.empty() || o_.node.empty()) {
    return absl::InvalidArgumentError("a node session needs the coordinator and the node");
  }
  std::string tmpl = o_.runtime_dir + "/muster-agent.XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) {  // 0700
    return absl::InternalError(absl::StrCat("cannot make a directory under ", o_.runtime_dir,
                                            ": ", std::strerror(errno)));
  }
  dir_ = tmpl;
  socket_ = dir_ + "/session.sock";
  if (socket_.size() >= sizeof(sockaddr_un{}.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the agent's socket path ", socket_, " is too long for a Unix socket; set TMPDIR to a "
        "shorter directory"));
  }
  MUSTER_ASSIGN_OR_RETURN(coordinator_, CoordinatorChannel::Create(o_.coordinator, o_.tls));
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address(), grpc::InsecureServerCredentials());
  builder.RegisterService(this);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr) {
    return absl::InternalError(absl::StrCat("cannot serve trainers on ", address()));
  }
  thread_ = std::thread([this] { ConnectLoop(); });
  MUSTER_LOG(INFO) << "muster-agent: node " << o_.node << ": one session with "
                   << o_.coordinator << " for this node's trainers, which reach it on "
                   << address();
  return absl::OkStatus();
}

NodeSessionImpl::~NodeSessionImpl() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    if (ctx_ != nullptr) ctx_->TryCancel();
  }
  if (thread_.joinable()) thread_.join();
  if (server_ != nullptr) server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  if (!socket_.empty()) ::unlink(socket_.c_str());
  if (!dir_.empty()) ::rmdir(dir_.c_str());
}

grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionEvent>* NodeSessionImpl::Session(
    grpc::CallbackServerContext* ctx) {
  pid_t pid = 0;
  auto it = ctx->client_metadata().find(kTrainerPidMetadata);
  if (it != ctx->client_metadata().end()) {
    int value = 0;
    if (absl::SimpleAtoi(absl::string_view(it->second.data(), it->second.size()), &value)) {
      pid = value;
    }
  }
  return new LocalSession(this, CheckToken(*ctx, o_.token), pid);
}

grpc::ServerUnaryReactor* NodeSessionImpl::Rendezvous(grpc::CallbackServerContext* ctx,
                                                      const v1::RendezvousRequest* request,
                                                      v1::RendezvousResponse* response) {
  auto* call = new RelayedRendezvous(this, response);
  call->Start(CheckToken(*ctx, o_.token), *request);
  return call;
}

uint64_t NodeSessionImpl::Relay(RelayedRendezvous* call, const v1::RendezvousRequest& request) {
  absl::MutexLock lock(&mu_);
  const uint64_t n = ++last_call_;
  v1::SessionRequest relayed;
  relayed.mutable_rendezvous()->set_call(n);
  *relayed.mutable_rendezvous()->mutable_request() = request;
  Call& entry = rendezvous_[n];
  entry.call = call;
  if (connected_) {
    entry.sent = true;
    Send(std::move(relayed));
  } else {
    entry.parked = std::move(relayed);
  }
  return n;
}

bool NodeSessionImpl::Forget(uint64_t call) {
  absl::MutexLock lock(&mu_);
  return rendezvous_.erase(call) > 0;
}

void NodeSessionImpl::Send(v1::SessionRequest request) { outgoing_.push_back(std::move(request)); }

void NodeSessionImpl::SendParkedLocked() {
  // Attaches first: the coordinator then knows each session before the
  // calls of its member.
  for (auto& [id, m] : members_) {
    if (m.attached) continue;
    m.attached = true;
    v1::SessionRequest attach;
    attach.mutable_attach()->set_member_id(id);
    attach.mutable_attach()->set_incarnation(m.incarnation);
    Send(std::move(attach));
  }
  for (auto& [n, c] : rendezvous_) {
    if (c.sent) continue;
    c.sent = true;
    Send(std::move(c.parked));
    c.parked.Clear();
  }
}

absl::Status NodeSessionImpl::Attach(const v1::MemberRef& member, pid_t pid,
                                     std::shared_ptr<Queue> out) {
  std::shared_ptr<Queue> superseded;
  {
    absl::MutexLock lock(&mu_);
    auto it = members_.find(member.member_id());
    // The coordinator closes the older session; so does the agent.
    if (it != members_.end()) superseded = std::move(it->second.out);
    // In the node heartbeat from its own first heartbeat on, which carries
    // its step.
    members_[member.member_id()] = Member{member.incarnation(), pid, std::move(out),
                                          /*step=*/0, /*samples=*/0, /*stalled_ms=*/0,
                                          absl::InfinitePast(),
                                          /*attached=*/connected_};
    if (connected_) {
      v1::SessionRequest attach;
      *attach.mutable_attach() = member;
      Send(std::move(attach));
    }
  }
  if (superseded != nullptr) {
    superseded->Close(absl::AbortedError("superseded by a newer session of the member"));
  }
  return absl::OkStatus();
}

void NodeSessionImpl::LocalBeat(const std::string& member, uint64_t incarnation,
                                const v1::Heartbeat& beat, Queue* out) {
  v1::SessionEvent ack;
  {
    absl::MutexLock lock(&mu_);
    auto it = members_.find(member);
    if (it != members_.end() && it->second.incarnation == incarnation) {
      it->second.step = beat.step();
      it->second.samples = beat.samples();
      it->second.stalled_ms = beat.stalled_ms();
      it->second.last_beat = absl::Now();
    }
    ack.mutable_ack()->set_current_generation(generation_);
    ack.mutable_ack()->set_heartbeat_interval_ms(
        static_cast<uint32_t>(absl::ToInt64Milliseconds(interval_)));
  }
  ack.mutable_ack()->set_sequence(beat.sequence());
  out->Write(std::move(ack));
}

void NodeSessionImpl::LocalEnded(const std::string& member, uint64_t incarnation, pid_t pid) {
  // A stream that ends because its process died: say how, if it is already
  // a zombie of ours.
  const std::string ended = EndedChild(pid);
  const std::string reason = ended.empty() ? "its session to muster-agent ended"
                                           : absl::StrCat("trainer process ", ended);
  std::shared_ptr<Queue> out;
  {
    absl::MutexLock lock(&mu_);
    auto it = members_.find(member);
    if (it == members_.end() || it->second.incarnation != incarnation) return;
    out = DetachLocked(member, reason);
  }
  out->Close(absl::AbortedError(reason));
}

void NodeSessionImpl::ProcessEnded(pid_t pid, const std::string& how) {
  const std::string reason = absl::StrCat("trainer process ", how);
  std::shared_ptr<Queue> out;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, m] : members_) {
      if (m.pid == pid) {
        out = DetachLocked(id, reason);
        break;
      }
    }
  }
  if (out != nullptr) out->Close(absl::AbortedError(reason));
}

std::shared_ptr<Queue> NodeSessionImpl::DetachLocked(const std::string& id,
                                                     const std::string& reason) {
  auto it = members_.find(id);
  std::shared_ptr<Queue> out = std::move(it->second.out);
  v1::SessionRequest detach;
  detach.mutable_detach()->mutable_member()->set_member_id(id);
  detach.mutable_detach()->mutable_member()->set_incarnation(it->second.incarnation);
  detach.mutable_detach()->set_reason(
      absl::StrCat(reason, " (reported by muster-agent of node ", o_.node, ")"));
  const bool attached = it->second.attached;
  members_.erase(it);
  if (connected_ && attached) Send(std::move(detach));
  return out;
}

void NodeSessionImpl::Route(v1::SessionEvent event) {
  std::shared_ptr<Queue> out;
  absl::Status close;
  bool closing = false;
  pid_t hung = 0;
  {
    absl::MutexLock lock(&mu_);
    if (event.epoch() < epoch_) {
      // Not counted as word from the coordinator either: the liveness
      // check then drops a stream to a fenced one.
      MUSTER_LOG(WARNING) << "muster-agent: dropped an event of lease epoch " << event.epoch()
                          << " (epoch " << epoch_ << " is current)";
      return;
    }
    epoch_ = event.epoch();
    last_heard_ = absl::Now();
  }
  if (event.has_rendezvous()) {
    RelayedRendezvous* call = nullptr;
    {
      absl::MutexLock lock(&mu_);
      auto it = rendezvous_.find(event.rendezvous().call());
      if (it == rendezvous_.end()) return;  // cancelled meanwhile
      call = it->second.call;
      rendezvous_.erase(it);
    }
    call->Answer(event.rendezvous());
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    if (event.has_ack()) {
      generation_ = std::max(generation_, event.ack().current_generation());
      if (event.ack().heartbeat_interval_ms() > 0) {
        interval_ = absl::Milliseconds(event.ack().heartbeat_interval_ms());
      }
      return;
    }
    if (event.has_regroup()) generation_ = std::max(generation_, event.regroup().generation());
    auto it = members_.find(event.member_id());
    if (it == members_.end()) return;
    if (event.has_closed()) {
      // A newer incarnation may already be attached under the same id.
      if (event.closed().incarnation() != it->second.incarnation) return;
      closing = true;
      close = absl::Status(static_cast<absl::StatusCode>(event.closed().code()),
                           event.closed().message());
      if (event.closed().end_process()) hung = it->second.pid;
      out = std::move(it->second.out);
      members_.erase(it);
    } else {
      out = it->second.out;
    }
  }
  if (closing) {
    if (hung > 0) {
      // Its session lived but its training did not come to a regroup: the
      // process is stuck (a kernel, a driver call, a deadlock). End it; the
      // supervisor restarts it as a new incarnation, which takes a live
      // peer's state.
      MUSTER_LOG(WARNING) << "muster-agent: the coordinator fenced trainer " << event.member_id()
                          << " (pid " << hung << ") as hung: " << close.message()
                          << "; killing it so that it restarts";
      ::kill(hung, SIGKILL);
    }
    out->Close(close);
    return;
  }
  event.clear_member_id();
  out->Write(std::move(event));
}

void NodeSessionImpl::ConnectLoop() {
  Backoff backoff(o_.backoff);
  // While the coordinator stays away, one line at the first failure and
  // then one every 30 s, with how many tries failed since.
  int quiet_failures = 0;
  absl::Time said = absl::InfinitePast();
  for (;;) {
    const absl::Time started = absl::Now();
    const absl::Status ended = Connection();
    // Connection() left connected_ false: what went out on the ended
    // connection is dropped here once; what arrived since waits for the
    // next one (all of it, when stopping).
    std::vector<std::shared_ptr<Queue>> orphans;
    std::vector<RelayedRendezvous*> unanswered;
    bool stopping = false;
    {
      absl::MutexLock lock(&mu_);
      stopping = stopping_;
      outgoing_.clear();
      for (auto it = members_.begin(); it != members_.end();) {
        if (!it->second.attached && !stopping) {
          ++it;
          continue;
        }
        orphans.push_back(std::move(it->second.out));
        it = members_.erase(it);
      }
      for (auto it = rendezvous_.begin(); it != rendezvous_.end();) {
        if (!it->second.sent && !stopping) {
          ++it;
          continue;
        }
        unanswered.push_back(it->second.call);
        it = rendezvous_.erase(it);
      }
    }
    // Each trainer rejoins and opens its session again, as after a
    // coordinator restart.
    const absl::Status why =
        stopping ? absl::UnavailableError("muster-agent is stopping")
                 : absl::UnavailableError(absl::StrCat(
                       "muster-agent lost its session with the coordinator: ", ended.message()));
    for (const auto& out : orphans) out->Close(why);
    // A trainer retries UNAVAILABLE until its own deadline.
    for (RelayedRendezvous* call : unanswered) call->Fail(why);
    if (stopping) return;
    if (absl::Now() - started > absl::Seconds(10)) {
      backoff.Reset();
      quiet_failures = 0;
      said = absl::InfinitePast();
    }
    if (absl::Now() - said >= absl::Seconds(30)) {
      MUSTER_LOG(WARNING) << "muster-agent: node " << o_.node << ": session with "
                          << o_.coordinator << " ended (" << ended << "); reconnecting"
                          << (quiet_failures > 0
                                  ? absl::StrCat(" (", quiet_failures, " more tries failed)")
                                  : std::string());
      said = absl::Now();
      quiet_failures = 0;
    } else {
      ++quiet_failures;
    }
    const absl::Duration wait = backoff.Next();
    absl::MutexLock lock(&mu_);
    // Stopping: the next Connection() ends at once and the waiting calls
    // are finished above.
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), wait);
  }
}

absl::Status NodeSessionImpl::Connection() {
  grpc::ClientContext ctx;
  AttachToken(&ctx, o_.token);
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::CancelledError("stopping");
    ctx_ = &ctx;
    epoch_ = 0;
  }
  if (coordinator_->Refresh()) {
    MUSTER_LOG(INFO) << "muster-agent: node " << o_.node << ": coordinator now at "
                     << coordinator_->address();
  }
  std::unique_ptr<v1::Coordinator::Stub> stub = v1::Coordinator::NewStub(coordinator_->get());
  std::unique_ptr<Upstream> stream = stub->Session(&ctx);
  // A coordinator that hangs may still accept the TCP connection and then
  // never answer: give up on the handshake after three heartbeat periods
  // and a second, as the write loop does on an open stream.
  bool handshaken = false;
  std::thread handshake_watch([this, &ctx, &handshaken] {
    absl::MutexLock lock(&mu_);
    const absl::Duration limit = 3 * interval_ + absl::Seconds(1);
    auto done = [this, &handshaken]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return handshaken || stopping_;
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&done), limit)) {
      MUSTER_LOG(WARNING) << "muster-agent: node " << o_.node << ": no answer from "
                          << coordinator_->address() << " in " << absl::FormatDuration(limit);
      ctx.TryCancel();
    }
  });
  v1::SessionRequest hello;
  hello.mutable_node_hello()->set_node(o_.node);
  v1::SessionRequest first_beat;  // learns the heartbeat period
  first_beat.mutable_heartbeat();
  bool ok = stream->Write(hello) && stream->Write(first_beat);
  v1::SessionEvent event;
  ok = ok && stream->Read(&event) && event.has_ack();
  {
    absl::MutexLock lock(&mu_);
    handshaken = true;
  }
  handshake_watch.join();
  if (ok) {
    Route(std::move(event));
    absl::MutexLock lock(&mu_);
    connected_ = true;
    SendParkedLocked();
  }
  std::thread writer;
  if (ok) {
    MUSTER_LOG(INFO) << "muster-agent: node " << o_.node << ": node session open";
    writer = std::thread([this, s = stream.get()] { WriteLoop(s); });
    while (stream->Read(&event)) Route(std::move(event));
  }
  {
    absl::MutexLock lock(&mu_);
    connected_ = false;  // the writer stops
    ctx_ = nullptr;
  }
  if (writer.joinable()) writer.join();
  return FromGrpcStatus(stream->Finish());
}

void NodeSessionImpl::WriteLoop(Upstream* stream) {
  uint64_t sequence = 0;
  absl::Time next_beat = absl::Now();
  for (;;) {
    std::vector<v1::SessionRequest> batch;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this, &next_beat]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !connected_ || !outgoing_.empty() || absl::Now() >= next_beat;
      };
      while (!ready()) mu_.AwaitWithDeadline(absl::Condition(&ready), next_beat);
      if (!connected_) return;
      batch.swap(outgoing_);
      const absl::Time now = absl::Now();
      // Every node heartbeat is acknowledged: a coordinator that has said
      // nothing for three periods is hung, or its node is cut off. Its
      // connection may look alive for minutes; drop it and reconnect (to
      // whoever holds the lease by then).
      if (now - last_heard_ > 3 * interval_ + absl::Seconds(1)) {
        MUSTER_LOG(WARNING) << "muster-agent: node " << o_.node << ": no word from the "
                            << "coordinator for " << absl::FormatDuration(now - last_heard_)
                            << "; reconnecting";
        if (ctx_ != nullptr) ctx_->TryCancel();
        return;
      }
      if (now >= next_beat) {
        v1::SessionRequest beat;
        beat.mutable_heartbeat()->set_sequence(++sequence);
        for (const auto& [id, m] : members_) {
          if (!m.attached || now - m.last_beat > 2 * interval_) continue;  // hung or stopped
          v1::MemberStep* step = beat.mutable_heartbeat()->add_members();
          step->set_member_id(id);
          step->set_step(m.step);
          step->set_samples(m.samples);
          step->set_stalled_ms(m.stalled_ms);
          step->set_beat_age_ms(
              static_cast<uint32_t>(absl::ToInt64Milliseconds(now - m.last_beat)));
        }
        batch.push_back(std::move(beat));
        next_beat = now + interval_;
      }
    }
    for (const v1::SessionRequest& r : batch) {
      if (!stream->Write(r)) return;
    }
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<NodeSession>> NodeSession::Start(NodeSessionOptions options) {
  auto session = std::make_unique<NodeSessionImpl>(std::move(options));
  MUSTER_RETURN_IF_ERROR(session->Init());
  return session;
}

}  // namespace muster
