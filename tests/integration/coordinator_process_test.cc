// The real muster-coordinator and muster binaries as processes: start with
// a token, query with and without it, SIGKILL and restart on the same state
// dir, and check nothing committed was lost and members reattach.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "rpc/credentials.h"
#include "tests/integration/fake_time.h"
#include "tests/integration/lab_hosts.h"
#include "tests/integration/scratch_dir.h"
#include "tests/integration/subprocess.h"
#include "tests/integration/test_member.h"
#include "trainer/client/coordinator_client.h"

namespace muster {
namespace {

const std::string kBin = MUSTER_BIN_DIR;

struct Output {
  int exit_code;
  std::string out;  // stdout and stderr
};

Output RunCommand(const std::string& cmd) {
  Output o;
  o.out = RunShell(cmd, &o.exit_code);
  return o;
}

class ProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/proc" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    RunCommand("rm -rf " + dir_ + " && mkdir -p " + dir_);
    token_file_ = dir_ + "/token";
    std::ofstream(token_file_) << "process-test-token\n";
    ::chmod(token_file_.c_str(), 0600);
    port_ = FreeLoopbackPort();
    target_ = "127.0.0.1:" + std::to_string(port_);
  }

  void TearDown() override {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    hosts_.reset();  // ends what is left in its namespaces
    RemoveScratchUnlessFailed(dir_);
  }

  // The failover tests' two coordinators as hosts of a muster-lab lab
  // (lab_hosts.h), each with a network namespace and an address of its own
  // while they share the state dir (a file system both hosts mount):
  // "coord", where target_ now points, and "standby"; on loopback where the
  // lab cannot start. This process, the members' and the CLI's host,
  // reaches both through the bridge.
  void CoordinatorsInLab() {
    hosts_ = std::make_unique<LabHosts>("ProcessTest", 0,
                                        std::vector<std::string>{"coord", "standby"});
    target_ = absl::StrCat(hosts_->Address("coord"), ":", port_);
  }
  // Whatever a failover test's end, neither coordinator outlives it: the
  // pids still set when it goes out of scope are SIGKILLed and reaped.
  struct Reap {
    pid_t pids[2] = {-1, -1};
    ~Reap() {
      for (pid_t p : pids) {
        if (p > 0 && ::kill(p, SIGKILL) == 0) ::waitpid(p, nullptr, 0);
      }
    }
  };
  std::string StandbyTarget() const {
    return absl::StrCat(hosts_->Address("standby"), ":", FreeLoopbackPort());
  }

  // `wrapper`: a command that runs the coordinator (prlimit ...).
  void StartCoordinator(const std::vector<std::string>& wrapper = {}) {
    std::vector<std::string> argv = wrapper;
    argv.insert(argv.end(),
                {kBin + "/muster-coordinator", "--listen=" + target_,
                 "--state-dir=" + dir_ + "/state", "--token-file=" + token_file_});
    argv.insert(argv.end(), flags_.begin(), flags_.end());
    pid_ = SpawnLogged(argv, dir_ + "/coordinator.log");
    for (int i = 0; i < 100; ++i) {
      if (Cli("status").exit_code == 0) return;
      ::usleep(100'000);
    }
    FAIL() << "coordinator did not come up";
  }

  void KillCoordinator() {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  Output Cli(const std::string& args, bool with_token = true) {
    return RunCommand(kBin + "/muster --coordinator " + target_ +
                      (with_token ? " --token-file " + token_file_ : "") + " " + args);
  }

  // A coordinator on the state dir that a standby may share: listening on
  // `listen`, writing the address file (AddressFile()) once it holds the
  // lease, after `lease_timeout` without beats a standby takes over.
  std::vector<std::string> OnSharedState(const std::string& listen,
                                         const std::string& lease_timeout) const {
    return {kBin + "/muster-coordinator", "--listen=" + listen, "--state-dir=" + dir_ + "/state",
            "--token-file=" + token_file_, "--address-file=" + AddressFile(),
            "--lease-timeout=" + lease_timeout};
  }
  std::string AddressFile() const { return dir_ + "/coordinator.address"; }

  // Waits up to `tenths` tenths of a second for `done`; its last answer.
  static bool WaitFor(const std::function<bool()>& done, int tenths = 200) {
    for (int i = 0; i < tenths && !done(); ++i) ::usleep(100'000);
    return done();
  }

  std::unique_ptr<TestMember> Member(const std::string& id, uint64_t inc,
                                     const std::string& node = "node0") {
    auto ch = *MakeChannel(target_, {});
    return std::make_unique<TestMember>(ch, "process-test-token", id, node, inc);
  }

  // Members a and b join, open their sessions and form a world; its
  // generation (0 after a failed assertion).
  uint64_t FormWorld(TestMember* a, TestMember* b) {
    for (auto* m : {a, b}) {
      EXPECT_TRUE(m->Join().ok());
      EXPECT_TRUE(m->OpenSession().ok());
    }
    absl::StatusOr<v1::RendezvousResponse> rb;
    std::thread t([&] { rb = b->Rendezvous(0, 0); });
    auto ra = a->Rendezvous(0, 0);
    t.join();
    EXPECT_TRUE(ra.ok() && rb.ok());
    return ra.ok() ? ra->world().generation() : 0;
  }

  // Members a and b join, rendezvous, and commit one checkpoint per step.
  void CommitCheckpoints(TestMember* a, TestMember* b, const std::vector<int64_t>& steps) {
    const uint64_t gen = FormWorld(a, b);
    ASSERT_NE(gen, 0u);
    for (int64_t step : steps) {
      uint64_t id = 0;
      for (auto* m : {a, b}) {
        v1::BeginCheckpointRequest begin;
        begin.set_generation(gen);
        begin.set_step(step);
        *begin.mutable_member() = m->ref();
        v1::BeginCheckpointResponse br;
        ASSERT_TRUE(m->stub()->BeginCheckpoint(m->Context().get(), begin, &br).ok());
        id = br.checkpoint_id();
      }
      for (auto* m : {a, b}) {
        v1::ReportShardRequest rep;
        rep.set_checkpoint_id(id);
        *rep.mutable_member() = m->ref();
        auto* f = rep.add_files();
        f->set_path(absl::StrCat("/ckpt/", step, "/", m->ref().member_id(), ".safetensors"));
        f->set_bytes(4096);
        f->set_checksum("0123456789abcdef");
        v1::ReportShardResponse rr;
        ASSERT_TRUE(m->stub()->ReportShard(m->Context().get(), rep, &rr).ok());
      }
    }
  }

  std::string dir_, token_file_, target_;
  int port_ = 0;
  pid_t pid_ = -1;
  std::unique_ptr<LabHosts> hosts_;  // CoordinatorsInLab
  // The coordinator's rules, after its address, state and token.
  std::vector<std::string> flags_ = {"--min-members=2", "--max-members=2",
                                     "--reattach-grace=20s"};
};

TEST_F(ProcessTest, StatusNeedsTheToken) {
  StartCoordinator();
  Output with = Cli("status --json");
  EXPECT_EQ(with.exit_code, 0) << with.out;
  EXPECT_NE(with.out.find("\"job_state\": \"waiting\""), std::string::npos) << with.out;
  Output table = Cli("status");
  EXPECT_EQ(table.exit_code, 0);
  EXPECT_NE(table.out.find("job waiting"), std::string::npos) << table.out;
  Output without = Cli("status --json", /*with_token=*/false);
  EXPECT_NE(without.exit_code, 0);
  EXPECT_NE(without.out.find("UNAUTHENTICATED"), std::string::npos) << without.out;
  Output bad = Cli("frobnicate");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.out.find("unknown command"), std::string::npos);
}

TEST_F(ProcessTest, EventsListsTheLogAsTextOrJsonLines) {
  StartCoordinator();
  auto a = Member("a", 1);
  ASSERT_TRUE(a->Join().ok());
  Output text = Cli("events");
  EXPECT_EQ(text.exit_code, 0) << text.out;
  EXPECT_NE(text.out.find("start "), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("join "), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("a incarnation 1"), std::string::npos) << text.out;
  Output json = Cli("events --json --since 10m");
  EXPECT_EQ(json.exit_code, 0) << json.out;
  EXPECT_NE(json.out.find("{\"unix_ms\":"), std::string::npos) << json.out;
  EXPECT_NE(json.out.find("\"kind\":\"join\""), std::string::npos) << json.out;
  // Nothing is newer than a time in the future.
  Output none = Cli("events --since 2100-01-01T00:00:00Z");
  EXPECT_EQ(none.exit_code, 0) << none.out;
  EXPECT_EQ(none.out.find("join"), std::string::npos) << none.out;
  Output bad = Cli("events --since yesterday");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.out.find("--since yesterday"), std::string::npos) << bad.out;
}

TEST_F(ProcessTest, SigkillAndRestartKeepsCommittedCheckpointsAndGeneration) {
  StartCoordinator();
  auto a = Member("a", 11);
  auto b = Member("b", 22);
  CommitCheckpoints(a.get(), b.get(), {100, 200});
  if (HasFatalFailure()) return;
  Output before = Cli("checkpoints --json");
  ASSERT_EQ(before.exit_code, 0) << before.out;
  ASSERT_NE(before.out.find("\"step\": \"200\""), std::string::npos) << before.out;

  KillCoordinator();
  a.reset();
  b.reset();
  StartCoordinator();
  Output after = Cli("checkpoints --json");
  EXPECT_EQ(after.out, before.out);
  EXPECT_NE(Cli("status --json").out.find("\"job_state\": \"recovering\""), std::string::npos);

  // The same processes (same incarnations) come back; generation 1 goes on.
  auto a2 = Member("a", 11);
  auto b2 = Member("b", 22);
  for (auto* m : {a2.get(), b2.get()}) {
    ASSERT_TRUE(m->Join().ok());
    ASSERT_TRUE(m->OpenSession().ok());
  }
  Output status;
  for (int i = 0; i < 50; ++i) {
    status = Cli("status --json");
    if (status.out.find("\"job_state\": \"running\"") != std::string::npos) break;
    ::usleep(100'000);
  }
  EXPECT_NE(status.out.find("\"job_state\": \"running\""), std::string::npos) << status.out;
  EXPECT_NE(status.out.find("\"generation\": \"1\""), std::string::npos) << status.out;
}

// muster status --watch in a terminal (tmux): the table redraws in place as
// members come, and Ctrl-C ends it cleanly (exit 0).
TEST_F(ProcessTest, StatusWatchRedrawsInPlaceAndEndsOnCtrlC) {
  if (::access("/usr/bin/tmux", X_OK) != 0) GTEST_SKIP() << "tmux is not installed";
  StartCoordinator();
  const std::string tmux = absl::StrCat("tmux -L muster-watch-", ::getpid(), " ");
  const std::string exit_file = dir_ + "/watch.exit";
  RunCommand(tmux + "new-session -d -s watch -x 150 -y 40 \"" + kBin + "/muster --coordinator " +
             target_ + " --token-file " + token_file_ +
             " status --watch --interval 200ms; echo exit=\\$? > " + exit_file + "\"");
  auto pane = [&] { return RunCommand(tmux + "capture-pane -p -t watch").out; };
  auto wait_for = [&](const std::string& text) {
    for (int i = 0; i < 100; ++i) {
      if (pane().find(text) != std::string::npos) return true;
      ::usleep(100'000);
    }
    return false;
  };
  ASSERT_TRUE(wait_for("no members")) << pane();
  EXPECT_NE(pane().find("job waiting"), std::string::npos) << pane();
  auto a = Member("watched-a", 11);
  ASSERT_TRUE(a->Join().ok());
  ASSERT_TRUE(a->OpenSession().ok());
  ASSERT_TRUE(wait_for("watched-a")) << pane();
  // The newest events under the table.
  ASSERT_TRUE(wait_for("watched-a incarnation 11 on node0")) << pane();
  // Redrawn in place: one table on the screen, not one per refresh.
  const std::string screen = pane();
  EXPECT_EQ(Occurrences(screen, "muster status"), 1) << screen;
  RunCommand(tmux + "send-keys -t watch C-c");
  for (int i = 0; i < 50 && ReadText(exit_file).empty(); ++i) ::usleep(100'000);
  EXPECT_EQ(ReadText(exit_file), "exit=0\n");
  RunCommand(tmux + "kill-server");
}

// Failover: a second coordinator on the same state dir waits as a standby
// while the primary's lease beats; when the primary hangs (its node lost),
// the standby takes the lease over, serves the same catalog and rewrites
// the address file clients follow. The old primary, woken up, commits
// nothing and exits 4.
TEST_F(ProcessTest, AStandbyTakesOverFromAHungPrimaryWhichThenCommitsNothing) {
  CoordinatorsInLab();
  const std::string address_file = AddressFile();
  auto coordinator = [&](const std::string& host, const std::string& listen,
                         const std::string& log) {
    std::vector<std::string> argv = hosts_->OnHost(host, OnSharedState(listen, "1s"));
    argv.insert(argv.end(), {"--min-members=2", "--max-members=2"});
    return SpawnLogged(argv, dir_ + "/" + log);
  };
  Reap reap;
  const pid_t primary = reap.pids[0] = coordinator("coord", target_, "primary.log");
  ASSERT_TRUE(WaitFor([&] { return ReadText(address_file) == target_ + "\n"; }))
      << ReadText(dir_ + "/primary.log");
  auto a = Member("a", 11);
  auto b = Member("b", 22);
  CommitCheckpoints(a.get(), b.get(), {100});
  if (HasFatalFailure()) return;
  const std::string cli = kBin + "/muster --coordinator file:" + address_file +
                          " --token-file " + token_file_ + " ";
  const Output before = RunCommand(cli + "checkpoints --json");
  ASSERT_NE(before.out.find("\"step\": \"100\""), std::string::npos) << before.out;

  const std::string standby_target = StandbyTarget();
  const pid_t standby = reap.pids[1] = coordinator("standby", standby_target, "standby.log");
  ASSERT_TRUE(WaitFor([&] {
    return ReadText(dir_ + "/standby.log").find("standby: the lease") != std::string::npos;
  })) << ReadText(dir_ + "/standby.log");
  ::usleep(1'500'000);  // longer than the lease timeout: a beating primary keeps it
  EXPECT_EQ(ReadText(address_file), target_ + "\n");

  ASSERT_EQ(::kill(primary, SIGSTOP), 0);
  auto taken_over = [&](int tenths) {
    for (int i = 0; i < tenths; ++i) {
      if (ReadText(address_file) == standby_target + "\n") return true;
      ::usleep(100'000);
    }
    return ReadText(address_file) == standby_target + "\n";
  };
  // Stopped inside a lease beat, the primary keeps SQLite's write lock and
  // nobody can take over while it lives (docs/failover.md): it is then
  // killed, as a hung node ends up restarted, and the exit-4 check below
  // does not apply.
  bool killed = false;
  if (!taken_over(100)) {
    ASSERT_NE(ReadText(dir_ + "/standby.log").find("database is locked"), std::string::npos)
        << ReadText(dir_ + "/standby.log");
    ::kill(primary, SIGKILL);
    killed = true;
  }
  ASSERT_TRUE(taken_over(200)) << ReadText(dir_ + "/standby.log");
  const Output after = RunCommand(cli + "checkpoints --json");
  EXPECT_EQ(after.out, before.out);
  EXPECT_NE(RunCommand(cli + "status --json").out.find("\"job_state\": \"recovering\""),
            std::string::npos);

  ::kill(primary, SIGCONT);
  const int primary_exit = WaitExit(primary);
  reap.pids[0] = -1;
  if (!killed) {
    EXPECT_EQ(primary_exit, 4) << ReadText(dir_ + "/primary.log");
    EXPECT_NE(ReadText(dir_ + "/primary.log").find("was taken over: epoch 2"), std::string::npos)
        << ReadText(dir_ + "/primary.log");
  }
  EXPECT_EQ(RunCommand(cli + "checkpoints --json").out, before.out);
  ASSERT_EQ(::kill(standby, SIGTERM), 0);
  EXPECT_EQ(WaitExit(standby), 0) << ReadText(dir_ + "/standby.log");
  reap.pids[1] = -1;
}

// A primary cut off from its members while it still reaches the state dir
// (on one host, the state dir is a local disk): it hears from nobody on
// either node, so it fails no member for that silence and lets its lease
// lapse; the standby takes over and finds the world as it was, waiting for
// its members. The primary, which checks the lease while it lets it lapse,
// exits 4. Members that stop beating but keep their streams open are what
// such a cut looks like from the coordinator's side.
TEST_F(ProcessTest, APrimaryThatHearsNoMemberLetsItsLeaseLapseAndFailsNobody) {
  CoordinatorsInLab();
  const std::string address_file = AddressFile();
  auto coordinator = [&](const std::string& host, const std::string& listen,
                         const std::string& log) {
    std::vector<std::string> argv = hosts_->OnHost(host, OnSharedState(listen, "1s"));
    argv.insert(argv.end(), {"--heartbeat-interval=200ms", "--heartbeat-timeout=2s",
                             "--reattach-grace=30s", "--min-members=2", "--max-members=2"});
    return SpawnLogged(argv, dir_ + "/" + log);
  };
  Reap reap;
  const pid_t primary = reap.pids[0] = coordinator("coord", target_, "primary.log");
  ASSERT_TRUE(WaitFor([&] { return ReadText(address_file) == target_ + "\n"; }, 200))
      << ReadText(dir_ + "/primary.log");
  const std::string standby_target = StandbyTarget();
  const pid_t standby = reap.pids[1] = coordinator("standby", standby_target, "standby.log");
  auto a = Member("a", 11, "node0");
  auto b = Member("b", 22, "node1");
  ASSERT_EQ(FormWorld(a.get(), b.get()), 1u);
  ::usleep(1'500'000);  // past the lease timeout: a primary that hears its members keeps it
  ASSERT_EQ(ReadText(address_file), target_ + "\n");

  a->PauseHeartbeats();
  b->PauseHeartbeats();
  ASSERT_TRUE(WaitFor([&] { return ReadText(address_file) == standby_target + "\n"; }, 100))
      << ReadText(dir_ + "/primary.log") << ReadText(dir_ + "/standby.log");
  EXPECT_EQ(WaitExit(primary), 4) << ReadText(dir_ + "/primary.log");
  reap.pids[0] = -1;
  const std::string log = ReadText(dir_ + "/primary.log");
  EXPECT_NE(log.find("no member heard for"), std::string::npos) << log;
  EXPECT_EQ(log.find("no heartbeat for"), std::string::npos) << log;  // nobody failed
  const std::string cli = kBin + "/muster --coordinator file:" + address_file +
                          " --token-file " + token_file_ + " ";
  const Output status = RunCommand(cli + "status --json");
  EXPECT_NE(status.out.find("\"job_state\": \"recovering\""), std::string::npos) << status.out;
  EXPECT_NE(status.out.find("\"generation\": \"1\""), std::string::npos) << status.out;
  ASSERT_EQ(::kill(standby, SIGTERM), 0);
  EXPECT_EQ(WaitExit(standby), 0) << ReadText(dir_ + "/standby.log");
  reap.pids[1] = -1;
}

// Failover with wall clocks that step (libfaketime, ±60 s, on the standby's
// host and then on the primary's): the lease is timed on the monotonic
// clock, so the standby never takes over from the healthy primary, and once
// the primary is dead it takes over within --lease-timeout plus 1 s.
TEST_F(ProcessTest, AWallClockStepNeitherHandsTheLeaseOverNorDelaysATakeover) {
  if (!HaveFakeTime()) GTEST_SKIP() << "libfaketime is not installed (faketime)";
  CoordinatorsInLab();
  const std::string address_file = AddressFile();
  auto coordinator = [&](const std::string& listen, const std::string& name) {
    const std::string host = name == "primary" ? "coord" : name;
    return SpawnLogged(
        Stepped(dir_ + "/" + name + ".clock", hosts_->OnHost(host, OnSharedState(listen, "2s"))),
        dir_ + "/" + name + ".log");
  };
  auto holder_is = [&](const std::string& target, absl::Duration within) {
    const absl::Time end = absl::Now() + within;
    while (ReadText(address_file) != target + "\n" && absl::Now() < end) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    return ReadText(address_file) == target + "\n";
  };
  Reap reap;
  const pid_t primary = reap.pids[0] = coordinator(target_, "primary");
  ASSERT_TRUE(holder_is(target_, absl::Seconds(20))) << ReadText(dir_ + "/primary.log");
  const std::string standby_target = StandbyTarget();
  const pid_t standby = reap.pids[1] = coordinator(standby_target, "standby");
  for (int i = 0; i < 200; ++i) {
    if (ReadText(dir_ + "/standby.log").find("standby: the lease") != std::string::npos) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_NE(ReadText(dir_ + "/standby.log").find("standby: the lease"), std::string::npos)
      << ReadText(dir_ + "/standby.log");
  // Each step is held longer than the lease timeout: the healthy primary
  // keeps the lease through all four.
  for (const std::string host : {"standby", "primary"}) {
    for (const std::string offset : {"-60s", "+60s"}) {
      Step(dir_ + "/" + host + ".clock", offset);
      absl::SleepFor(absl::Seconds(2));
      EXPECT_EQ(ReadText(address_file), target_ + "\n")
          << "the standby took over after the " << host << "'s clock stepped " << offset << "\n"
          << ReadText(dir_ + "/standby.log");
    }
  }
  // Dead (its lease beats stop; SIGKILL leaves no lock on the state file).
  ASSERT_EQ(::kill(primary, SIGKILL), 0);
  const absl::Time killed = absl::Now();
  EXPECT_TRUE(holder_is(standby_target, absl::Seconds(3)))
      << "not taken over within the lease timeout plus 1 s\n" << ReadText(dir_ + "/standby.log");
  ASSERT_TRUE(holder_is(standby_target, absl::Seconds(30))) << ReadText(dir_ + "/standby.log");
  std::cerr << "taken over " << absl::ToDoubleSeconds(absl::Now() - killed)
            << " s after the primary died\n";
  WaitExit(primary);
  reap.pids[0] = -1;
  ASSERT_EQ(::kill(standby, SIGTERM), 0);
  EXPECT_EQ(WaitExit(standby), 0) << ReadText(dir_ + "/standby.log");
  reap.pids[1] = -1;
}

}  // namespace
}  // namespace muster

namespace muster {
namespace {

// Start-up failures end the process with one clear line and a non-zero
// exit: no crash (a failed start used to stop a coordinator that was never
// built: SIGSEGV), no hang (or wait for a server that never ran: forever,
// with SIGTERM blocked).
TEST_F(ProcessTest, EveryFailedStartExitsNonZeroWithOneClearLine) {
  const std::string garbled = dir_ + "/garbled";
  RunCommand("mkdir -p " + garbled + " && head -c 8192 /dev/urandom > " + garbled +
             "/coordinator.db");
  struct Case {
    std::string flags, says;
  };
  const std::vector<Case> cases = {
      {"--min-members=0 --no-auth", "min_members must be at least 1"},
      {"--state-dir=" + garbled + " --no-auth", garbled + "/coordinator.db"},
      {"--listen=no-such-host.invalid:1 --no-auth", "cannot listen on no-such-host.invalid:1"},
      {"--tls-cert=" + dir_ + "/missing.pem --tls-key=" + dir_ + "/missing.key --no-auth",
       "cannot read TLS key file " + dir_ + "/missing.key"},
  };
  for (const Case& c : cases) {
    const Output o = RunCommand("timeout -s KILL 20 " + kBin + "/muster-coordinator --listen=" +
                                target_ + " " + c.flags);
    EXPECT_TRUE(o.exit_code == 1 || o.exit_code == 2) << c.flags << " -> exit " << o.exit_code
                                                       << "\n" << o.out;
    EXPECT_NE(o.out.find(c.says), std::string::npos) << c.flags << "\n" << o.out;
  }
}

// gRPC binds with SO_REUSEPORT by default, so a second coordinator on the
// same port used to start too, and joins split between the two.
TEST_F(ProcessTest, ASecondCoordinatorOnTheSamePortFailsToStart) {
  StartCoordinator();
  const Output o = RunCommand("timeout -s KILL 20 " + kBin + "/muster-coordinator --listen=" +
                              target_ + " --no-auth");
  EXPECT_EQ(o.exit_code, 1) << o.out;
  EXPECT_NE(o.out.find("cannot listen on " + target_), std::string::npos) << o.out;
  EXPECT_EQ(Cli("status").exit_code, 0) << "the first coordinator must still serve";
}

// Every member holds a connection; the soft limit on open files is raised
// to the hard one at start.
TEST_F(ProcessTest, TheOpenFileLimitIsRaisedToTheHardLimit) {
  if (RunCommand("command -v prlimit").exit_code != 0) GTEST_SKIP() << "no prlimit";
  pid_ = SpawnLogged({"/usr/bin/prlimit", "--nofile=256:4096", kBin + "/muster-coordinator",
                      "--listen=" + target_, "--no-auth"},
                     dir_ + "/limits.log");
  std::string limits;
  for (int i = 0; i < 100 && Cli("status").exit_code != 0; ++i) ::usleep(100'000);
  std::ifstream in("/proc/" + std::to_string(pid_) + "/limits");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("Max open files", 0) == 0) limits = line;
  }
  EXPECT_NE(limits.find("4096                 4096"), std::string::npos) << limits;
}

// A client without the token opens more idle connections than the
// coordinator may hold (a hard limit of 1024 open files): gRPC 1.51's
// listener fails accept4 with EMFILE and never polls its socket again. Once
// the flood ends the coordinator serves again, and the members' sessions,
// on connections opened before, lived through it.
TEST_F(ProcessTest, TheListenerComesBackAfterAFileDescriptorFlood) {
  constexpr int kFlood = 1100;
  if (RunCommand("command -v prlimit").exit_code != 0) GTEST_SKIP() << "no prlimit";
  if (!AllowOpenFiles(kFlood + 200)) GTEST_SKIP() << "this test cannot open " << kFlood << " files";
  StartCoordinator({"/usr/bin/prlimit", "--nofile=1024:1024"});
  auto a = Member("a", 1);
  auto b = Member("b", 2);
  CommitCheckpoints(a.get(), b.get(), {100});
  if (HasFatalFailure()) return;

  std::vector<int> flood;
  for (int i = 0; i < kFlood; ++i) {
    if (const int fd = ConnectLoopback(port_); fd >= 0) flood.push_back(fd);
  }
  EXPECT_EQ(flood.size(), static_cast<size_t>(kFlood));
  const std::string log = dir_ + "/coordinator.log";
  const absl::Time out_of_files = absl::Now() + absl::Seconds(10);
  while (ReadText(log).find("Too many open files") == std::string::npos &&
         absl::Now() < out_of_files) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_NE(ReadText(log).find("Too many open files"), std::string::npos)
      << "the flood did not exhaust the coordinator's descriptors";
  for (int fd : flood) ::close(fd);

  // Served again with the token (the bound is generous: the figure is
  // muster-fault fd-flood's).
  Output status;
  const absl::Time end = absl::Now() + absl::Seconds(30);
  while ((status = Cli("status --json")).exit_code != 0 && absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_EQ(status.exit_code, 0) << "not served 30 s after the flood: " << status.out;
  EXPECT_NE(ReadText(log).find("stopped accepting"), std::string::npos);

  // Nothing was lost: the same world, both members active, their sessions
  // open and acknowledged, no failure, the checkpoint still committed.
  EXPECT_NE(status.out.find("\"generation\": \"1\""), std::string::npos) << status.out;
  const std::vector<StatusMember> members = StatusMembers(status.out);
  ASSERT_EQ(members.size(), 2u) << status.out;
  for (const StatusMember& m : members) EXPECT_EQ(m.state, "active") << m.id;
  const int acks = a->acks();
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_GT(a->acks(), acks) << "a's heartbeats are no longer acknowledged";
  EXPECT_FALSE(b->WaitSessionEnd(absl::ZeroDuration()).ok()) << "b's session ended";
  const Output events = Cli("events");
  EXPECT_EQ(events.out.find("fail"), std::string::npos) << events.out;
  EXPECT_NE(Cli("checkpoints --json").out.find("\"step\": \"100\""), std::string::npos);
}

// Regroups answered as deltas, from the coordinator's process: survivors
// derive their place from the world they hold, and a member whose answer
// for one generation was lost (its call gave up just before the world
// completed) holds an older world than the next delta's base, so it fetches
// the whole world (GetWorld) and goes on in it.
TEST_F(ProcessTest, AMemberThatMissedAGenerationFetchesTheWholeWorldAndGoesOn) {
  flags_ = {"--min-members=1", "--max-members=3", "--last-call=5s",
            "--heartbeat-interval=100ms", "--heartbeat-timeout=10s"};
  StartCoordinator();
  auto in = [](absl::Duration d) { return RealClock::Get()->Now() + d; };
  std::vector<std::unique_ptr<CoordinatorClient>> m;
  for (const char* id : {"a", "b", "c"}) {
    ClientOptions c;
    c.target = target_;
    c.token = "process-test-token";
    c.member_id = id;
    c.node = id[0] == 'c' ? "n1" : "n0";
    c.local_rank = id[0] == 'b' ? 1 : 0;
    c.clock = RealClock::Get();
    m.push_back(std::move(CoordinatorClient::Create(c)).value());
    ASSERT_TRUE(m.back()->Join(0, in(absl::Seconds(10))).ok());
    ASSERT_TRUE(m.back()->StartSession([](const SessionNotice&) {}).ok());
  }
  CoordinatorClient* a = m[0].get();
  CoordinatorClient* b = m[1].get();
  CoordinatorClient* c = m[2].get();
  std::vector<absl::StatusOr<WorldInfo>> first(3, absl::UnknownError("not run"));
  {
    std::vector<std::thread> t;
    for (int i = 0; i < 3; ++i) {
      t.emplace_back([&, i] { first[i] = m[i]->Rendezvous(0, 0, in(absl::Seconds(10))); });
    }
    for (auto& x : t) x.join();
  }
  for (const auto& w : first) ASSERT_TRUE(w.ok()) << w.status();
  const uint64_t g1 = first[0]->generation;
  ASSERT_EQ(first[0]->world_size, 3);
  // c leaves: generation 2 is a and b. a arrives but gives up before b
  // does, so a never hears generation 2.
  ASSERT_TRUE(c->Leave(Departure::kLeaving, 0).ok());
  absl::StatusOr<WorldInfo> lost = a->Rendezvous(g1, 0, in(absl::Milliseconds(500)));
  ASSERT_TRUE(absl::IsDeadlineExceeded(lost.status())) << lost.status();
  absl::StatusOr<WorldInfo> g2 = b->Rendezvous(g1, 0, in(absl::Seconds(10)));
  ASSERT_TRUE(g2.ok()) << g2.status();
  EXPECT_EQ(g2->world_size, 2);
  EXPECT_EQ(g2->rank, 1);
  EXPECT_EQ(g2->local_world_size(), 2);
  EXPECT_EQ(b->deltas_applied(), 1u);  // b held generation 1: the delta was enough
  EXPECT_EQ(b->worlds_fetched(), 0u);
  // b leaves too: generation 3 is a alone, told as a delta from generation
  // 2, which a never held.
  ASSERT_TRUE(b->Leave(Departure::kLeaving, 0).ok());
  absl::StatusOr<WorldInfo> g3 = a->Rendezvous(g1, 0, in(absl::Seconds(10)));
  ASSERT_TRUE(g3.ok()) << g3.status();
  EXPECT_EQ(a->worlds_fetched(), 1u);
  EXPECT_EQ(a->deltas_applied(), 0u);
  EXPECT_GT(g3->generation, g2->generation);
  EXPECT_EQ(g3->world_size, 1);
  EXPECT_EQ(g3->rank, 0);
  EXPECT_EQ(g3->self.member_id, "a");
  ASSERT_EQ(g3->node_peers.size(), 1u);
  EXPECT_EQ(g3->local_world_size(), 1);
  // And a goes on in it: the generation's calls take it as a member.
  EXPECT_TRUE(a->Barrier(g3->generation, "after-fetch", in(absl::Seconds(10))).ok());
  EXPECT_TRUE(a->KvSet(g3->generation, "k", "v", in(absl::Seconds(10))).ok());
}

}  // namespace
}  // namespace muster
