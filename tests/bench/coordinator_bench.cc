// muster-bench coordinator: N simulated members against a real
// muster-coordinator process on loopback. With --per-node K > 1 the members
// are grouped into node sessions of K members each (as muster-agent holds
// them); K = 1 gives each member its own session (trainers without an
// agent). Every session heartbeats once per second. Members of node
// sessions call Rendezvous on their node's stream (NodeRendezvous), as
// muster-agent relays its trainers' calls; the others call the rpc. Prints
//   coordinator members=N sessions=S hb_p50_ms=.. hb_p99_ms=.. rendezvous_s=..
//   regroup_s=.. rss_mb=.. cpu_pct=.. rendezvous_cpu_s=.. regroup_cpu_s=..
// (*_cpu_s: the CPU seconds the coordinator process spent in that phase,
// user and system, so that its share of the phase's wall time is its own
// and not the simulated members', which run on the same cores)
// rendezvous_s: from the last Join to every member holding its assignment
// (min_members = N - R for --regroups R, 1 by default; max_members = N,
// so the world forms once all N are there). regroup_s (--regroup): one
// member is killed (its session broken, or detached by its node session);
// from then to every survivor holding
// its assignment in the new world (with --deltas, the default, the
// survivors' answer is the regroup's delta, which a member applies to the
// world it holds in O(its node); the simulated members count it received);
// with --regroups R, the median of R such regroups one after another.
// "-" when not measured. With --relays R the sessions reach the coordinator
// through R muster-relay processes, and the line ends with
//   relays=R relay_cpu_pct=.. relay_rss_mb=.. relay_regroup_cpu_s=..
// (the relays' CPU over the heartbeat window, their RSS, and their CPU
// seconds per regroup, all summed over the relays). With
// --state-sync-delay and --churn-per-second the heartbeats are measured
// while the coordinator writes events to a slow disk. With --api-requests R
// the coordinator also serves its status page, and R requests for
// /api/status are timed during the heartbeat window (api_p50_ms,
// api_p99_ms). With --lab the coordinator and each relay run in a network
// namespace of their own (a muster-lab lab, docs/lab.md; root only), and the
// simulated nodes reach them over the lab's bridge. MUSTER_BENCH_KEEP=1 keeps the coordinator's directory (its
// log and state) under /tmp/muster-bench-coordinator-PID.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "muster/v1/coordinator.grpc.pb.h"
#include "rpc/async_bidi.h"
#include "rpc/credentials.h"
#include "tests/bench/process_stats.h"
#include "tests/fault/net_lab.h"

ABSL_FLAG(int, members, 1000, "simulated members");
ABSL_FLAG(int, per_node, 1,
          "members per session: 1 = one session per member; K > 1 = node sessions of K "
          "members each, as muster-agent holds them");
ABSL_FLAG(int, seconds, 10, "heartbeat measurement window");
ABSL_FLAG(bool, batches, true,
          "node sessions take and send batches (SessionEvent.batch, SessionRequest.batch), as "
          "muster-agent does; false: one message per member, the protocol before batches");
ABSL_FLAG(bool, deltas, true,
          "members take a regroup's answer as a delta of the world they hold "
          "(RendezvousRequest.takes_delta); false: every answer in full");
ABSL_FLAG(bool, grouped, true,
          "node sessions take one event for several of their members "
          "(NodeHello.grouped), as muster-agent does; false: one per member");
ABSL_FLAG(int, max_heartbeat_rate, -1,
          "the coordinator's --max-heartbeat-rate (-1: its default; 0: no bound)");
ABSL_FLAG(int, channels, 8,
          "client connections the sessions share: 8, many node streams on each connection "
          "as through a relay; as many as the sessions, one connection per node as "
          "muster-agents connect (docs/scale.md, \"One connection per node\")");
ABSL_FLAG(int, relays, 0,
          "muster-relay processes between the sessions and the coordinator: the --channels "
          "connections go to them in turn, and each relay carries its share on "
          "--relay-connections connections to the coordinator (docs/relay.md)");
ABSL_FLAG(int, relay_connections, 1, "each relay's connections to the coordinator");
ABSL_FLAG(bool, lab, false,
          "the coordinator and each relay in a network namespace of its own (a muster-lab "
          "lab; root), reached over its bridge, so that they share no network stack");
ABSL_FLAG(bool, rendezvous, true, "also measure the rendezvous of all members");
ABSL_FLAG(bool, regroup, false,
          "after the heartbeat window, kill one member and measure the regroup");
ABSL_FLAG(int, regroups, 1,
          "--regroup: regroups timed one after another, 2.5 s apart, each killing the last "
          "member of the next node session from the end; regroup_s and regroup_cpu_s are "
          "their medians");
ABSL_FLAG(bool, call_when_heard, true,
          "--regroup: each node session calls Rendezvous for its survivors as soon as "
          "the regroup reaches it, as muster-agent relays its trainers' calls; false: "
          "every survivor calls once all have heard");
ABSL_FLAG(absl::Duration, state_sync_delay, absl::ZeroDuration(),
          "every fsync of the coordinator's state file also waits this long (a slow shared "
          "file system)");
ABSL_FLAG(int, api_requests, 0,
          "also serve the status page and time this many GET /api/status (api_p50_ms, "
          "api_p99_ms) while the sessions heartbeat");
ABSL_FLAG(int, churn_per_second, 0,
          "during the heartbeat window, this many extra members per second join and leave "
          "(each join and leave is an event the coordinator writes)");

namespace muster {
namespace {

constexpr char kToken[] = "bench-token";

// Latencies from all sessions. Thread-safe.
class Samples {
 public:
  void Add(double ms) {
    absl::MutexLock lock(&mu_);
    if (recording_) v_.push_back(ms);
  }
  void Record(bool on) {
    absl::MutexLock lock(&mu_);
    recording_ = on;
  }
  std::vector<double> Take() {
    absl::MutexLock lock(&mu_);
    return std::move(v_);
  }

 private:
  absl::Mutex mu_;
  bool recording_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<double> v_ ABSL_GUARDED_BY(mu_);
};

// The members' Rendezvous calls of one round: counts answers, and those
// that did not assign the expected world size.
struct RendezvousRound {
  RendezvousRound(int count, uint32_t size, uint64_t after = 1)
      : count(count), size(size), after(after) {}
  void Answered(bool ok, uint32_t world_size) {
    if (!ok || world_size != size) ++failed;
    if (++answered == count) all.Notify();
  }
  // Waits up to `timeout` for every answer: the seconds from `start` to the
  // last one, or what went wrong.
  absl::StatusOr<double> Wait(absl::Time start,
                              absl::Duration timeout = absl::InfiniteDuration()) {
    const bool done = all.WaitForNotificationWithTimeout(timeout);
    const double secs = absl::ToDoubleSeconds(absl::Now() - start);
    if (!done) {
      return absl::DeadlineExceededError(
          absl::StrCat("only ", answered.load(), " of ", count, " calls were answered"));
    }
    if (failed > 0) {
      return absl::InternalError(absl::StrCat(failed.load(), " rendezvous calls failed"));
    }
    return secs;
  }
  const int count;
  const uint32_t size;
  const uint64_t after;  // the generation the members held before it
  std::atomic<int> answered{0}, failed{0};
  absl::Notification all;
};

// The simulated sessions' completion queues, one thread each. The sessions
// use the completion-queue API rather than the callback API, which puts every
// stream of a process on one queue and, in a gRPC built without NDEBUG
// (Debian's), scans that queue's pending operations at each completion: the
// simulation's own cost would then grow with the number of sessions it
// simulates, on the cores it shares with the coordinator (rpc/async_bidi.h).
class ClientQueues {
 public:
  explicit ClientQueues(int n) {
    for (int i = 0; i < n; ++i) {
      queues_.push_back(std::make_unique<grpc::CompletionQueue>());
      grpc::CompletionQueue* q = queues_.back().get();
      threads_.emplace_back([q] {
        void* tag = nullptr;
        bool ok = false;
        while (q->Next(&tag, &ok)) static_cast<AsyncTag*>(tag)->Done(ok);
      });
    }
  }
  // Every session on them must have finished.
  ~ClientQueues() {
    for (auto& q : queues_) q->Shutdown();
    for (std::thread& t : threads_) t.join();
  }
  grpc::CompletionQueue* Next() { return queues_[next_++ % queues_.size()].get(); }

 private:
  std::vector<std::unique_ptr<grpc::CompletionQueue>> queues_;
  std::vector<std::thread> threads_;
  size_t next_ = 0;
};

// One session: a member's own (one member) or a node's (several). Writes
// go out one at a time from a queue; acks are timed; a regroup event calls
// `on_regroup` with the session and the indices of the members it is for.
class SimSession {
 public:
  SimSession(v1::Coordinator::Stub* stub, grpc::CompletionQueue* queue, const std::string& node,
             std::vector<std::pair<int, v1::MemberRef>> members, Samples* samples,
             std::atomic<uint32_t>* interval_ms,
             std::function<void(SimSession*, std::vector<int>)> on_regroup)
      : members_(std::move(members)),
        samples_(samples),
        interval_ms_(interval_ms),
        on_regroup_(std::move(on_regroup)) {
    AttachToken(&ctx_, kToken);
    stream_ = stub->PrepareAsyncSession(&ctx_, queue);
    const bool node_session = members_.size() > 1;
    for (const auto& [index, ref] : members_) {
      v1::SessionRequest msg;
      if (node_session) {
        *msg.mutable_attach() = ref;
      } else {
        *msg.mutable_hello() = ref;
      }
      queue_.push_back(std::move(msg));
    }
    if (node_session) {
      v1::SessionRequest hello;
      hello.mutable_node_hello()->set_node(node);
      hello.mutable_node_hello()->set_batches(absl::GetFlag(FLAGS_batches));
      hello.mutable_node_hello()->set_grouped(absl::GetFlag(FLAGS_grouped));
      queue_.push_front(std::move(hello));
    }
    // Writes wait for the call to start (StartCall sends the headers as a
    // write of its own).
    writing_ = true;
    pending_ = 2;
    stream_->StartCall(&started_);
    stream_->Read(&event_, &read_);
  }

  // Queues a heartbeat unless the previous one is unanswered.
  void Heartbeat() {
    v1::SessionRequest hb;
    hb.mutable_heartbeat()->set_sequence(0);
    if (members_.size() > 1) {
      for (const auto& [index, ref] : members_) {
        if (index == killed_) continue;
        v1::MemberStep* m = hb.mutable_heartbeat()->add_members();
        m->set_member_id(ref.member_id());
        m->set_step(1);
      }
    }
    absl::MutexLock lock(&mu_);
    if (beat_pending_ || finishing_) return;
    beat_pending_ = true;
    hb.mutable_heartbeat()->set_sequence(++seq_);
    sent_ = absl::Now();
    SendLocked(std::move(hb));
  }

  // Ends member `index`'s process: a member session is cancelled, a node
  // session detaches it.
  void Kill(int index) {
    killed_ = index;
    if (members_.size() == 1) {
      ctx_.TryCancel();
      return;
    }
    v1::SessionRequest msg;
    for (const auto& [i, ref] : members_) {
      if (i == index) *msg.mutable_detach()->mutable_member() = ref;
    }
    msg.mutable_detach()->set_reason("killed by the benchmark");
    absl::MutexLock lock(&mu_);
    SendLocked(std::move(msg));
  }

  // Node sessions: members `indices` call Rendezvous on this stream, as
  // muster-agent relays its trainers' calls: the calls of a node's
  // trainers made together (after a regroup, within its hold) leave as one
  // message.
  void Rendezvous(const std::vector<int>& indices, uint64_t after, RendezvousRound* round) {
    v1::SessionRequest batch;
    for (int index : indices) {
      v1::SessionRequest* msg = batch.add_batch();
      v1::NodeRendezvous* call = msg->mutable_rendezvous();
      call->set_call(static_cast<uint64_t>(index));
      for (const auto& [i, ref] : members_) {
        if (i == index) *call->mutable_request()->mutable_member() = ref;
      }
      call->mutable_request()->set_after_generation(after);
      call->mutable_request()->set_timeout_ms(600'000);
      call->mutable_request()->set_takes_delta(absl::GetFlag(FLAGS_deltas));
    }
    v1::SessionRequest msg;
    if (batch.batch_size() == 1) {
      msg = std::move(*batch.mutable_batch(0));
    } else {
      msg = std::move(batch);
    }
    absl::MutexLock lock(&mu_);
    round_ = round;
    SendLocked(std::move(msg));
  }

  void Stop() { ctx_.TryCancel(); }
  void WaitDone() { finished_.WaitForNotification(); }
  int closed() const { return closed_.load(); }

  void OnWriteDone(bool ok) {
    {
      absl::MutexLock lock(&mu_);
      queue_.pop_front();
      if (!ok || queue_.empty() || finishing_) {
        writing_ = false;
        MaybeFinishLocked();
      } else {
        ++pending_;
        stream_->Write(queue_.front(), &written_);
      }
    }
    Ended();
  }

  void OnReadDone(bool ok) {
    if (!ok) {
      {
        absl::MutexLock lock(&mu_);
        finishing_ = true;
        MaybeFinishLocked();
      }
      Ended();
      return;
    }
    if (event_.batch_size() == 0) {
      Handle(event_);
    } else {  // a node's events sent as one message, as muster-agent takes them
      for (const v1::SessionEvent& e : event_.batch()) Handle(e);
    }
    {
      absl::MutexLock lock(&mu_);
      ++pending_;
      stream_->Read(&event_, &read_);
    }
    Ended();
  }

  void Handle(const v1::SessionEvent& event) {
    if (event.has_ack()) {
      absl::Time sent;
      bool match;
      {
        absl::MutexLock lock(&mu_);
        match = event.ack().sequence() == seq_;
        sent = sent_;
        beat_pending_ = false;
      }
      if (match) samples_->Add(absl::ToDoubleMilliseconds(absl::Now() - sent));
      if (event.ack().heartbeat_interval_ms() > 0) {
        interval_ms_->store(event.ack().heartbeat_interval_ms());
      }
    } else if (event.has_regroup() && !event.regroup().leave()) {
      std::vector<int> heard;
      for (const auto& [index, ref] : members_) {
        if (members_.size() == 1 || For(event, ref.member_id())) heard.push_back(index);
      }
      on_regroup_(this, std::move(heard));
    } else if (event.has_closed()) {
      ++closed_;
    } else if (event.has_rendezvous()) {
      RendezvousRound* round;
      {
        absl::MutexLock lock(&mu_);
        round = round_;
      }
      const v1::RendezvousAnswer& a = event.rendezvous();
      const int members = std::max(1, event.member_ids_size());
      for (int i = 0; round != nullptr && i < members; ++i) {
        round->Answered(a.code() == 0, a.response().world().world_size());
      }
    }
  }


 private:
  // Whether `event` is for `member` (itself, or among the several it names).
  static bool For(const v1::SessionEvent& event, const std::string& member) {
    if (event.member_ids_size() == 0) return event.member_id() == member;
    return std::find(event.member_ids().begin(), event.member_ids().end(), member) !=
           event.member_ids().end();
  }

  // A pending operation's tag.
  struct Op final : AsyncTag {
    Op(SimSession* session, void (SimSession::*on)(bool)) : session(session), on(on) {}
    void Done(bool ok) override { (session->*on)(ok); }
    SimSession* const session;
    void (SimSession::*const on)(bool);
  };

  void OnStarted(bool ok) {
    {
      absl::MutexLock lock(&mu_);
      if (ok && !finishing_ && !queue_.empty()) {
        ++pending_;
        stream_->Write(queue_.front(), &written_);
      } else {
        writing_ = false;
        MaybeFinishLocked();
      }
    }
    Ended();
  }
  void OnFinished(bool /*ok*/) {
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
    }
    Ended();
  }
  // An operation ended; the last one, after Finish, ends the session.
  void Ended() {
    {
      absl::MutexLock lock(&mu_);
      if (--pending_ > 0 || !done_) return;
    }
    finished_.Notify();
  }

  // Finish, once the server's side ended and no write is in flight (gRPC
  // allows no other operation beside it).
  void MaybeFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!finishing_ || writing_ || finish_started_) return;
    finish_started_ = true;
    ++pending_;
    stream_->Finish(&status_, &finished_op_);
  }

  void SendLocked(v1::SessionRequest msg) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    queue_.push_back(std::move(msg));
    if (writing_ || finishing_) return;
    writing_ = true;
    ++pending_;
    stream_->Write(queue_.front(), &written_);
  }

  const std::vector<std::pair<int, v1::MemberRef>> members_;
  Samples* const samples_;
  // The heartbeat period the coordinator asks for (its acks'), shared by
  // every session.
  std::atomic<uint32_t>* const interval_ms_;
  const std::function<void(SimSession*, std::vector<int>)> on_regroup_;
  std::atomic<int> killed_{-1};
  std::atomic<int> closed_{0};
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientAsyncReaderWriter<v1::SessionRequest, v1::SessionEvent>> stream_;
  v1::SessionEvent event_;
  grpc::Status status_;
  Op started_{this, &SimSession::OnStarted};
  Op written_{this, &SimSession::OnWriteDone};
  Op read_{this, &SimSession::OnReadDone};
  Op finished_op_{this, &SimSession::OnFinished};
  absl::Mutex mu_;
  // Operations begun and not yet ended.
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
  // The front is being written; a std::deque keeps it in place while more
  // are queued behind it.
  std::deque<v1::SessionRequest> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool beat_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  // The server's side ended: Finish is due (finish_started_ once begun).
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_started_ ABSL_GUARDED_BY(mu_) = false;
  RendezvousRound* round_ ABSL_GUARDED_BY(mu_) = nullptr;
  uint64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time sent_ ABSL_GUARDED_BY(mu_);
  absl::Notification finished_;
};

// --churn-per-second: extra members join and leave at that rate while
// `*on`; counts the completed pairs in `*done`.
void Churn(v1::Coordinator::Stub* stub, const std::atomic<bool>* on, std::atomic<int>* done) {
  const int rate = absl::GetFlag(FLAGS_churn_per_second);
  if (rate <= 0) return;
  const absl::Time t0 = absl::Now();
  for (int k = 0; *on; ++k) {
    absl::SleepFor(t0 + absl::Seconds(k) / rate - absl::Now());
    v1::MemberRef ref;
    ref.set_member_id(absl::StrCat("churn/", k));
    ref.set_incarnation(1 + k);
    grpc::ClientContext join_ctx, leave_ctx;
    AttachToken(&join_ctx, kToken);
    AttachToken(&leave_ctx, kToken);
    v1::JoinRequest join;
    *join.mutable_member() = ref;
    join.set_node("churn");
    v1::JoinResponse joined;
    if (!stub->Join(&join_ctx, join, &joined).ok()) continue;
    v1::LeaveRequest leave;
    *leave.mutable_member() = ref;
    leave.set_reason(v1::LeaveRequest::GRACEFUL);
    v1::LeaveResponse left;
    if (stub->Leave(&leave_ctx, leave, &left).ok()) ++*done;
  }
}

// The simulated job: the coordinator process, the members and their
// sessions.
class CoordinatorBench {
 public:
  CoordinatorBench(int members, int per_node)
      : n_(members), per_node_(per_node), dir_(absl::StrCat("/tmp/muster-bench-coordinator-",
                                                           ::getpid())) {
    for (int i = 0; i < n_; ++i) {
      refs_.emplace_back();
      refs_[i].set_member_id(absl::StrCat(Node(i), "/", i % per_node_));
      refs_[i].set_incarnation(1000 + i);
    }
  }

  ~CoordinatorBench() {
    for (auto& s : sessions_) s->Stop();
    for (auto& s : sessions_) s->WaitDone();
    for (pid_t r : relays_) StopProcess(r);
    if (coordinator_ > 0) StopProcess(coordinator_);
    if (std::getenv("MUSTER_BENCH_KEEP") == nullptr) std::system(("rm -rf " + dir_).c_str());
  }

  absl::Status Start() {
    std::system(("mkdir -p " + dir_).c_str());
    const std::string token_file = dir_ + "/token";
    std::ofstream(token_file) << kToken;
    std::system(("chmod 600 " + token_file).c_str());
    const int relays = absl::GetFlag(FLAGS_relays);
    if (absl::GetFlag(FLAGS_lab)) {
      std::vector<std::string> hosts = {"coord"};
      for (int r = 0; r < relays; ++r) hosts.push_back(absl::StrCat("relay", r));
      lab_ = std::make_unique<NetLab>(NetLabOptions{0, "", hosts});
      if (!lab_->ok()) return absl::FailedPreconditionError("--lab: " + lab_->error());
    }
    const std::string port = std::to_string(FreeLoopbackPort());
    const std::string target = (lab_ ? lab_->HostAddress("coord") : "127.0.0.1") + ":" + port;
    std::vector<std::string> args = InLab("coord");
    args.insert(args.end(), {
        SelfDir() + "/muster-coordinator", "--listen=" + (lab_ ? "0.0.0.0:" + port : target),
        "--state-dir=" + dir_ + "/state", "--token-file=" + token_file,
        absl::StrCat("--min-members=", std::max(1, n_ - absl::GetFlag(FLAGS_regroups))),
        absl::StrCat("--max-members=", n_), "--last-call=600s", "--heartbeat-timeout=60s",
        "--join-timeout=600s",
        "--state-sync-delay=" + absl::FormatDuration(absl::GetFlag(FLAGS_state_sync_delay)),
        absl::GetFlag(FLAGS_api_requests) > 0
            ? absl::StrCat("--http-listen=127.0.0.1:", http_port_ = FreeLoopbackPort())
            : std::string("--http-listen=")});
    if (const int rate = absl::GetFlag(FLAGS_max_heartbeat_rate); rate >= 0) {
      args.push_back(absl::StrCat("--max-heartbeat-rate=", rate));
    }
    coordinator_ = SpawnLogged(args, dir_ + "/coordinator.log");
    std::vector<std::string> targets = {target};
    if (relays > 0) targets = StartRelays(relays, target);
    for (int i = 0; i < std::max(1, absl::GetFlag(FLAGS_channels)); ++i) {
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      args.SetInt("muster.bench_channel", i);
      args.SetMaxReceiveMessageSize(-1);
      stubs_.push_back(v1::Coordinator::NewStub(grpc::CreateCustomChannel(
          targets[i % targets.size()], grpc::InsecureChannelCredentials(), args)));
    }
    for (int i = 0; i < 200; ++i) {
      grpc::ClientContext ctx;
      AttachToken(&ctx, kToken);
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Milliseconds(200)));
      v1::GetStatusResponse resp;
      if (stubs_[0]->GetStatus(&ctx, v1::GetStatusRequest(), &resp).ok()) {
        return absl::OkStatus();
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    return absl::UnavailableError("the coordinator did not start (see " + dir_ + ")");
  }

  // Starts `n` relays to `coordinator`; their addresses.
  std::vector<std::string> StartRelays(int n, const std::string& coordinator) {
    std::vector<std::string> targets;
    for (int r = 0; r < n; ++r) {
      const std::string host = absl::StrCat("relay", r);
      const std::string port = std::to_string(FreeLoopbackPort());
      targets.push_back((lab_ ? lab_->HostAddress(host) : "127.0.0.1") + ":" + port);
      std::vector<std::string> argv = InLab(host);
      argv.insert(argv.end(),
                  {SelfDir() + "/muster-relay",
                   "--listen=" + (lab_ ? "0.0.0.0:" + port : targets.back()),
                   "--coordinator=" + coordinator,
                   absl::StrCat("--connections=", absl::GetFlag(FLAGS_relay_connections))});
      relays_.push_back(SpawnLogged(argv, absl::StrCat(dir_, "/relay", r, ".log")));
    }
    return targets;
  }

  // The command prefix that runs a program in lab host `host` (none
  // without --lab).
  std::vector<std::string> InLab(const std::string& host) const {
    return InNetns(lab_ ? lab_->HostNamespace(host) : "");
  }

  // The relays' CPU seconds and RSS, summed.
  double RelayCpuSeconds() const {
    double sum = 0;
    for (pid_t r : relays_) sum += ProcessCpuSeconds(r);
    return sum;
  }
  double RelayRssMb() const {
    double sum = 0;
    for (pid_t r : relays_) sum += ProcessRssMb(r);
    return sum;
  }

  // Joins every member from a few threads, then opens the sessions.
  absl::Status JoinAll() {
    std::atomic<int> next{0}, errors{0};
    std::vector<std::thread> joiners;
    for (int t = 0; t < 8; ++t) {
      joiners.emplace_back([&] {
        for (int i = next++; i < n_; i = next++) {
          grpc::ClientContext ctx;
          AttachToken(&ctx, kToken);
          v1::JoinRequest req;
          *req.mutable_member() = refs_[i];
          req.set_node(Node(i));
          req.set_local_rank(i % per_node_);
          v1::JoinResponse resp;
          if (!Stub(i)->Join(&ctx, req, &resp).ok()) ++errors;
        }
      });
    }
    for (auto& t : joiners) t.join();
    if (errors > 0) return absl::InternalError(absl::StrCat(errors.load(), " joins failed"));
    for (int first = 0; first < n_; first += per_node_) {
      std::vector<std::pair<int, v1::MemberRef>> members;
      for (int i = first; i < std::min(n_, first + per_node_); ++i) {
        members.emplace_back(i, refs_[i]);
      }
      sessions_.push_back(std::make_unique<SimSession>(
          Stub(first), queues_.Next(), Node(first), std::move(members), &samples_,
          &interval_ms_,
          [this](SimSession* session, std::vector<int> heard) {
            OnRegroup(session, std::move(heard));
          }));
    }
    return absl::OkStatus();
  }

  // Every member in `members` calls Rendezvous(after); returns the seconds
  // until all hold an assignment in a world of `size`. Members of node
  // sessions call it on their node's stream, the others as an rpc.
  absl::StatusOr<double> RendezvousAll(const std::vector<int>& members, uint64_t after,
                                       uint32_t size, absl::Time start) {
    std::vector<std::unique_ptr<Pending>> pending;
    RendezvousRound round(static_cast<int>(members.size()), size);
    if (per_node_ > 1) {
      std::map<int, std::vector<int>> by_node;
      for (int i : members) by_node[i / per_node_].push_back(i);
      for (const auto& [node, indices] : by_node) {
        if (absl::GetFlag(FLAGS_batches)) {
          sessions_[node]->Rendezvous(indices, after, &round);
          continue;
        }
        for (int i : indices) sessions_[node]->Rendezvous({i}, after, &round);
      }
    }
    for (int i : members) {
      if (per_node_ > 1) continue;
      pending.push_back(std::make_unique<Pending>());
      Pending* p = pending.back().get();
      AttachToken(&p->ctx, kToken);
      *p->req.mutable_member() = refs_[i];
      p->req.set_after_generation(after);
      p->req.set_timeout_ms(600'000);
      p->req.set_takes_delta(absl::GetFlag(FLAGS_deltas));
      Stub(i)->async()->Rendezvous(&p->ctx, &p->req, &p->resp, [&round, p](grpc::Status s) {
        round.Answered(s.ok(), p->resp.world().world_size());
      });
    }
    return round.Wait(start);
  }

  absl::StatusOr<double> Rendezvous() {
    std::vector<int> all(n_);
    for (int i = 0; i < n_; ++i) all[i] = i;
    return RendezvousAll(all, 0, n_, absl::Now());
  }

  // Heartbeats from every session, each once per period the coordinator
  // asks for (as muster-agent beats), for `d`.
  void Beat(absl::Duration d) {
    const size_t s = sessions_.size();
    const absl::Time end = absl::Now() + d;
    absl::Time last = absl::Now();
    double due = 0;
    int64_t sent = 0;
    for (absl::Time now = last; now < end; now = absl::Now()) {
      due += absl::ToDoubleMilliseconds(now - last) / std::max<uint32_t>(1, interval_ms_) * s;
      last = now;
      for (; sent < static_cast<int64_t>(due); ++sent) sessions_[sent % s]->Heartbeat();
      absl::SleepFor(absl::Milliseconds(1));
    }
  }
  uint32_t interval_ms() const { return interval_ms_; }

  // Kills the last member of the k-th session from the end (k = 0, 1, ...
  // in turn) and times the survivors' regroup, the k+1-th since the first
  // world. With --call_when_heard (the default) a node session calls
  // Rendezvous for its survivors as soon as the regroup reaches it, as
  // muster-agent relays its trainers' calls; without it every survivor
  // calls once all have heard.
  absl::StatusOr<double> Regroup(int k) {
    SimSession* session = sessions_[sessions_.size() - 1 - k].get();
    const int victim = std::min(n_, (static_cast<int>(sessions_.size()) - k) * per_node_) - 1;
    const int survivors_left = n_ - 1 - k;
    const uint64_t after = 1 + static_cast<uint64_t>(k);
    {
      absl::MutexLock lock(&regroup_mu_);
      killed_.push_back(victim);
    }
    const absl::Time start = absl::Now();
    if (absl::GetFlag(FLAGS_call_when_heard) && per_node_ > 1) {
      RendezvousRound round(survivors_left, survivors_left, after);
      {
        absl::MutexLock lock(&regroup_mu_);
        round_ = &round;
      }
      session->Kill(victim);
      absl::StatusOr<double> secs = round.Wait(start, absl::Seconds(120));
      absl::MutexLock lock(&regroup_mu_);
      round_ = nullptr;
      return secs;
    }
    {
      absl::MutexLock lock(&regroup_mu_);
      regrouped_.clear();
      regrouping_ = true;
    }
    session->Kill(victim);
    std::vector<int> survivors;
    {
      absl::MutexLock lock(&regroup_mu_);
      auto all_heard = [&] { return regrouped_.size() >= static_cast<size_t>(survivors_left); };
      if (!regroup_mu_.AwaitWithTimeout(absl::Condition(&all_heard), absl::Seconds(120))) {
        return absl::DeadlineExceededError(absl::StrCat("only ", regrouped_.size(), " of ",
                                                        survivors_left,
                                                        " survivors heard of the regroup"));
      }
      survivors = regrouped_;
      regrouping_ = false;
    }
    return RendezvousAll(survivors, after, survivors_left, start);
  }

  // Times `n` GET /api/status in a row (milliseconds each, to the last
  // byte of the answer).
  absl::StatusOr<std::vector<double>> ApiLatencies(int n) {
    const std::string request = absl::StrCat(
        "GET /api/status HTTP/1.0\r\nAuthorization: Bearer ", kToken, "\r\n\r\n");
    std::vector<double> ms;
    for (int i = 0; i < n; ++i) {
      const absl::Time t0 = absl::Now();
      const std::string answer = HttpExchange(http_port_, request);
      if (answer.rfind("HTTP/1.1 200", 0) != 0) {
        return absl::InternalError(absl::StrCat("GET /api/status: ", answer.substr(0, 200)));
      }
      ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
    }
    return ms;
  }

  int sessions() const { return static_cast<int>(sessions_.size()); }
  int channels() const { return static_cast<int>(stubs_.size()); }
  Samples* samples() { return &samples_; }
  pid_t coordinator() const { return coordinator_; }
  v1::Coordinator::Stub* Stub(int i) { return stubs_[i % stubs_.size()].get(); }

 private:
  struct Pending {
    grpc::ClientContext ctx;
    v1::RendezvousRequest req;
    v1::RendezvousResponse resp;
  };

  std::string Node(int i) const { return absl::StrCat("node", i / per_node_); }

  void OnRegroup(SimSession* session, std::vector<int> heard) {
    absl::MutexLock lock(&regroup_mu_);
    heard.erase(std::remove_if(heard.begin(), heard.end(),
                               [this](int i) {
                                 return std::find(killed_.begin(), killed_.end(), i) !=
                                        killed_.end();
                               }),
                heard.end());
    if (round_ != nullptr && !heard.empty()) {
      session->Rendezvous(heard, round_->after, round_);
      return;
    }
    if (regrouping_) regrouped_.insert(regrouped_.end(), heard.begin(), heard.end());
  }

  const int n_;
  const int per_node_;
  const std::string dir_;
  int http_port_ = 0;
  std::unique_ptr<NetLab> lab_;  // --lab; removed after the processes in it stop
  pid_t coordinator_ = -1;
  std::vector<pid_t> relays_;
  std::vector<v1::MemberRef> refs_;
  std::vector<std::unique_ptr<v1::Coordinator::Stub>> stubs_;
  // Declared before the sessions: they end before their queues shut down.
  ClientQueues queues_{8};
  std::vector<std::unique_ptr<SimSession>> sessions_;
  Samples samples_;
  std::atomic<uint32_t> interval_ms_{1000};
  absl::Mutex regroup_mu_;
  bool regrouping_ ABSL_GUARDED_BY(regroup_mu_) = false;
  // --call_when_heard: the survivors' round while a regroup is timed.
  RendezvousRound* round_ ABSL_GUARDED_BY(regroup_mu_) = nullptr;
  std::vector<int> regrouped_ ABSL_GUARDED_BY(regroup_mu_);
  std::vector<int> killed_ ABSL_GUARDED_BY(regroup_mu_);  // the members killed so far
};

std::string Seconds(const absl::StatusOr<double>& s) {
  return s.ok() ? absl::StrFormat("%.3f", *s) : "-";
}

}  // namespace

// Times `regroups` regroups one after another, 2.5 s of heartbeats apart:
// the medians of their wall, coordinator CPU and relays' CPU seconds, each
// regroup's wall and coordinator CPU on stderr when there are several.
absl::Status TimeRegroups(CoordinatorBench& bench, int regroups, absl::StatusOr<double>* wall,
                          absl::StatusOr<double>* cpu, double* relay_cpu) {
  std::vector<double> walls, cpus, relay_cpus;
  for (int k = 0; k < regroups; ++k) {
    if (k > 0) bench.Beat(absl::Milliseconds(2500));
    const double before = ProcessCpuSeconds(bench.coordinator());
    const double relays_before = bench.RelayCpuSeconds();
    absl::StatusOr<double> one = bench.Regroup(k);
    if (!one.ok()) return one.status();
    cpus.push_back(ProcessCpuSeconds(bench.coordinator()) - before);
    relay_cpus.push_back(bench.RelayCpuSeconds() - relays_before);
    walls.push_back(*one);
  }
  *relay_cpu = Percentile(relay_cpus, 50);
  if (regroups > 1) {
    std::cerr << "regroups:";
    for (int k = 0; k < regroups; ++k) {
      std::cerr << absl::StrFormat(" %.3f (%.3f)", walls[k], cpus[k]);
    }
    std::cerr << "\n";
  }
  *wall = Percentile(walls, 50);
  *cpu = Percentile(cpus, 50);
  return absl::OkStatus();
}

// The heartbeat window: `seconds` of beats after a 2 s warm-up, while
// members churn and the status page is asked, as the flags say.
struct HeartbeatWindow {
  std::vector<double> beats_ms;  // each beat's round trip
  double cpu_pct = 0;            // the coordinator's, over the window
  double relay_cpu_pct = 0;      // the relays', summed
  double rss_mb = 0;             // the coordinator's, after it
  int churned = 0;               // members that joined and left
  absl::StatusOr<std::vector<double>> api = absl::UnavailableError("skipped");
};

absl::StatusOr<HeartbeatWindow> MeasureHeartbeats(CoordinatorBench& bench, int seconds) {
  HeartbeatWindow w;
  bench.Beat(absl::Seconds(2));  // warm-up
  bench.samples()->Record(true);
  const double cpu0 = ProcessCpuSeconds(bench.coordinator());
  const double relay_cpu0 = bench.RelayCpuSeconds();
  const auto t0 = std::chrono::steady_clock::now();
  std::atomic<bool> churning{true};
  std::atomic<int> churned{0};
  std::thread churn([&] { Churn(bench.Stub(0), &churning, &churned); });
  std::thread api_client([&] {
    if (absl::GetFlag(FLAGS_api_requests) > 0) {
      w.api = bench.ApiLatencies(absl::GetFlag(FLAGS_api_requests));
    }
  });
  bench.Beat(absl::Seconds(seconds));
  churning = false;
  churn.join();
  api_client.join();
  if (absl::GetFlag(FLAGS_api_requests) > 0 && !w.api.ok()) return w.api.status();
  const double window_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  w.cpu_pct = 100.0 * (ProcessCpuSeconds(bench.coordinator()) - cpu0) / window_s;
  w.relay_cpu_pct = 100.0 * (bench.RelayCpuSeconds() - relay_cpu0) / window_s;
  bench.samples()->Record(false);
  w.rss_mb = ProcessRssMb(bench.coordinator());
  w.beats_ms = bench.samples()->Take();
  w.churned = churned;
  return w;
}

// Flags the bench cannot run with, said on stderr: false.
bool FlagsMakeSense() {
  const int n = absl::GetFlag(FLAGS_members);
  const int per_node = absl::GetFlag(FLAGS_per_node);
  if (n < 2 || absl::GetFlag(FLAGS_seconds) <= 0 || per_node < 1) {
    std::cerr << "muster-bench coordinator: --members must be at least 2, --seconds and "
                 "--per-node positive\n";
    return false;
  }
  // Each regroup kills a member of another session; some member survives.
  const int sessions = (n + per_node - 1) / per_node;
  const int regroups = absl::GetFlag(FLAGS_regroups);
  if (absl::GetFlag(FLAGS_regroup) && (regroups < 1 || regroups > sessions || regroups >= n)) {
    std::cerr << "muster-bench coordinator: --regroups must be at least 1, at most the sessions ("
              << sessions << ") and fewer than the members\n";
    return false;
  }
  if (absl::GetFlag(FLAGS_lab) && absl::GetFlag(FLAGS_api_requests) > 0) {
    std::cerr << "muster-bench coordinator: --lab does not take --api-requests (the status "
                 "page listens on the coordinator's loopback)\n";
    return false;
  }
  const int relays = absl::GetFlag(FLAGS_relays);
  if (relays < 0 || relays > std::max(1, absl::GetFlag(FLAGS_channels)) ||
      absl::GetFlag(FLAGS_relay_connections) < 1) {
    std::cerr << "muster-bench coordinator: --relays must be between 0 and --channels, "
                 "--relay-connections positive\n";
    return false;
  }
  return true;
}

int RunCoordinatorBench() {
  if (!FlagsMakeSense()) return 2;
  const int n = absl::GetFlag(FLAGS_members);
  const int per_node = absl::GetFlag(FLAGS_per_node);
  const int seconds = absl::GetFlag(FLAGS_seconds);
  const int regroups = absl::GetFlag(FLAGS_regroups);
  // As muster-coordinator does: Debian's Abseil checks every Mutex for
  // lock-order cycles, and 12,500 simulated sessions each hold one.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  CoordinatorBench bench(n, per_node);
  auto fail = [](const absl::Status& s) {
    std::cerr << "muster-bench coordinator: " << s << "\n";
    return 1;
  };
  if (absl::Status s = bench.Start(); !s.ok()) return fail(s);
  if (absl::Status s = bench.JoinAll(); !s.ok()) return fail(s);
  absl::StatusOr<double> rendezvous = absl::UnavailableError("skipped");
  absl::StatusOr<double> rendezvous_cpu = absl::UnavailableError("skipped");
  if (absl::GetFlag(FLAGS_rendezvous) || absl::GetFlag(FLAGS_regroup)) {
    const double before = ProcessCpuSeconds(bench.coordinator());
    rendezvous = bench.Rendezvous();
    if (!rendezvous.ok()) return fail(rendezvous.status());
    rendezvous_cpu = ProcessCpuSeconds(bench.coordinator()) - before;
  }

  absl::StatusOr<HeartbeatWindow> window = MeasureHeartbeats(bench, seconds);
  if (!window.ok()) return fail(window.status());
  std::vector<double>& hb = window->beats_ms;
  const double p50 = Percentile(hb, 50), p99 = Percentile(hb, 99);
  absl::StatusOr<std::vector<double>>& api = window->api;

  absl::StatusOr<double> regroup = absl::UnavailableError("skipped");
  absl::StatusOr<double> regroup_cpu = absl::UnavailableError("skipped");
  double relay_regroup_cpu = 0;
  if (absl::GetFlag(FLAGS_regroup)) {
    if (absl::Status s = TimeRegroups(bench, regroups, &regroup, &regroup_cpu, &relay_regroup_cpu);
        !s.ok()) {
      return fail(s);
    }
  }
  std::cout << absl::StrFormat(
                   "coordinator members=%d sessions=%d hb_p50_ms=%.2f hb_p99_ms=%.2f "
                   "rendezvous_s=%s regroup_s=%s rss_mb=%.1f cpu_pct=%.1f "
                   "fsync_delay_ms=%.0f churn_per_s=%d rendezvous_cpu_s=%s regroup_cpu_s=%s "
                   "hb_interval_ms=%u channels=%d",
                   n, bench.sessions(), p50, p99, Seconds(rendezvous), Seconds(regroup),
                   window->rss_mb, window->cpu_pct, absl::ToDoubleMilliseconds(absl::GetFlag(FLAGS_state_sync_delay)),
                   absl::GetFlag(FLAGS_churn_per_second), Seconds(rendezvous_cpu),
                   Seconds(regroup_cpu), bench.interval_ms(), bench.channels())
            << (api.ok() ? absl::StrFormat(" api_p50_ms=%.2f api_p99_ms=%.2f",
                                           Percentile(*api, 50), Percentile(*api, 99))
                         : std::string())
            << (absl::GetFlag(FLAGS_relays) > 0
                    ? absl::StrFormat(
                          " relays=%d relay_cpu_pct=%.1f relay_rss_mb=%.1f relay_regroup_cpu_s=%.3f",
                          absl::GetFlag(FLAGS_relays), window->relay_cpu_pct,
                          bench.RelayRssMb(), relay_regroup_cpu)
                    : std::string())
            << std::endl;
  std::cerr << "(" << hb.size() << " heartbeats measured over " << seconds << " s; "
            << window->churned << " members joined and left)\n";
  return 0;
}

}  // namespace muster
