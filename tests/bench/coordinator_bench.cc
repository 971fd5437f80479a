// muster-bench coordinator: N simulated members (a session stream each, one
// heartbeat per second) against a real muster-coordinator process on
// loopback. Prints
//   coordinator members=N hb_p50_ms=.. hb_p99_ms=.. rendezvous_s=..
//   coordinator_rss_mb=.. coordinator_cpu_pct=..
// rendezvous_s: from the last Join to every member holding the world
// (min_members = max_members = N); "-" when skipped (--rendezvous=false).
// With --state-sync-delay and --churn-per-second the heartbeats are
// measured while the coordinator writes events to a slow disk.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <fstream>
#include <iostream>
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
#include "rpc/credentials.h"
#include "tests/bench/process_stats.h"

ABSL_FLAG(int, members, 1000, "simulated members");
ABSL_FLAG(int, seconds, 10, "heartbeat measurement window");
ABSL_FLAG(int, channels, 8, "client connections the members share");
ABSL_FLAG(bool, rendezvous, true, "also measure the rendezvous of all members");
ABSL_FLAG(absl::Duration, state_sync_delay, absl::ZeroDuration(),
          "every fsync of the coordinator's state file also waits this long (a slow shared "
          "file system)");
ABSL_FLAG(int, churn_per_second, 0,
          "during the heartbeat window, this many extra members per second join and leave "
          "(each join and leave is an event the coordinator writes)");

namespace muster {
namespace {

constexpr char kToken[] = "bench-token";

// Latencies from all members. Thread-safe.
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

// One member's session: hello, then heartbeats on demand; acks are timed.
class SimSession : public grpc::ClientBidiReactor<v1::SessionRequest, v1::SessionEvent> {
 public:
  SimSession(v1::Coordinator::Stub* stub, const v1::MemberRef& ref, Samples* samples)
      : samples_(samples) {
    AttachToken(&ctx_, kToken);
    stub->async()->Session(&ctx_, this);
    hello_.mutable_hello()->CopyFrom(ref);
    writing_ = true;
    StartWrite(&hello_);
    StartRead(&event_);
    StartCall();
  }

  // Sends a heartbeat unless the previous write is still in flight.
  void Heartbeat() {
    {
      absl::MutexLock lock(&mu_);
      if (writing_ || done_) return;
      writing_ = true;
      hb_.mutable_heartbeat()->set_sequence(++seq_);
      sent_ = absl::Now();
    }
    StartWrite(&hb_);
  }

  void Stop() { ctx_.TryCancel(); }
  void WaitDone() { finished_.WaitForNotification(); }

  void OnWriteDone(bool /*ok*/) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    if (event_.has_ack()) {
      absl::Time sent;
      bool match;
      {
        absl::MutexLock lock(&mu_);
        match = event_.ack().sequence() == seq_;
        sent = sent_;
      }
      if (match) samples_->Add(absl::ToDoubleMilliseconds(absl::Now() - sent));
    }
    StartRead(&event_);
  }
  void OnDone(const grpc::Status& /*s*/) override {
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
    }
    finished_.Notify();
  }

 private:
  Samples* const samples_;
  grpc::ClientContext ctx_;
  v1::SessionRequest hello_, hb_;
  v1::SessionEvent event_;
  absl::Mutex mu_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
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

struct PendingRendezvous {
  grpc::ClientContext ctx;
  v1::RendezvousRequest req;
  v1::RendezvousResponse resp;
};

}  // namespace

int RunCoordinatorBench() {
  const int n = absl::GetFlag(FLAGS_members);
  const int seconds = absl::GetFlag(FLAGS_seconds);
  const bool do_rendezvous = absl::GetFlag(FLAGS_rendezvous);
  if (n <= 0 || seconds <= 0) {
    std::cerr << "muster-bench coordinator: --members and --seconds must be positive\n";
    return 2;
  }
  const std::string dir = "/tmp/muster-bench-coordinator-" + std::to_string(::getpid());
  std::system(("mkdir -p " + dir).c_str());
  const std::string token_file = dir + "/token";
  std::ofstream(token_file) << kToken;
  std::system(("chmod 600 " + token_file).c_str());
  const int port = FreeLoopbackPort();
  const std::string target = "127.0.0.1:" + std::to_string(port);
  const pid_t coordinator = SpawnLogged(
      {SelfDir() + "/muster-coordinator", "--listen=" + target, "--state-dir=" + dir + "/state",
       "--token-file=" + token_file, absl::StrCat("--min-members=", n),
       absl::StrCat("--max-members=", n), "--last-call=0s", "--heartbeat-timeout=60s",
       "--join-timeout=600s",
       "--state-sync-delay=" + absl::FormatDuration(absl::GetFlag(FLAGS_state_sync_delay))},
      dir + "/coordinator.log");

  const int nch = std::max(1, absl::GetFlag(FLAGS_channels));
  std::vector<std::unique_ptr<v1::Coordinator::Stub>> stubs;
  for (int i = 0; i < nch; ++i) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetInt("muster.bench_channel", i);
    stubs.push_back(v1::Coordinator::NewStub(
        grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args)));
  }
  // Wait for the coordinator to answer.
  bool up = false;
  for (int i = 0; i < 200 && !up; ++i) {
    grpc::ClientContext ctx;
    AttachToken(&ctx, kToken);
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Milliseconds(200)));
    v1::GetStatusResponse resp;
    up = stubs[0]->GetStatus(&ctx, v1::GetStatusRequest(), &resp).ok();
    if (!up) absl::SleepFor(absl::Milliseconds(50));
  }
  if (!up) {
    std::cerr << "muster-bench: the coordinator did not start (see " << dir << ")\n";
    StopProcess(coordinator);
    return 1;
  }

  // Join every member (sync calls from a few threads).
  std::vector<v1::MemberRef> refs(n);
  for (int i = 0; i < n; ++i) {
    refs[i].set_member_id(absl::StrCat("node", i / 8, "/", i % 8));
    refs[i].set_incarnation(1000 + i);
  }
  std::atomic<int> next{0}, join_errors{0};
  std::vector<std::thread> joiners;
  for (int t = 0; t < 8; ++t) {
    joiners.emplace_back([&] {
      for (int i = next++; i < n; i = next++) {
        grpc::ClientContext ctx;
        AttachToken(&ctx, kToken);
        v1::JoinRequest req;
        *req.mutable_member() = refs[i];
        req.set_node(absl::StrCat("node", i / 8));
        req.set_local_rank(i % 8);
        v1::JoinResponse resp;
        if (!stubs[i % nch]->Join(&ctx, req, &resp).ok()) ++join_errors;
      }
    });
  }
  for (auto& t : joiners) t.join();
  if (join_errors > 0) {
    std::cerr << "muster-bench: " << join_errors << " joins failed\n";
    StopProcess(coordinator);
    return 1;
  }

  Samples samples;
  std::vector<std::unique_ptr<SimSession>> sessions;
  for (int i = 0; i < n; ++i) {
    sessions.push_back(std::make_unique<SimSession>(stubs[i % nch].get(), refs[i], &samples));
  }

  // Rendezvous: every member asks; the world forms at N.
  std::string rendezvous = "-";
  if (do_rendezvous) {
    std::vector<std::unique_ptr<PendingRendezvous>> pending(n);
    std::atomic<int> answered{0}, failed{0};
    absl::Notification all;
    const absl::Time start = absl::Now();
    for (int i = 0; i < n; ++i) {
      pending[i] = std::make_unique<PendingRendezvous>();
      PendingRendezvous* p = pending[i].get();
      AttachToken(&p->ctx, kToken);
      *p->req.mutable_member() = refs[i];
      p->req.set_timeout_ms(600'000);
      stubs[i % nch]->async()->Rendezvous(&p->ctx, &p->req, &p->resp,
                                          [&, p](grpc::Status s) {
                                            if (!s.ok() || p->resp.world().world_size() !=
                                                               static_cast<uint32_t>(n)) {
                                              ++failed;
                                            }
                                            if (++answered == n) all.Notify();
                                          });
    }
    all.WaitForNotification();
    const double secs = absl::ToDoubleSeconds(absl::Now() - start);
    if (failed > 0) {
      std::cerr << "muster-bench: " << failed << " rendezvous calls failed\n";
      StopProcess(coordinator);
      return 1;
    }
    rendezvous = absl::StrFormat("%.3f", secs);
  }

  // Heartbeats: each member once per second, spread evenly over the second.
  auto beat_for = [&](absl::Duration d) {
    const absl::Time end = absl::Now() + d;
    const absl::Time t0 = absl::Now();
    int64_t sent = 0;
    while (absl::Now() < end) {
      const double elapsed = absl::ToDoubleSeconds(absl::Now() - t0);
      const int64_t due = static_cast<int64_t>(elapsed * n);
      for (; sent < due; ++sent) sessions[sent % n]->Heartbeat();
      absl::SleepFor(absl::Milliseconds(1));
    }
  };
  beat_for(absl::Seconds(2));  // warm-up
  samples.Record(true);
  const double cpu0 = ProcessCpuSeconds(coordinator);
  const absl::Time w0 = absl::Now();
  std::atomic<bool> churning{true};
  std::atomic<int> churned{0};
  std::thread churn([&] { Churn(stubs[0].get(), &churning, &churned); });
  beat_for(absl::Seconds(seconds));
  churning = false;
  churn.join();
  const double cpu_pct =
      100.0 * (ProcessCpuSeconds(coordinator) - cpu0) / absl::ToDoubleSeconds(absl::Now() - w0);
  samples.Record(false);
  const double rss = ProcessRssMb(coordinator);
  std::vector<double> hb = samples.Take();
  const size_t count = hb.size();
  const double p50 = Percentile(hb, 50), p99 = Percentile(hb, 99);

  for (auto& s : sessions) s->Stop();
  for (auto& s : sessions) s->WaitDone();
  StopProcess(coordinator);
  std::system(("rm -rf " + dir).c_str());
  std::cout << absl::StrFormat(
                   "coordinator members=%d hb_p50_ms=%.2f hb_p99_ms=%.2f rendezvous_s=%s "
                   "coordinator_rss_mb=%.1f coordinator_cpu_pct=%.1f fsync_delay_ms=%.0f "
                   "churn_per_s=%d",
                   n, p50, p99, rendezvous, rss, cpu_pct,
                   absl::ToDoubleMilliseconds(absl::GetFlag(FLAGS_state_sync_delay)),
                   absl::GetFlag(FLAGS_churn_per_second))
            << std::endl;
  std::cerr << "(" << count << " heartbeats measured over " << seconds << " s; " << churned
            << " members joined and left)\n";
  return 0;
}

}  // namespace muster
