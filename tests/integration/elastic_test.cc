// Elastic training with muster-train processes: a trainer is SIGKILLed
// mid-run, the survivors regroup and keep training from the state in their
// memory; a replacement joins at a step boundary and takes the state of a
// live peer; everyone ends with bit-identical parameters. Each node is a
// host of a muster-lab lab (docs/lab.md), a network namespace with its own
// address on a bridge, and the coordinator listens on the bridge's address
// here, as on a cluster; where the lab cannot start (no root, no iproute2)
// the nodes share loopback and the test says so once.
#include <sched.h>
#include <signal.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include <gtest/gtest.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/civil_time.h"
#include "absl/time/clock.h"
#include "tests/integration/fake_time.h"
#include "tests/integration/lab_hosts.h"
#include "tests/integration/scratch_dir.h"
#include "tests/integration/subprocess.h"
#include "trainer/checkpoint/safetensors.h"

namespace muster {
namespace {

const std::string kBin = MUSTER_BIN_DIR;

class ElasticTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::access("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", R_OK) != 0) {
      GTEST_SKIP() << "dataset-fashion-mnist is not installed";
    }
    dir_ = ::testing::TempDir() + "/elastic" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::system(("rm -rf " + dir_ + " && mkdir -p " + dir_).c_str());
    hosts_ = std::make_unique<LabHosts>("ElasticTest", 3);
    target_ = absl::StrCat(ListenHost(), ":", FreeLoopbackPort());
    StartCoordinator();
  }
  // Without a state dir: a restarted coordinator knows no member.
  void StartCoordinator() {
    std::vector<std::string> argv = CoordinatorPrefix();
    for (std::string arg :
         {kBin + "/muster-coordinator", "--listen=" + target_, Auth(),
          absl::StrCat("--min-members=", MinMembers()),
          absl::StrCat("--max-members=", MaxMembers()), std::string("--last-call=200ms"),
          std::string("--heartbeat-interval=200ms"), "--heartbeat-timeout=" + HeartbeatTimeout(),
          std::string("--keep-last=0")}) {
      argv.push_back(std::move(arg));
    }
    if (!StateDir().empty()) argv.push_back("--state-dir=" + StateDir());
    const size_t from = ReadText(dir_ + "/coordinator.log").size();
    coordinator_ = SpawnLogged(argv, dir_ + "/coordinator.log");
    // Nodes started before it listens only retry; but one that never does
    // (its port taken since FreeLoopbackPort) would leave them retrying
    // until the test's own timeouts, with nothing in their logs to say why.
    ASSERT_TRUE(
        WaitForLine("coordinator", "coordinator listening on port", absl::Seconds(30), from))
        << ReadText(dir_ + "/coordinator.log");
  }
  void TearDown() override {
    if (coordinator_ > 0) {
      ::kill(coordinator_, SIGTERM);
      WaitExit(coordinator_);
    }
    hosts_.reset();  // ends what is left in its namespaces
    RemoveScratchUnlessFailed(dir_);
  }

  // `extra`: more flags (a flag given twice takes the last value).
  pid_t Trainer(int local, const std::string& tag, const std::string& node = "n",
                const std::string& backend = "auto", const std::vector<std::string>& extra = {}) {
    return SpawnLogged(TrainerArgv(local, tag, node, backend, extra),
                       absl::StrCat(dir_, "/", tag, ".log"));
  }
  std::vector<std::string> TrainerArgv(int local, const std::string& tag, const std::string& node,
                                       const std::string& backend,
                                       const std::vector<std::string>& extra) {
    std::vector<std::string> argv = hosts_->OnNode(
        node, {kBin + "/muster-train", "--coordinator=" + target_, "--node-id=" + node,
               absl::StrCat("--local-rank=", local), "--model=mlp", "--steps=250",
               "--batch-size=32", "--log-every=10", "--threads=1", "--backend=" + backend,
               absl::StrCat("--job=el", ::getpid()),
               absl::StrCat("--summary-json=", dir_, "/", tag, ".json")});
    argv.insert(argv.end(), extra.begin(), extra.end());
    return argv;
  }

  // Until the log of `tag` shows `text` at or after byte `from`.
  bool WaitForLine(const std::string& tag, const std::string& text, absl::Duration timeout,
                   size_t from = 0) {
    const absl::Time end = absl::Now() + timeout;
    while (absl::Now() < end) {
      if (ReadText(dir_ + "/" + tag + ".log").find(text, from) != std::string::npos) return true;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return false;
  }

  // Until the log of `tag` shows a step of at least `step`.
  bool WaitForStep(const std::string& tag, int step, absl::Duration timeout) {
    const absl::Time end = absl::Now() + timeout;
    while (absl::Now() < end) {
      if (LatestLoggedStep(ReadText(dir_ + "/" + tag + ".log")) >= step) return true;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return false;
  }

  // The address the coordinator listens on (and relays, where a test starts
  // one): the bridge of the test's lab, or loopback.
  std::string ListenHost() const { return hosts_->Gateway(); }
  // What the coordinator's command line begins with (a wrapper), if anything.
  virtual std::vector<std::string> CoordinatorPrefix() const { return {}; }
  // The coordinator's flag for its job token.
  virtual std::string Auth() const { return "--no-auth"; }
  virtual int MinMembers() const { return 2; }
  virtual int MaxMembers() const { return 3; }
  virtual std::string HeartbeatTimeout() const { return "2s"; }
  // Where the coordinator keeps its state (a requeued job's); none: empty.
  virtual std::string StateDir() const { return ""; }

  std::string dir_, target_;
  pid_t coordinator_ = -1;
  std::unique_ptr<LabHosts> hosts_;
};

TEST_F(ElasticTest, AHungTrainerIsFencedThenRejoinsAsANewIncarnation) {
  std::vector<pid_t> pids = {Trainer(0, "h0"), Trainer(1, "h1"), Trainer(2, "h2")};
  ASSERT_TRUE(WaitForStep("h0", 30, absl::Seconds(60))) << ReadText(dir_ + "/h0.log");
  // A trainer that starts late finds a world of two already training: only
  // a world of two after the stop says that the others went on without it.
  const size_t before = ReadText(dir_ + "/h0.log").size();
  ASSERT_EQ(::kill(pids[2], SIGSTOP), 0);
  // Past the 2 s heartbeat timeout the others go on without it.
  ASSERT_TRUE(WaitForLine("h0", "world 2 on 1 nodes", absl::Seconds(30), before))
      << ReadText(dir_ + "/h0.log");
  ASSERT_EQ(::kill(pids[2], SIGCONT), 0);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(WaitExit(pids[i]), 0) << ReadText(absl::StrCat(dir_, "/h", i, ".log"));
  }
  EXPECT_NE(ReadText(dir_ + "/h2.log").find("rejoining as a new incarnation"), std::string::npos)
      << ReadText(dir_ + "/h2.log");
  const std::string s0 = ReadText(dir_ + "/h0.json"), s2 = ReadText(dir_ + "/h2.json");
  EXPECT_EQ(JsonNumber(s0, "world_size"), "3") << s0;
  EXPECT_EQ(JsonNumber(s0, "parameter_checksum"), JsonNumber(s2, "parameter_checksum"));
  EXPECT_EQ(JsonNumber(s0, "parameter_checksum"), JsonNumber(ReadText(dir_ + "/h1.json"), "parameter_checksum"));
}

// Two trainers named only by --node-id/--local-rank: no launcher says that
// they share a node, the world does, and each then takes its half of the
// CPUs, not all of them (OpenMP workers spinning against the other's).
TEST_F(ElasticTest, TrainersOfOneNodeShareItsCpusOnceTheWorldSaysTheyShareIt) {
  cpu_set_t cpus;
  ASSERT_EQ(::sched_getaffinity(0, sizeof(cpus), &cpus), 0);
  const int expected = std::max(1, CPU_COUNT(&cpus) / 2);
  ::unsetenv("OMP_NUM_THREADS");
  const std::vector<std::string> flags = {"--threads=0", "--steps=20"};
  std::vector<pid_t> pids = {Trainer(0, "s0", "n", "auto", flags),
                             Trainer(1, "s1", "n", "auto", flags)};
  for (int i = 0; i < 2; ++i) {
    const std::string tag = absl::StrCat("s", i);
    ASSERT_EQ(WaitExit(pids[i]), 0) << ReadText(dir_ + "/" + tag + ".log");
    const std::string summary = ReadText(dir_ + "/" + tag + ".json");
    EXPECT_EQ(JsonNumber(summary, "intra_op_threads"), std::to_string(expected)) << summary;
  }
}

class ElasticScaleDownTest : public ElasticTest {
 protected:
  int MinMembers() const override { return 1; }
};

TEST_F(ElasticScaleDownTest, SigtermAndDrainLeaveGracefullyAndTheRestGoesOn) {
  std::vector<pid_t> pids = {Trainer(0, "a", "n"), Trainer(1, "b", "n"), Trainer(0, "c", "z")};
  ASSERT_TRUE(WaitForStep("a", 30, absl::Seconds(60))) << ReadText(dir_ + "/a.log");
  // SIGTERM to one trainer: it leaves at a step boundary, nothing aborts.
  ASSERT_EQ(::kill(pids[1], SIGTERM), 0);
  EXPECT_EQ(WaitExit(pids[1]), 0) << ReadText(dir_ + "/b.log");
  EXPECT_NE(ReadText(dir_ + "/b.log").find("left the job"), std::string::npos);
  ASSERT_TRUE(WaitForLine("a", "world 2 on 2 nodes", absl::Seconds(30))) << ReadText(dir_ + "/a.log");
  // Drain node z: its trainer leaves too; the last one finishes alone.
  int code = -1;
  const std::string out = RunShell(kBin + "/muster --coordinator " + target_ + " drain z", &code);
  EXPECT_EQ(code, 0) << out;
  EXPECT_EQ(WaitExit(pids[2]), 0) << ReadText(dir_ + "/c.log");
  EXPECT_NE(ReadText(dir_ + "/c.log").find("left the job"), std::string::npos) << ReadText(dir_ + "/c.log");
  EXPECT_EQ(WaitExit(pids[0]), 0) << ReadText(dir_ + "/a.log");
  const std::string s0 = ReadText(dir_ + "/a.json");
  EXPECT_EQ(JsonNumber(s0, "steps"), "250") << s0;
  EXPECT_EQ(JsonNumber(s0, "world_size"), "1") << s0;
  const std::string log = ReadText(dir_ + "/a.log");
  EXPECT_EQ(log.find("dropped"), std::string::npos) << "a graceful leave must not abort a step\n"
                                                    << log;
}

TEST_F(ElasticTest, SurvivorsKeepTrainingAndAReplacementPullsTheirState) {
  // 1,000 steps, not 250: the survivors must still be training when the
  // replacement, a new process, has started and joined. Under load 220
  // steps of the MLP went by first, and the replacement found the job done.
  const std::vector<std::string> steps = {"--steps=1000"};
  std::vector<pid_t> pids = {Trainer(0, "t0", "n", "auto", steps),
                             Trainer(1, "t1", "n", "auto", steps),
                             Trainer(2, "t2", "n", "auto", steps)};
  ASSERT_TRUE(WaitForStep("t0", 30, absl::Seconds(60))) << ReadText(dir_ + "/t0.log");
  // The first world may form with two (a third trainer slower to start
  // than the last call): t2 is killed once it trains with the others.
  ASSERT_TRUE(WaitForLine("t0", "world 3 on 1 nodes", absl::Seconds(60)))
      << ReadText(dir_ + "/t0.log");
  const size_t full = ReadText(dir_ + "/t0.log").find("world 3 on 1 nodes");
  ASSERT_EQ(::kill(pids[2], SIGKILL), 0);
  WaitExit(pids[2]);
  // The survivors regroup into a world of two and go on.
  ASSERT_TRUE(WaitForLine("t0", "world 2 on 1 nodes", absl::Seconds(30), full))
      << ReadText(dir_ + "/t0.log");
  // A replacement (same slot, new process) joins at a step boundary.
  const pid_t replacement = Trainer(2, "t2b", "n", "auto", steps);
  EXPECT_EQ(WaitExit(pids[0]), 0) << ReadText(dir_ + "/t0.log");
  EXPECT_EQ(WaitExit(pids[1]), 0) << ReadText(dir_ + "/t1.log");
  EXPECT_EQ(WaitExit(replacement), 0) << ReadText(dir_ + "/t2b.log");
  const std::string s0 = ReadText(dir_ + "/t0.json"), s1 = ReadText(dir_ + "/t1.json"),
                    s2 = ReadText(dir_ + "/t2b.json");
  EXPECT_EQ(JsonNumber(s0, "steps"), "1000") << s0;
  EXPECT_GE(std::stoi(JsonNumber(s0, "regroups")), 2) << s0;  // the failure, then the join
  EXPECT_EQ(JsonNumber(s0, "world_size"), "3") << s0;
  // Bit-identical parameters everywhere, the replacement included.
  EXPECT_EQ(JsonNumber(s0, "parameter_checksum"), JsonNumber(s1, "parameter_checksum"));
  EXPECT_EQ(JsonNumber(s0, "parameter_checksum"), JsonNumber(s2, "parameter_checksum"));
  // The replacement entered at the survivors' step, not at zero: the
  // world of 3 after the world of 2 (the first world may have been 2 too,
  // with a third trainer slower to start than the last call).
  const std::string log0 = ReadText(dir_ + "/t0.log");
  const size_t survivors = log0.rfind("world 2 on 1 nodes");
  ASSERT_NE(survivors, std::string::npos) << log0;
  const std::string after = log0.substr(survivors);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(after, m, std::regex("world 3 on 1 nodes[^\\n]*step ([1-9][0-9]*)")))
      << log0;
  EXPECT_GT(std::stoi(m[1]), 30);
  EXPECT_EQ(JsonNumber(s2, "steps"), "1000") << s2;
}

class ElasticFullWorldTest : public ElasticTest {
 protected:
  int MinMembers() const override { return 1; }
  int MaxMembers() const override { return 1; }
};

// A spare waits for a place as long as the job runs, past its rendezvous
// timeout too, renewing its wait every 2 s. Found by muster-bench recovery:
// past the timeout it renewed the wait without pause and spun a core.
TEST_F(ElasticFullWorldTest, ASparePastItsRendezvousTimeoutWaitsWithoutSpinning) {
  const pid_t a = Trainer(0, "a", "n", "auto", {"--steps=10000000"});
  ASSERT_TRUE(WaitForStep("a", 10, absl::Seconds(60))) << ReadText(dir_ + "/a.log");
  const pid_t b = Trainer(0, "b", "m", "auto", {"--rendezvous-timeout=0.5"});
  ASSERT_TRUE(WaitForLine("coordinator", "(a spare: the world is full)", absl::Seconds(30)))
      << ReadText(dir_ + "/b.log");
  absl::SleepFor(absl::Seconds(2));  // well past its rendezvous timeout
  const double before = ProcessCpuSeconds(b);
  absl::SleepFor(absl::Seconds(2));
  const double used = ProcessCpuSeconds(b) - before;
  EXPECT_EQ(::waitpid(b, nullptr, WNOHANG), 0) << "a spare waits while the job runs\n"
                                              << ReadText(dir_ + "/b.log");
  EXPECT_LT(used, 0.3) << "the waiting spare used " << used << " s of CPU in 2 s";
  ::kill(a, SIGTERM);
  ::kill(b, SIGTERM);
  WaitExit(a);
  WaitExit(b);
}

// Three nodes of one trainer each (hier: shared memory inside a node, Gloo
// across). A node that lost nobody keeps its node-local communicator
// through the failure of another node's trainer and through the join of
// its replacement (node_comm.h); the job ends as one.
TEST_F(ElasticTest, NodesThatLostNobodyKeepTheirCommunicatorThroughAFailureAndAJoin) {
  std::vector<pid_t> pids = {Trainer(0, "k0", "n0", "hier"), Trainer(0, "k1", "n1", "hier"),
                             Trainer(0, "k2", "n2", "hier")};
  ASSERT_TRUE(WaitForLine("k0", "world 3 on 3 nodes", absl::Seconds(60)))
      << ReadText(dir_ + "/k0.log");
  ASSERT_TRUE(WaitForStep("k0", 30, absl::Seconds(60))) << ReadText(dir_ + "/k0.log");
  ASSERT_EQ(::kill(pids[2], SIGKILL), 0);
  WaitExit(pids[2]);
  ASSERT_TRUE(WaitForLine("k0", "world 2 on 2 nodes", absl::Seconds(30)))
      << ReadText(dir_ + "/k0.log");
  const pid_t replacement = Trainer(0, "k2b", "n2", "hier");
  EXPECT_EQ(WaitExit(pids[0]), 0) << ReadText(dir_ + "/k0.log");
  EXPECT_EQ(WaitExit(pids[1]), 0) << ReadText(dir_ + "/k1.log");
  EXPECT_EQ(WaitExit(replacement), 0) << ReadText(dir_ + "/k2b.log");
  for (const char* tag : {"k0", "k1"}) {
    const std::string log = ReadText(dir_ + "/" + tag + ".log");
    EXPECT_GE(Occurrences(log, "kept this node's communicator (shm of 1 rank) from generation"), 2)
        << tag << "\n" << log;
  }
  EXPECT_EQ(Occurrences(ReadText(dir_ + "/k2b.log"), "kept this node's communicator"), 0);
  const std::string s0 = ReadText(dir_ + "/k0.json");
  EXPECT_EQ(JsonNumber(s0, "steps"), "250") << s0;
  EXPECT_EQ(JsonNumber(s0, "world_size"), "3") << s0;
  for (const char* tag : {"k1", "k2b"}) {
    EXPECT_EQ(JsonNumber(ReadText(dir_ + "/" + tag + ".json"), "parameter_checksum"),
              JsonNumber(s0, "parameter_checksum"))
        << tag;
  }
}

// Nodes whose host names resolve nowhere (a root without /etc/hosts, as
// debootstrap makes it) train together without being told an address: each
// is reached where the coordinator sees it, for Gloo and for its weights.
class UnresolvableHostTest : public ElasticTest {
 protected:
  void SetUp() override {
    int code = -1;
    RunShell("unshare --uts true", &code);
    if (code != 0) GTEST_SKIP() << "needs root for a UTS namespace (unshare --uts)";
    ElasticTest::SetUp();
  }
  std::string Auth() const override {
    const std::string token_file = dir_ + "/token";
    std::ofstream(token_file) << "unresolvable-host-token";
    ::chmod(token_file.c_str(), 0600);
    return "--token-file=" + token_file;
  }
  int MaxMembers() const override { return 2; }
  // muster-train with host name `host` (and no --node-id: the host name is
  // the node) in a UTS namespace of its own.
  pid_t TrainerOn(const std::string& host, const std::string& tag) {
    return SpawnLogged(
        hosts_->OnNode(host, {"/usr/bin/unshare", "--uts", "/bin/sh", "-c",
                              "hostname \"$0\" && exec \"$@\"", host, kBin + "/muster-train",
                              "--coordinator=" + target_, "--token-file=" + dir_ + "/token",
                              "--model=mlp", "--steps=200", "--batch-size=32", "--log-every=10",
                              "--threads=1", "--backend=gloo",
                              absl::StrCat("--job=uh", ::getpid()),
                              absl::StrCat("--summary-json=", dir_, "/", tag, ".json")}),
        absl::StrCat(dir_, "/", tag, ".log"));
  }
};

TEST_F(UnresolvableHostTest, TwoNodesTrainAndServeWeightsWithoutAnAddress) {
  const pid_t a = TrainerOn("node-a.invalid", "a"), b = TrainerOn("node-b.invalid", "b");
  ASSERT_TRUE(WaitForLine("a", "world 2 on 2 nodes", absl::Seconds(60)))
      << ReadText(dir_ + "/a.log");
  ASSERT_TRUE(WaitForStep("a", 20, absl::Seconds(60))) << ReadText(dir_ + "/a.log");
  int code = -1;
  const std::string out = RunShell(absl::StrCat(kBin, "/muster --coordinator ", target_,
                                                " --token-file ", dir_, "/token pull-weights --out ",
                                                dir_, "/pulled.safetensors"),
                                   &code);
  EXPECT_EQ(code, 0) << out;
  EXPECT_EQ(WaitExit(a), 0) << ReadText(dir_ + "/a.log");
  EXPECT_EQ(WaitExit(b), 0) << ReadText(dir_ + "/b.log");
  const std::string sa = ReadText(dir_ + "/a.json"), sb = ReadText(dir_ + "/b.json");
  EXPECT_EQ(JsonNumber(sa, "steps"), "200") << sa;
  EXPECT_EQ(JsonNumber(sa, "world_size"), "2") << sa;
  EXPECT_EQ(JsonNumber(sa, "parameter_checksum"), JsonNumber(sb, "parameter_checksum"));
}

// One process's wall clock steps (tests/integration/fake_time.h): timeouts
// are measured on the monotonic clock, so the step neither hides a stopped
// trainer nor breaks a healthy world.

// How far ahead of this process's clock the wall time stamped on the log
// line of `log` that holds offset `at` is, in seconds ("I 14:12:26.580 ..."
// lines; 0 when there is none).
double SecondsAhead(const std::string& log, size_t at) {
  if (at == std::string::npos) return 0;
  const size_t newline = log.rfind('\n', at);
  const size_t line = newline == std::string::npos ? 0 : newline + 1;
  int h = 0, m = 0;
  double sec = 0;
  if (std::sscanf(log.c_str() + line + 2, "%d:%d:%lf", &h, &m, &sec) != 3) return 0;
  const absl::CivilSecond now = absl::ToCivilSecond(absl::Now(), absl::LocalTimeZone());
  double ahead = (h * 3600 + m * 60 + sec) - (now.hour() * 3600 + now.minute() * 60 + now.second());
  if (ahead > 43200) ahead -= 86400;
  if (ahead < -43200) ahead += 86400;
  return ahead;
}

class WallClockStepTest : public ElasticTest {
 protected:
  void SetUp() override {
    if (!HaveFakeTime()) GTEST_SKIP() << "libfaketime is not installed (faketime)";
    ElasticTest::SetUp();
  }
  // How far ahead of this process's clock the log line of `tag` holding
  // `text` is stamped, in seconds.
  double StampedAhead(const std::string& tag, const std::string& text) {
    const std::string log = ReadText(dir_ + "/" + tag + ".log");
    return SecondsAhead(log, log.find(text));
  }
};

class CoordinatorClockStepTest : public WallClockStepTest {
 protected:
  std::vector<std::string> CoordinatorPrefix() const override {
    return Stepped(dir_ + "/coordinator.offset", {});
  }
  void StopATrainerAfterAStep(const std::string& offset, double expected_ahead_s);
};

// Steps the coordinator's clock by `offset`, then SIGSTOPs a trainer: the
// coordinator must find it within the heartbeat timeout (2 s) and a second.
void CoordinatorClockStepTest::StopATrainerAfterAStep(const std::string& offset,
                                                      double expected_ahead_s) {
  std::vector<pid_t> pids = {Trainer(0, "s0", "n", "auto", {"--compute-ms=5"}),
                             Trainer(1, "s1", "n", "auto", {"--compute-ms=5"}),
                             Trainer(2, "s2", "n", "auto", {"--compute-ms=5"})};
  ASSERT_TRUE(WaitForStep("s0", 20, absl::Seconds(60))) << ReadText(dir_ + "/s0.log");
  Step(dir_ + "/coordinator.offset", offset);
  ASSERT_EQ(::kill(pids[2], SIGSTOP), 0);
  const absl::Time stopped = absl::Now();
  const bool found = WaitForLine("coordinator", "no heartbeat for", absl::Seconds(20));
  const absl::Duration took = absl::Now() - stopped;
  ASSERT_EQ(::kill(pids[2], SIGCONT), 0);
  ASSERT_TRUE(found) << "the stop was not found in 20 s\n" << ReadText(dir_ + "/coordinator.log");
  EXPECT_LE(took, absl::Seconds(3)) << ReadText(dir_ + "/coordinator.log");
  // The coordinator's wall clock did step: its line is stamped off by it.
  EXPECT_NEAR(StampedAhead("coordinator", "no heartbeat for"), expected_ahead_s, 5);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(WaitExit(pids[i]), 0) << ReadText(absl::StrCat(dir_, "/s", i, ".log"));
  }
}

TEST_F(CoordinatorClockStepTest, AStoppedTrainerIsFoundInTimeAfterTheWallClockSteppedBack) {
  StopATrainerAfterAStep("-60s", -60);
}

// Forward, the coordinator's ticker (heartbeat expiry) must not stall: absl's
// timed waits end at a wall clock deadline, which would then lie a minute
// ahead of the kernel's clock (as after a real step back).
TEST_F(CoordinatorClockStepTest, AStoppedTrainerIsFoundInTimeAfterTheWallClockSteppedForward) {
  StopATrainerAfterAStep("+60s", 60);
}

class TrainerClockStepTest : public WallClockStepTest {
 protected:
  int MinMembers() const override { return 4; }
  int MaxMembers() const override { return 4; }
};

TEST_F(TrainerClockStepTest, ATrainersWallClockSteppingForwardBreaksNoWorld) {
  const std::vector<std::string> slow = {"--steps=400", "--compute-ms=10"};
  // f0, rank 0, writes metrics with their wall time: they show its step.
  std::vector<std::string> logged = slow;
  logged.push_back("--log-dir=" + dir_ + "/f0-metrics");
  const std::string offset = dir_ + "/f0.offset";
  std::vector<pid_t> pids = {
      SpawnLogged(Stepped(offset, TrainerArgv(0, "f0", "a", "hier", logged)), dir_ + "/f0.log"),
      Trainer(1, "f1", "a", "hier", slow), Trainer(0, "f2", "b", "hier", slow),
      Trainer(1, "f3", "b", "hier", slow)};
  ASSERT_TRUE(WaitForStep("f0", 30, absl::Seconds(60))) << ReadText(dir_ + "/f0.log");
  Step(offset, "+60s");
  const absl::Time stepped = absl::Now();
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(WaitExit(pids[i]), 0) << ReadText(absl::StrCat(dir_, "/f", i, ".log"));
  }
  // f0's clock did step: its last record is stamped a minute ahead.
  const std::string metrics = ReadText(dir_ + "/f0-metrics/metrics.jsonl");
  const std::string last = metrics.substr(metrics.rfind('{'));
  const double wall = std::stod(JsonNumber(last, "time"));
  EXPECT_GT(wall, absl::ToUnixMillis(stepped) / 1000.0 + 50) << last;
  const std::string coordinator = ReadText(dir_ + "/coordinator.log");
  EXPECT_EQ(Occurrences(coordinator, "broken-world report"), 0) << coordinator;
  for (int i = 0; i < 4; ++i) {
    const std::string log = ReadText(absl::StrCat(dir_, "/f", i, ".log"));
    EXPECT_EQ(Occurrences(log, "generation 2"), 0) << "f" << i << " regrouped:\n" << log;
  }
  const std::string s0 = ReadText(dir_ + "/f0.json");
  EXPECT_EQ(JsonNumber(s0, "steps"), "400") << s0;
  EXPECT_EQ(JsonNumber(ReadText(dir_ + "/f1.json"), "parameter_checksum"),
            JsonNumber(s0, "parameter_checksum"));
}

// Agent-launched jobs: two nodes, each a muster-agent with two trainers,
// each node a host of the lab (see the top of this file).
class AgentTest : public ElasticTest {
 protected:
  int MaxMembers() const override { return 4; }

  // `node_session`: the agent holds the node's session for its trainers
  // (--coordinator); otherwise each trainer holds its own.
  pid_t Agent(const std::string& node, int steps = 400, bool node_session = true) {
    return SpawnLogged(AgentArgv(node, steps, node_session), absl::StrCat(dir_, "/", node, ".log"));
  }
  std::vector<std::string> AgentArgv(const std::string& node, int steps, bool node_session,
                                     const std::vector<std::string>& extra = {}) {
    std::vector<std::string> argv =
        hosts_->OnNode(node, {kBin + "/muster-agent", "--nproc-per-node=2",
                              "--restart-backoff=100ms", "--max-restarts=2", "--node-id=" + node});
    argv.insert(argv.end(), agent_flags_.begin(), agent_flags_.end());
    const std::string coordinator = via_.empty() ? target_ : via_;
    if (node_session) argv.push_back("--coordinator=" + coordinator);
    const std::vector<std::string> trainer = {
        "--", kBin + "/muster-train", "--coordinator=" + coordinator, "--model=mlp",
        absl::StrCat("--steps=", steps), "--batch-size=32", "--log-every=10", "--threads=1",
        "--backend=auto", absl::StrCat("--job=ag", ::getpid(), node),
        "--summary-json=" + dir_ + "/{node}{local_rank}.json"};
    argv.insert(argv.end(), trainer.begin(), trainer.end());
    argv.insert(argv.end(), extra.begin(), extra.end());
    return argv;
  }

  std::vector<std::string> agent_flags_;  // before the trainer's command
  // Where agents and trainers reach the coordinator, when not at target_.
  std::string via_;

  // The logs of both nodes and the coordinator, for a world that did not
  // form: which side stopped short is in one of them.
  std::string NodeLogs() {
    std::string out;
    for (const char* tag : {"a", "b", "coordinator"}) {
      absl::StrAppend(&out, "--- ", tag, ".log\n", ReadText(dir_ + "/" + tag + ".log"));
    }
    return out;
  }

  // Either node may form a world of its own first: waits for the full one
  // of nodes a and b, then for node a's log to show `step`.
  void WaitForBothNodesAtStep(int step) {
    ASSERT_TRUE(WaitForLine("a", "world 4 on 2 nodes", absl::Seconds(60))) << NodeLogs();
    ASSERT_TRUE(WaitForStep("a", step, absl::Seconds(60))) << ReadText(dir_ + "/a.log");
  }

  // The pid of trainer `slot` as the agent of `node` last started it.
  pid_t TrainerPid(const std::string& node, int slot) {
    return LastTrainerPid(absl::StrCat(dir_, "/", node, ".log"), slot);
  }

  // Every member's summary holds the same parameter checksum.
  void ExpectEqualParameters(const std::vector<std::string>& members) {
    std::vector<std::string> sums;
    for (const std::string& m : members) {
      sums.push_back(JsonNumber(ReadText(dir_ + "/" + m + ".json"), "parameter_checksum"));
    }
    EXPECT_FALSE(sums[0].empty()) << "no summary of " << members[0];
    for (size_t i = 1; i < sums.size(); ++i) {
      EXPECT_EQ(sums[i], sums[0]) << members[i] << " differs from " << members[0];
    }
  }

  // Steps in the order a log printed them ("step N/M").
  std::vector<int> Steps(const std::string& node) {
    const std::string log = ReadText(absl::StrCat(dir_, "/", node, ".log"));
    std::vector<int> out;
    std::regex re("\\bstep ([0-9]+)/");
    for (auto it = std::sregex_iterator(log.begin(), log.end(), re); it != std::sregex_iterator();
         ++it) {
      out.push_back(std::stoi((*it)[1]));
    }
    return out;
  }
};

bool Gone(pid_t pid) {
  const std::string stat = ReadText(absl::StrCat("/proc/", pid, "/stat"));
  return stat.empty() || stat.find(") Z ") != std::string::npos;
}

// Tasks (processes and threads) whose real user id is `uid`: what
// RLIMIT_NPROC counts.
int TasksOfUser(uid_t uid) {
  int n = 0;
  const std::string want = absl::StrCat("Uid:\t", uid, "\t");
  std::string out;
  int code = 0;
  out = RunShell("cat /proc/[0-9]*/task/[0-9]*/status 2>/dev/null | grep '^Uid:'", &code);
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) n += line.rfind(want, 0) == 0 ? 1 : 0;
  return n;
}

// A copy of `program` that every user may run, for a test that runs it as
// another user: the build tree may lie where that user cannot reach (a
// checkout under a home of mode 0700). The copy, mode 0755, sits in a fresh
// directory of mode 0755 under /tmp; both go when this is destroyed.
class PublicCopy {
 public:
  explicit PublicCopy(const std::string& program) {
    char dir[] = "/tmp/muster-public.XXXXXX";
    if (::mkdtemp(dir) == nullptr) {  // 0700 until the copy is in place
      error_ = absl::StrCat("cannot make a directory under /tmp: ", std::strerror(errno));
      return;
    }
    dir_ = dir;
    const std::string copy = dir_ + "/" + program.substr(program.rfind('/') + 1);
    std::error_code error;
    std::filesystem::copy_file(program, copy, error);
    if (!error) std::filesystem::permissions(copy, kPublic, error);
    if (!error) std::filesystem::permissions(dir_, kPublic, error);
    if (error) {
      error_ = absl::StrCat("cannot copy ", program, " to ", dir_, ": ", error.message());
      return;
    }
    path_ = copy;
  }
  ~PublicCopy() {
    std::error_code ignored;  // a leftover in /tmp fails no test
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ignored);
  }
  PublicCopy(const PublicCopy&) = delete;
  PublicCopy& operator=(const PublicCopy&) = delete;

  // The copy; "" when it could not be made, and then error() says why.
  const std::string& path() const { return path_; }
  const std::string& error() const { return error_; }

 private:
  static constexpr std::filesystem::perms kPublic = static_cast<std::filesystem::perms>(0755);
  std::string dir_;
  std::string path_;
  std::string error_;
};

// Why the user that `as_user` (a command prefix, such as setpriv's) switches
// to cannot run `program`: it may not execute the file, or the dynamic
// loader finds not all of its libraries (a RUNPATH into a private
// directory, such as a virtual environment under /root). "" when it can.
std::string WhyUserCannotRun(const std::vector<std::string>& as_user,
                             const std::string& program) {
  std::string prefix;
  for (const std::string& arg : as_user) absl::StrAppend(&prefix, arg, " ");
  int code = 0;
  const std::string out = RunShell(absl::StrCat(prefix, "test -x ", program), &code);
  if (code != 0) {
    return absl::StrCat("it may not execute ", program, out.empty() ? "" : ": ",
                        absl::StripAsciiWhitespace(out));
  }
  std::string missing;
  std::istringstream lines(RunShell(absl::StrCat(prefix, "ldd ", program), &code));
  for (std::string line; std::getline(lines, line);) {
    if (line.find("not found") == std::string::npos) continue;
    absl::StrAppend(&missing, missing.empty() ? "" : ", ", absl::StripAsciiWhitespace(line));
  }
  if (missing.empty()) return "";
  return absl::StrCat("it cannot load the libraries of ", program, " (", missing, ")");
}

// A fork that fails (EAGAIN at the user's process limit) is retried with
// backoff and never kept as pid -1, which kill() reads as "every process this
// user may signal". The agent runs as nobody with RLIMIT_NPROC at the
// number of nobody's tasks, so its forks fail; its SIGTERM to "the
// trainers" must then reach no other process of that user.
TEST(AgentForkTest, AFailedForkIsRetriedAndTheAgentSignalsNoOtherProcessOfItsUser) {
  if (::geteuid() != 0 || ::access("/usr/bin/setpriv", X_OK) != 0) {
    GTEST_SKIP() << "needs root and setpriv to run processes as nobody";
  }
  const std::string dir = ::testing::TempDir();
  const std::vector<std::string> as_nobody = {"/usr/bin/setpriv", "--reuid=65534",
                                              "--regid=65534", "--clear-groups"};
  // nobody runs a copy of the agent (its trainer is /bin/sleep).
  const PublicCopy agent_copy(kBin + "/muster-agent");
  if (agent_copy.path().empty()) GTEST_SKIP() << agent_copy.error();
  if (const std::string why = WhyUserCannotRun(as_nobody, agent_copy.path()); !why.empty()) {
    GTEST_SKIP() << "nobody cannot run muster-agent: " << why;
  }
  std::vector<std::string> canary_argv = as_nobody;
  canary_argv.insert(canary_argv.end(), {"/bin/sleep", "120"});
  const pid_t canary = SpawnLogged(canary_argv, dir + "/canary.log");
  absl::SleepFor(absl::Milliseconds(200));  // setpriv has become nobody's sleep
  // Room for the agent itself only.
  const int limit = TasksOfUser(65534) + 1;
  std::vector<std::string> agent_argv = as_nobody;
  agent_argv.insert(agent_argv.end(),
                    {"/bin/bash", "-c", absl::StrCat("ulimit -u ", limit, R"( && exec "$0" "$@")"),
                     agent_copy.path(), "--nproc-per-node=1", "--max-restarts=50",
                     "--restart-backoff=100ms", "--node-id=n", "--", "/bin/sleep", "120"});
  const std::string log = dir + "/agent-fork.log";
  std::remove(log.c_str());
  const pid_t agent = SpawnLogged(agent_argv, log);
  const absl::Time end = absl::Now() + absl::Seconds(20);
  while (ReadText(log).find("not started: fork") == std::string::npos && absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_NE(ReadText(log).find("trainer 0 not started: fork: Resource temporarily unavailable; "
                               "trying again"),
            std::string::npos)
      << ReadText(log);
  ASSERT_EQ(::kill(agent, SIGTERM), 0);
  WaitExit(agent);
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_FALSE(Gone(canary)) << "the agent's signal reached another process of its user\n"
                             << ReadText(log);
  ::kill(canary, SIGKILL);
  WaitExit(canary);
}

// A node whose wall clock steps (its agent and trainers) keeps its place:
// its node session beats on time, and nothing of its world times out.
class NodeClockStepTest : public AgentTest {
 protected:
  void SetUp() override {
    if (!HaveFakeTime()) GTEST_SKIP() << "libfaketime is not installed (faketime)";
    AgentTest::SetUp();
  }
  int MinMembers() const override { return 4; }
  // How far ahead of this process's clock node `node`'s agent stamped its
  // last line, in seconds.
  double SecondsAhead(const std::string& node) {
    const std::string log = ReadText(dir_ + "/" + node + ".log");
    return muster::SecondsAhead(log, log.rfind("muster-agent: node " + node + " done"));
  }
};

// The job ends well within a minute of the step (170 steps; about 6 s here,
// 25 s on a slow host): a minute after it, gRPC's own timers, which
// Debian's Abseil times on the wall clock, may stall the node's streams
// (docs/coordinator.md, "Time").
TEST_F(NodeClockStepTest, ANodeWhoseWallClockStepsForwardKeepsItsWorld) {
  const std::string offset = dir_ + "/b.offset";
  const pid_t a = SpawnLogged(AgentArgv("a", 200, true, {"--compute-ms=10"}), dir_ + "/a.log");
  const pid_t b =
      SpawnLogged(Stepped(offset, AgentArgv("b", 200, true, {"--compute-ms=10"})), dir_ + "/b.log");
  ASSERT_TRUE(WaitForStep("a", 30, absl::Seconds(60))) << ReadText(dir_ + "/a.log");
  Step(offset, "+60s");
  EXPECT_EQ(WaitExit(a), 0) << ReadText(dir_ + "/a.log");
  EXPECT_EQ(WaitExit(b), 0) << ReadText(dir_ + "/b.log");
  EXPECT_NEAR(SecondsAhead("b"), 60, 5) << "node b's clock did not step\n" << ReadText(dir_ + "/b.log");
  const std::string coordinator = ReadText(dir_ + "/coordinator.log");
  EXPECT_EQ(Occurrences(coordinator, "no heartbeat for"), 0) << coordinator;
  EXPECT_EQ(Occurrences(coordinator, "broken-world report"), 0) << coordinator;
  for (const char* node : {"a", "b"}) {
    const std::string log = ReadText(dir_ + "/" + node + ".log");
    EXPECT_EQ(Occurrences(log, "generation 2"), 0) << node << " regrouped:\n" << log;
  }
  ExpectEqualParameters({"a0", "a1", "b0", "b1"});
}

TEST_F(AgentTest, TheAgentRestartsAKilledTrainerAndItRejoins) {
  const pid_t a = Agent("a"), b = Agent("b");
  ASSERT_NO_FATAL_FAILURE(WaitForBothNodesAtStep(60));
  const pid_t victim = TrainerPid("b", 1);
  ASSERT_GT(victim, 0) << ReadText(dir_ + "/b.log");
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  EXPECT_EQ(WaitExit(a), 0) << ReadText(dir_ + "/a.log");
  EXPECT_EQ(WaitExit(b), 0) << ReadText(dir_ + "/b.log");
  const std::string log_b = ReadText(dir_ + "/b.log");
  EXPECT_NE(log_b.find("trainer 1 started (restart 1)"), std::string::npos) << log_b;
  EXPECT_NE(log_b.find("trainer 1: exit 0, 1 restarts"), std::string::npos) << log_b;
  // Each agent held one session for its node, and b's reported the kill.
  const std::string coordinator_log = ReadText(dir_ + "/coordinator.log");
  EXPECT_NE(coordinator_log.find("node session of a opened"), std::string::npos);
  EXPECT_NE(coordinator_log.find("node session of b opened"), std::string::npos);
  EXPECT_TRUE(std::regex_search(coordinator_log,
                                std::regex("fail: b/1 [^\\n]*reported by muster-agent of node b")))
      << coordinator_log;
  // The survivors regrouped to 3, then back to 4 with the restarted trainer.
  const std::string log_a = ReadText(dir_ + "/a.log");
  EXPECT_NE(log_a.find("(world 3, rank"), std::string::npos) << log_a;
  EXPECT_NE(log_a.find("world 4 on 2 nodes"), std::string::npos) << log_a;
  // Node a lost nobody: at the join its trainers kept their shared memory.
  EXPECT_GE(Occurrences(log_a, "kept this node's communicator (shm of 2 ranks)"), 2) << log_a;
  // The loss curve is continuous: rank 0's steps never go back.
  const std::vector<int> steps = Steps("a");
  ASSERT_FALSE(steps.empty());
  for (size_t i = 1; i < steps.size(); ++i) EXPECT_GE(steps[i], steps[i - 1]);
  EXPECT_EQ(steps.back(), 400);
  ExpectEqualParameters({"a0", "a1", "b0", "b1"});
}

// Both nodes' agents and trainers reach the coordinator through a relay,
// with the coordinator itself as their second address. The relay is
// SIGKILLed mid-run: the coordinator holds the nodes' sessions instead of
// failing their members, the agents reconnect straight to it, and the
// world trains on without a regroup.
TEST_F(AgentTest, AJobBehindARelayTrainsOnWhenTheRelayIsKilled) {
  const std::string relay = absl::StrCat(ListenHost(), ":", FreeLoopbackPort());
  KillOnExit procs;
  const pid_t relay_pid = procs.Add(SpawnLogged(
      {kBin + "/muster-relay", "--listen=" + relay, "--coordinator=" + target_},
      dir_ + "/relay.log"));
  // Agents that find no relay yet go straight to the coordinator (their
  // list's next entry) and stay there.
  ASSERT_TRUE(WaitForLine("relay", "listening on port", absl::Seconds(10)))
      << ReadText(dir_ + "/relay.log");
  via_ = relay + "," + target_;
  const pid_t a = procs.Add(Agent("a")), b = procs.Add(Agent("b"));
  ASSERT_NO_FATAL_FAILURE(WaitForBothNodesAtStep(60));
  // The first world may form in two generations (a node that joins late):
  // what counts is that the relay's death adds none.
  const int regroups = Occurrences(ReadText(dir_ + "/coordinator.log"), "regroup: generation");
  ASSERT_EQ(::kill(relay_pid, SIGKILL), 0);
  EXPECT_EQ(WaitExit(a), 0) << ReadText(dir_ + "/a.log");
  EXPECT_EQ(WaitExit(b), 0) << ReadText(dir_ + "/b.log");
  const std::string coordinator = ReadText(dir_ + "/coordinator.log");
  EXPECT_EQ(Occurrences(coordinator, "was lost between its relay and the coordinator"), 2)
      << coordinator;
  EXPECT_EQ(Occurrences(coordinator, "fail: "), 0) << coordinator;
  EXPECT_EQ(Occurrences(coordinator, "regroup: generation"), regroups) << coordinator;
  for (const char* node : {"a", "b"}) {
    const std::string log = ReadText(dir_ + "/" + node + ".log");
    EXPECT_NE(log.find("coordinator now at " + target_), std::string::npos) << log;
  }
  ASSERT_FALSE(Steps("a").empty());
  EXPECT_EQ(Steps("a").back(), 400);
  ExpectEqualParameters({"a0", "a1", "b0", "b1"});
}

TEST_F(AgentTest, KillingANodeTakesItsTrainersAndTheOtherNodeFinishes) {
  const pid_t a = Agent("a"), b = Agent("b");
  ASSERT_NO_FATAL_FAILURE(WaitForBothNodesAtStep(60));
  const pid_t t0 = TrainerPid("b", 0), t1 = TrainerPid("b", 1);
  ASSERT_GT(t0, 0);
  ASSERT_GT(t1, 0);
  ASSERT_EQ(::kill(b, SIGKILL), 0);
  EXPECT_EQ(WaitExit(b), 128 + SIGKILL);
  // PR_SET_PDEATHSIG: the node's trainers die with their agent.
  const absl::Time end = absl::Now() + absl::Seconds(5);
  while ((!Gone(t0) || !Gone(t1)) && absl::Now() < end) absl::SleepFor(absl::Milliseconds(20));
  EXPECT_TRUE(Gone(t0));
  EXPECT_TRUE(Gone(t1));
  EXPECT_EQ(WaitExit(a), 0) << ReadText(dir_ + "/a.log");
  const std::string log_a = ReadText(dir_ + "/a.log");
  EXPECT_NE(log_a.find("(world 2, rank"), std::string::npos) << log_a;
  ASSERT_FALSE(Steps("a").empty());
  EXPECT_EQ(Steps("a").back(), 400);
  ExpectEqualParameters({"a0", "a1"});
}

// A trainer that stops (SIGSTOP) under an agent drops out of the node's
// heartbeat; the coordinator's heartbeat timeout fails it as it would
// without the agent, and once it runs again it rejoins as a new incarnation.
TEST_F(AgentTest, AStoppedTrainerDropsOutOfTheNodeHeartbeatAndIsFenced) {
  agent_flags_ = {"--stopped-limit=0"};  // the agents do not look for stopped trainers
  const pid_t a = Agent("a"), b = Agent("b");
  ASSERT_NO_FATAL_FAILURE(WaitForBothNodesAtStep(60));
  const pid_t victim = TrainerPid("b", 1);
  ASSERT_GT(victim, 0) << ReadText(dir_ + "/b.log");
  // A world of 3 after the stop (node b's trainers may have joined one at
  // a time, leaving an earlier "world 3" in the log).
  const size_t before = ReadText(dir_ + "/a.log").size();
  ASSERT_EQ(::kill(victim, SIGSTOP), 0);
  ASSERT_TRUE(WaitForLine("a", "(world 3, rank", absl::Seconds(30), before))
      << ReadText(dir_ + "/a.log");
  ASSERT_EQ(::kill(victim, SIGCONT), 0);
  EXPECT_EQ(WaitExit(a), 0) << ReadText(dir_ + "/a.log");
  EXPECT_EQ(WaitExit(b), 0) << ReadText(dir_ + "/b.log");
  const std::string coordinator_log = ReadText(dir_ + "/coordinator.log");
  EXPECT_TRUE(std::regex_search(coordinator_log, std::regex("fail: b/1 [^\\n]*no heartbeat for")))
      << coordinator_log;
  // The same process went on as a new incarnation; the agent restarted nothing.
  const std::string log_b = ReadText(dir_ + "/b.log");
  EXPECT_NE(log_b.find("rejoining as a new incarnation"), std::string::npos) << log_b;
  EXPECT_EQ(log_b.find("trainer 1 started (restart 1)"), std::string::npos) << log_b;
  EXPECT_NE(ReadText(dir_ + "/a.log").find("world 4 on 2 nodes"), std::string::npos);
  ExpectEqualParameters({"a0", "a1", "b0", "b1"});
}

// A heartbeat timeout far longer than the agent's stopped limit (1 s): what
// ends the wait for a stopped trainer is its agent reading the kernel's
// word that it is stopped, not a timeout.
class AgentStoppedTest : public AgentTest {
 protected:
  std::string HeartbeatTimeout() const override { return "30s"; }
};

TEST_F(AgentStoppedTest, AStoppedTrainerIsDetachedByItsAgentAndRejoinsWhenItRuns) {
  const pid_t a = Agent("a"), b = Agent("b");
  ASSERT_NO_FATAL_FAILURE(WaitForBothNodesAtStep(60));
  const pid_t victim = TrainerPid("b", 1);
  ASSERT_GT(victim, 0) << ReadText(dir_ + "/b.log");
  const size_t before = ReadText(dir_ + "/a.log").size();  // as above
  const absl::Time stopped = absl::Now();
  ASSERT_EQ(::kill(victim, SIGSTOP), 0);
  ASSERT_TRUE(WaitForLine("a", "(world 3, rank", absl::Seconds(60), before))
      << ReadText(dir_ + "/a.log");
  const absl::Duration regrouped = absl::Now() - stopped;
  EXPECT_LT(regrouped, absl::Seconds(8)) << "the heartbeat timeout is 30 s";
  ASSERT_EQ(::kill(victim, SIGCONT), 0);
  EXPECT_EQ(WaitExit(a), 0) << ReadText(dir_ + "/a.log");
  EXPECT_EQ(WaitExit(b), 0) << ReadText(dir_ + "/b.log");
  const std::string coordinator_log = ReadText(dir_ + "/coordinator.log");
  EXPECT_TRUE(std::regex_search(
      coordinator_log, std::regex("fail: b/1 [^\\n]*trainer process stopped for [^\\n]*SIGSTOP")))
      << coordinator_log;
  // The process was left alone: it went on as a new incarnation.
  const std::string log_b = ReadText(dir_ + "/b.log");
  EXPECT_NE(log_b.find("rejoining as a new incarnation"), std::string::npos) << log_b;
  EXPECT_EQ(log_b.find("trainer 1 started (restart 1)"), std::string::npos) << log_b;
  ExpectEqualParameters({"a0", "a1", "b0", "b1"});
}

// The training thread held stopped under a tracer while the trainer's other
// threads, its heartbeats among them, go on: hung, ended by its agent and
// restarted, long before its peers' collective deadline (at least 10 s).
TEST_F(AgentStoppedTest, ATrainerWithAThreadHeldStoppedIsEndedAndRestarted) {
  const pid_t a = Agent("a"), b = Agent("b");
  ASSERT_NO_FATAL_FAILURE(WaitForBothNodesAtStep(60));
  const pid_t victim = TrainerPid("b", 1);  // its main thread trains
  ASSERT_GT(victim, 0) << ReadText(dir_ + "/b.log");
  if (::ptrace(PTRACE_SEIZE, victim, nullptr, nullptr) != 0) {
    GTEST_SKIP() << "not allowed to trace a trainer: " << std::strerror(errno);
  }
  int status = 0;
  const absl::Time frozen = absl::Now();
  ASSERT_EQ(::ptrace(PTRACE_INTERRUPT, victim, nullptr, nullptr), 0);
  ASSERT_EQ(::waitpid(victim, &status, __WALL), victim);
  // As its tracer, this test collects it when it ends.
  bool ended = false;
  while (!ended && absl::Now() - frozen < absl::Seconds(60)) {
    const pid_t r = ::waitpid(victim, &status, __WALL | WNOHANG);
    ended = r == victim && (WIFEXITED(status) || WIFSIGNALED(status));
    if (!ended) absl::SleepFor(absl::Milliseconds(20));
  }
  const absl::Duration took = absl::Now() - frozen;
  if (!ended) ::ptrace(PTRACE_DETACH, victim, nullptr, 0);
  ASSERT_TRUE(ended) << ReadText(dir_ + "/b.log");
  EXPECT_LT(took, absl::Seconds(8)) << ReadText(dir_ + "/b.log");
  EXPECT_EQ(WaitExit(a), 0) << ReadText(dir_ + "/a.log");
  EXPECT_EQ(WaitExit(b), 0) << ReadText(dir_ + "/b.log");
  const std::string log_b = ReadText(dir_ + "/b.log");
  EXPECT_NE(log_b.find("has a thread held stopped for"), std::string::npos) << log_b;
  EXPECT_NE(log_b.find("trainer 1 started (restart 1)"), std::string::npos) << log_b;
  ExpectEqualParameters({"a0", "a1", "b0", "b1"});
}

// Node a's agent holds its node's session, node b's trainers hold their own.
TEST_F(AgentTest, AJobScalesUpFromTwoToFourTrainersMidRun) {
  const pid_t a = Agent("a", 500);
  ASSERT_TRUE(WaitForStep("a", 40, absl::Seconds(60))) << ReadText(dir_ + "/a.log");
  const pid_t b = Agent("b", 500, /*node_session=*/false);
  EXPECT_EQ(WaitExit(a), 0) << ReadText(dir_ + "/a.log");
  EXPECT_EQ(WaitExit(b), 0) << ReadText(dir_ + "/b.log");
  const std::string log_a = ReadText(dir_ + "/a.log");
  // A join enters at a step boundary: nothing is dropped.
  EXPECT_NE(log_a.find("world 4 on 2 nodes"), std::string::npos) << log_a;
  EXPECT_EQ(log_a.find("dropped"), std::string::npos) << log_a;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(log_a, m, std::regex("world 4 on 2 nodes[^\\n]*step ([0-9]+)")));
  EXPECT_GE(std::stoi(m[1]), 40);
  ASSERT_FALSE(Steps("a").empty());
  EXPECT_EQ(Steps("a").back(), 500);
  ExpectEqualParameters({"a0", "a1", "b0", "b1"});
}

// A coordinator killed and restarted without state: the agents reconnect,
// their trainers' sessions wait for them there, find themselves unknown
// (NOT_FOUND), join again and the job goes on to its end.
TEST_F(AgentTest, TrainersJoinACoordinatorRestartedWithoutStateAndFinish) {
  const pid_t a = Agent("a"), b = Agent("b");
  ASSERT_NO_FATAL_FAILURE(WaitForBothNodesAtStep(60));
  ASSERT_EQ(::kill(coordinator_, SIGKILL), 0);
  WaitExit(coordinator_);
  absl::SleepFor(absl::Milliseconds(300));
  StartCoordinator();
  EXPECT_EQ(WaitExit(a), 0) << ReadText(dir_ + "/a.log");
  EXPECT_EQ(WaitExit(b), 0) << ReadText(dir_ + "/b.log");
  const std::string coordinator_log = ReadText(dir_ + "/coordinator.log");
  // The restarted coordinator's joins: after its own start line.
  const size_t restart = coordinator_log.rfind("coordinator started");
  ASSERT_NE(restart, std::string::npos) << coordinator_log;
  for (const char* member : {"a/0", "a/1", "b/0", "b/1"}) {
    EXPECT_NE(coordinator_log.find(absl::StrCat("join: ", member), restart), std::string::npos)
        << member << "\n" << coordinator_log;
  }
  ASSERT_FALSE(Steps("a").empty());
  EXPECT_EQ(Steps("a").back(), 400);
  ExpectEqualParameters({"a0", "a1", "b0", "b1"});
}

// A job that needs three trainers: a node that leaves pauses the other.
class AgentPauseTest : public AgentTest {
 protected:
  int MinMembers() const override { return 3; }

  // Starts nodes a and b (two trainers each, steps enough to never finish),
  // lets them train, then sends b's agent SIGTERM: the job pauses below its
  // minimum with a's trainers waiting for a world. Sets `*a` to a's agent.
  void PauseWithOnlyNodeALeft(pid_t* a) {
    *a = Agent("a", 100000);
    const pid_t b = Agent("b", 100000);
    ASSERT_TRUE(WaitForLine("a", "world 4 on 2 nodes", absl::Seconds(60))) << NodeLogs();
    ASSERT_TRUE(WaitForStep("a", 30, absl::Seconds(60))) << ReadText(dir_ + "/a.log");
    ASSERT_EQ(::kill(b, SIGTERM), 0);
    EXPECT_EQ(WaitExit(b), 0) << ReadText(dir_ + "/b.log");
    ASSERT_TRUE(
        WaitForLine("coordinator", "fewer than min_members (3) remain", absl::Seconds(30)))
        << ReadText(dir_ + "/coordinator.log");
  }
};

// Stopping a whole job node by node (as scancel does, in no set order):
// the trainers of the last node wait, paused below the minimum, when their
// own SIGTERM comes; they must leave then, not wait for a world until the
// agent's grace runs out and it kills them.
TEST_F(AgentPauseTest, TrainersPausedBelowTheMinimumLeaveOnSigterm) {
  pid_t a = -1;
  ASSERT_NO_FATAL_FAILURE(PauseWithOnlyNodeALeft(&a));
  ASSERT_EQ(::kill(a, SIGTERM), 0);
  EXPECT_EQ(WaitExit(a), 0) << ReadText(dir_ + "/a.log");
  const std::string log_a = ReadText(dir_ + "/a.log");
  EXPECT_EQ(log_a.find("still running 1m after the signal"), std::string::npos) << log_a;
  EXPECT_NE(log_a.find("trainer 0: exit 0"), std::string::npos) << log_a;
  EXPECT_NE(log_a.find("trainer 1: exit 0"), std::string::npos) << log_a;
}

// The time-limit warning (SIGUSR1: checkpoint and stop) in a paused job:
// there is no world to checkpoint in, so the trainers stop as stopped, not
// as if they had left or finished; and as this job has no checkpoint dir,
// they say that nothing was saved and exit 74, not 75 (which promises a
// committed checkpoint of the step they stopped at).
TEST_F(AgentPauseTest, TrainersPausedBelowTheMinimumStopOnSigusr1SayingNothingWasSaved) {
  pid_t a = -1;
  ASSERT_NO_FATAL_FAILURE(PauseWithOnlyNodeALeft(&a));
  ASSERT_EQ(::kill(a, SIGUSR1), 0);
  EXPECT_EQ(WaitExit(a), 74) << ReadText(dir_ + "/a.log");
  const std::string log_a = ReadText(dir_ + "/a.log");
  EXPECT_NE(log_a.find("stopped while waiting for a world"), std::string::npos) << log_a;
  EXPECT_NE(log_a.find("nothing was saved"), std::string::npos) << log_a;
  EXPECT_NE(log_a.find("trainer 0: exit 74"), std::string::npos) << log_a;
  EXPECT_NE(log_a.find("trainer 1: exit 74"), std::string::npos) << log_a;
}

// The tensors of two safetensors files are the same, bit for bit.
void ExpectSameTensors(const std::string& a, const std::string& b) {
  auto fa = ParseSafetensors(ReadText(a), a), fb = ParseSafetensors(ReadText(b), b);
  ASSERT_TRUE(fa.ok()) << fa.status();
  ASSERT_TRUE(fb.ok()) << fb.status();
  ASSERT_EQ(fa->tensors.size(), fb->tensors.size()) << a << " and " << b;
  for (const auto& [name, t] : fa->tensors) {
    auto it = fb->tensors.find(name);
    ASSERT_NE(it, fb->tensors.end()) << name << " is not in " << b;
    EXPECT_EQ(it->second.shape, t.shape) << name;
    ASSERT_EQ(it->second.size, t.size) << name;
    EXPECT_EQ(std::memcmp(it->second.data, t.data, t.size), 0) << name << " differs";
  }
}

TEST_F(ElasticTest, PullWeightsDuringTrainingMatchesTheCheckpointOfThatStep) {
  auto trainer = [&](int local, const std::string& tag) {
    return SpawnLogged({kBin + "/muster-train", "--coordinator=" + target_, "--node-id=n",
                        absl::StrCat("--local-rank=", local), "--model=mlp", "--steps=300",
                        "--batch-size=32", "--log-every=10", "--threads=1",
                        absl::StrCat("--job=pw", ::getpid()), "--checkpoint-dir=" + dir_ + "/ckpt",
                        "--checkpoint-every=20"},
                       absl::StrCat(dir_, "/", tag, ".log"));
  };
  const pid_t a = trainer(0, "a"), b = trainer(1, "b");
  ASSERT_TRUE(WaitForStep("a", 20, absl::Seconds(60))) << ReadText(dir_ + "/a.log");
  const std::string muster = kBin + "/muster --coordinator " + target_;
  int code = -1;
  const std::string out =
      RunShell(muster + " pull-weights --at-step 200 --out " + dir_ + "/pulled.safetensors", &code);
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("after step 200 from n/"), std::string::npos) << out;
  // Errors name what is wrong.
  const std::string no_out = RunShell(muster + " pull-weights", &code);
  EXPECT_EQ(code, 2) << no_out;
  EXPECT_NE(no_out.find("--out"), std::string::npos) << no_out;
  const std::string bad_member =
      RunShell(muster + " pull-weights --member nobody/0 --out /tmp/x", &code);
  EXPECT_NE(bad_member.find("nobody/0 is unknown"), std::string::npos) << bad_member;
  EXPECT_EQ(WaitExit(a), 0) << ReadText(dir_ + "/a.log");
  EXPECT_EQ(WaitExit(b), 0) << ReadText(dir_ + "/b.log");
  auto pulled = ParseSafetensors(ReadText(dir_ + "/pulled.safetensors"), "pulled");
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_EQ(pulled->metadata["step"], "200");
  ExpectSameTensors(dir_ + "/ckpt/step-200/model.safetensors", dir_ + "/pulled.safetensors");
}

// A checkpoint by time (--checkpoint-interval) is taken after the same
// step on every rank, though each rank's clock reaches the interval at its
// own moment: one rank in the checkpoint's collectives and the other in
// the next step's once crashed a trainer inside Gloo.
TEST_F(ElasticTest, ACheckpointByTimeIsTakenAfterTheSameStepOnEveryRank) {
  const std::vector<std::string> flags = {"--checkpoint-dir=" + dir_ + "/ckpt",
                                          "--checkpoint-interval=0.2", "--steps=400"};
  const pid_t a = Trainer(0, "a", "n0", "auto", flags), b = Trainer(0, "b", "n1", "auto", flags);
  EXPECT_EQ(WaitExit(a), 0) << ReadText(dir_ + "/a.log");
  EXPECT_EQ(WaitExit(b), 0) << ReadText(dir_ + "/b.log");
  const std::string s = ReadText(dir_ + "/a.json");
  EXPECT_EQ(JsonNumber(s, "steps"), "400") << s;
  EXPECT_EQ(JsonNumber(s, "regroups"), "0") << s << ReadText(dir_ + "/a.log");
  EXPECT_EQ(JsonNumber(ReadText(dir_ + "/b.json"), "parameter_checksum"),
            JsonNumber(s, "parameter_checksum"));
  const std::string log = ReadText(dir_ + "/a.log");
  int written = 0;
  for (size_t at = log.find("written ("); at != std::string::npos;
       at = log.find("written (", at + 1)) {
    ++written;
  }
  EXPECT_GE(written, 2) << log;
}

// A trainer that joins at a step boundary where a checkpoint is due (here
// every step's) enters the next step at once, while the members it joins
// would have checked and checkpointed the step first: their collectives
// and its gradient all-reduce once met in Gloo and killed the joiner.
// Every rank now takes that checkpoint after the next step, together.
TEST_F(ElasticTest, AJoinAtACheckpointStepDoesNotPartTheRanks) {
  const std::vector<std::string> flags = {"--checkpoint-dir=" + dir_ + "/ckpt",
                                          "--checkpoint-every=1", "--steps=200"};
  const pid_t a = Trainer(0, "a", "n0", "auto", flags), b = Trainer(0, "b", "n1", "auto", flags);
  ASSERT_TRUE(WaitForStep("a", 20, absl::Seconds(60))) << ReadText(dir_ + "/a.log");
  const pid_t c = Trainer(1, "c", "n1", "auto", flags);
  EXPECT_EQ(WaitExit(c), 0) << ReadText(dir_ + "/c.log");
  EXPECT_EQ(WaitExit(a), 0) << ReadText(dir_ + "/a.log");
  EXPECT_EQ(WaitExit(b), 0) << ReadText(dir_ + "/b.log");
  const std::string s = ReadText(dir_ + "/a.json");
  EXPECT_EQ(JsonNumber(s, "steps"), "200") << s;
  EXPECT_EQ(JsonNumber(s, "world_size"), "3") << s;
  for (const char* tag : {"b", "c"}) {
    EXPECT_EQ(JsonNumber(ReadText(dir_ + "/" + tag + ".json"), "parameter_checksum"),
              JsonNumber(s, "parameter_checksum"))
        << tag;
  }
}

// The metrics are rank 0's, and rank 0 changes hands when a newcomer takes
// the first node's local rank 0: the former rank 0 stops writing there and
// the newcomer goes on, so metrics.jsonl holds every step once, in order.
TEST_F(ElasticTest, MetricsFollowRankZeroWhenANewcomerTakesIt) {
  const std::string logs = dir_ + "/logs";
  // Steps long enough that the newcomer, which loads LibTorch and the data
  // first, joins well before the end.
  const std::vector<std::string> flags = {"--log-dir=" + logs, "--log-every=1", "--steps=400",
                                          "--compute-ms=10"};
  const pid_t a = Trainer(1, "a", "n0", "auto", flags), b = Trainer(0, "b", "n1", "auto", flags);
  ASSERT_TRUE(WaitForStep("a", 20, absl::Seconds(60))) << ReadText(dir_ + "/a.log");
  const pid_t c = Trainer(0, "c", "n0", "auto", flags);
  EXPECT_EQ(WaitExit(c), 0) << ReadText(dir_ + "/c.log");
  EXPECT_EQ(WaitExit(a), 0) << ReadText(dir_ + "/a.log");
  EXPECT_EQ(WaitExit(b), 0) << ReadText(dir_ + "/b.log");
  // Only rank 0 prints the world line: c took rank 0 from a.
  ASSERT_NE(ReadText(dir_ + "/c.log").find("muster: generation"), std::string::npos)
      << ReadText(dir_ + "/c.log");
  std::vector<int64_t> steps;
  for (const StepRecord& r : ReadStepRecords(logs + "/metrics.jsonl")) steps.push_back(r.step);
  std::vector<int64_t> each(400);
  for (int s = 0; s < 400; ++s) each[s] = s + 1;
  EXPECT_EQ(steps, each) << ReadText(logs + "/metrics.jsonl");
  // One event file per member that was rank 0, none written over.
  int event_files = 0;
  for (const auto& e : std::filesystem::directory_iterator(logs)) {
    event_files += e.path().filename().string().rfind("events.out.tfevents.", 0) == 0;
  }
  EXPECT_EQ(event_files, 2);
}

// --elastic-lr: after the world shrinks from 3 to 2, "scale" takes the
// linear learning rate down by 2/3 with the world; "keep" leaves it.
TEST_F(ElasticTest, ElasticLrScalesOrKeepsTheLearningRate) {
  for (const std::string policy : {"scale", "keep"}) {
    // A job of its own: a finished job's coordinator takes no new members.
    const std::string target = absl::StrCat("127.0.0.1:", FreeLoopbackPort());
    const pid_t coordinator =
        SpawnLogged({kBin + "/muster-coordinator", "--listen=" + target, "--no-auth",
                     "--min-members=2", "--max-members=3", "--last-call=200ms"},
                    dir_ + "/coordinator-" + policy + ".log");
    std::vector<pid_t> pids;
    for (int i = 0; i < 3; ++i) {
      pids.push_back(SpawnLogged(
          {kBin + "/muster-train", "--coordinator=" + target, "--node-id=n",
           absl::StrCat("--local-rank=", i), "--model=mlp", "--steps=200", "--batch-size=32",
           "--log-every=1", "--quiet", "--threads=1", "--warmup-steps=0",
           "--elastic-lr=" + policy, absl::StrCat("--job=lr", ::getpid(), policy),
           "--log-dir=" + dir_ + "/" + policy},
          absl::StrCat(dir_, "/", policy, i, ".log")));
    }
    const std::string metrics = dir_ + "/" + policy + "/metrics.jsonl";
    // Step 30 in a world of 3: the first world may form with two members
    // before the third arrives, and the third must be in one to be lost.
    const absl::Time end = absl::Now() + absl::Seconds(60);
    for (std::string seen = ReadText(metrics);
         absl::Now() < end && (seen.find("\"step\": 30,") == std::string::npos ||
                               seen.find("\"world_size\": 3") == std::string::npos);
         seen = ReadText(metrics)) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    ::kill(pids[2], SIGKILL);
    WaitExit(pids[2]);
    EXPECT_EQ(WaitExit(pids[0]), 0) << ReadText(dir_ + "/" + policy + "0.log");
    EXPECT_EQ(WaitExit(pids[1]), 0);
    ::kill(coordinator, SIGTERM);
    WaitExit(coordinator);
    // The last step in the world of 3 and the first in the world of 2.
    double before = 0, after = 0;
    std::istringstream in(ReadText(metrics));
    std::string line;
    const std::regex re(R"re("lr": ([0-9.eE-]+).*"world_size": ([0-9]+))re");
    std::smatch m;
    while (std::getline(in, line)) {
      if (!std::regex_search(line, m, re)) continue;
      // (The first world may form with two members before the third arrives.)
      if (m[2] == "3") {
        before = std::stod(m[1]);
        after = 0;
      }
      if (m[2] == "2" && before > 0 && after == 0) after = std::stod(m[1]);
    }
    ASSERT_GT(before, 0) << policy;
    ASSERT_GT(after, 0) << policy;
    // Cosine decay changes the rate by well under 1% per step here.
    EXPECT_NEAR(after / before, policy == "scale" ? 2.0 / 3.0 : 1.0, 0.02) << policy;
  }
}

// `muster checkpoints --consolidate` on a checkpoint directory of sharded
// state exits 0 and writes its optimizer.safetensors.
void ExpectConsolidated(const std::string& step_dir) {
  const std::string command =
      kBin + "/muster checkpoints --consolidate " + step_dir + " > " + step_dir + ".out 2>&1";
  const int status = std::system(command.c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << ReadText(step_dir + ".out");
  EXPECT_TRUE(std::filesystem::exists(step_dir + "/optimizer.safetensors"))
      << ReadText(step_dir + ".out");
}

// Sharded optimizer state (Options::shard_optimizer_state, ZeRO-1, with a
// buddy copy of each part): two nodes of two trainers, AdamW.
// How far apart, relative to its size, the parameter checksums of a
// reduce-scattered and an all-reduced run of ShardedStateTest may end: the
// two sum each gradient element in another order.
constexpr double kScatterTolerance = 1e-5;

class ShardedStateTest : public ElasticTest {
 protected:
  int MinMembers() const override { return 4; }
  int MaxMembers() const override { return 4; }
  // A coordinator of its own for a second run: the first one's job is over.
  void NewCoordinator() {
    ::kill(coordinator_, SIGTERM);
    WaitExit(coordinator_);
    StartCoordinator();
  }
  // The trainers' flags: AdamW, then `extra`.
  static std::vector<std::string> AdamW(const std::vector<std::string>& extra) {
    std::vector<std::string> flags = {"--optimizer=adamw", "--lr=0.001"};
    flags.insert(flags.end(), extra.begin(), extra.end());
    return flags;
  }
  // The four trainers of one run, `tag` 0..3 on nodes n0 and n1.
  std::vector<pid_t> Run(const std::string& tag, const std::vector<std::string>& extra) {
    std::vector<pid_t> pids;
    for (int i = 0; i < 4; ++i) {
      pids.push_back(
          Trainer(i % 2, absl::StrCat(tag, i), absl::StrCat("n", i / 2), "hier", AdamW(extra)));
    }
    return pids;
  }
  // Run's trainers, each expected to exit 0.
  void RunToEnd(const std::string& tag, const std::vector<std::string>& extra) {
    std::vector<pid_t> pids = Run(tag, extra);
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(WaitExit(pids[i]), 0) << ReadText(absl::StrCat(dir_, "/", tag, i, ".log"));
    }
  }
};

// The same job sharded and unsharded ends with the same parameters, bit
// for bit (the optimizers compute each element alone), writes the same
// checkpoints (whole), and each rank of the sharded one held half the
// state (two of four parts). The state is checked every 10 steps, sharded
// between checkpoints.
TEST_F(ShardedStateTest, ShardedAdamWTrainsAsUnshardedWithHalfTheStatePerRank) {
  for (const std::string& tag : {std::string("u"), std::string("s")}) {
    std::vector<std::string> flags = {"--checkpoint-dir=" + dir_ + "/ckpt-" + tag,
                                      "--checkpoint-every=100", "--check-state-every=10"};
    if (tag == "s") {
      NewCoordinator();
      flags.push_back("--shard-optimizer");
    }
    RunToEnd(tag, flags);
  }
  const std::string u0 = ReadText(dir_ + "/u0.json"), s0 = ReadText(dir_ + "/s0.json");
  EXPECT_EQ(JsonNumber(s0, "steps"), "250") << s0;
  EXPECT_EQ(JsonNumber(s0, "regroups"), "0") << s0;
  EXPECT_EQ(JsonNumber(s0, "parameter_checksum"), JsonNumber(u0, "parameter_checksum"));
  const double whole = std::stod(JsonNumber(u0, "optimizer_state_elements"));
  ASSERT_GT(whole, 0) << u0;
  for (int i = 0; i < 4; ++i) {
    const std::string si = ReadText(absl::StrCat(dir_, "/s", i, ".json"));
    EXPECT_EQ(JsonNumber(si, "parameter_checksum"), JsonNumber(s0, "parameter_checksum")) << i;
    // Two parts of four; a part's ranges may hold one element more.
    EXPECT_LE(std::stod(JsonNumber(si, "optimizer_state_elements")), whole * 0.5 + 16) << si;
    EXPECT_GE(std::stod(JsonNumber(si, "optimizer_state_elements")), whole * 0.5 - 16) << si;
  }
  // The sharded run's checkpoint holds a file per part, which the command
  // puts together into the unsharded run's optimizer file, bit for bit.
  for (int r = 0; r < 4; ++r) {
    EXPECT_TRUE(std::filesystem::exists(
        absl::StrCat(dir_, "/ckpt-s/step-200/optimizer-shard-", r, "-of-4.safetensors")));
  }
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/ckpt-s/step-200/optimizer.safetensors"));
  ExpectConsolidated(dir_ + "/ckpt-s/step-200");
  for (const char* file : {"/step-200/model.safetensors", "/step-200/optimizer.safetensors"}) {
    ExpectSameTensors(dir_ + "/ckpt-u" + file, dir_ + "/ckpt-s" + file);
  }
}

class ShardedStateAloneTest : public ShardedStateTest {
 protected:
  int MinMembers() const override { return 1; }
  int MaxMembers() const override { return 1; }
};

// A world of one keeps the state whole (its one rank would keep every
// part): it trains as unsharded, and its checkpoints are the unsharded
// run's, bit for bit, with no part files to consolidate.
TEST_F(ShardedStateAloneTest, AWorldOfOneKeepsTheWholeStateAndWritesItWhole) {
  for (const std::string& tag : {std::string("u"), std::string("s")}) {
    std::vector<std::string> flags = AdamW(
        {"--steps=60", "--checkpoint-dir=" + dir_ + "/ckpt-" + tag, "--checkpoint-every=40"});
    if (tag == "s") {
      NewCoordinator();
      flags.push_back("--shard-optimizer");
    }
    EXPECT_EQ(WaitExit(Trainer(0, tag, "n0", "auto", flags)), 0)
        << ReadText(dir_ + "/" + tag + ".log");
  }
  EXPECT_FALSE(
      std::filesystem::exists(dir_ + "/ckpt-s/step-40/optimizer-shard-0-of-1.safetensors"));
  ExpectSameTensors(dir_ + "/ckpt-u/step-40/optimizer.safetensors",
                    dir_ + "/ckpt-s/step-40/optimizer.safetensors");
  const std::string u = ReadText(dir_ + "/u.json"), sharded = ReadText(dir_ + "/s.json");
  EXPECT_EQ(JsonNumber(sharded, "parameter_checksum"), JsonNumber(u, "parameter_checksum"));
  EXPECT_EQ(JsonNumber(sharded, "optimizer_state_elements"),
            JsonNumber(u, "optimizer_state_elements"));
}

class ShardedStateFailureTest : public ShardedStateTest {
 protected:
  int MinMembers() const override { return 3; }
  // With one copy of each part (and `extra` flags), a SIGKILL of one of
  // four trainers after the checkpoint of step 40: see the tests.
  void KillOneOfFourWithOneCopy(const std::vector<std::string>& extra);
  // With two copies (and `extra` flags), a SIGKILL of one of four trainers
  // after step 40 and a replacement: see the tests.
  void KillOneOfFourAndReplaceIt(const std::vector<std::string>& extra);
  // With `copies` copies of each part, one of four trainers leaves at a
  // boundary (SIGTERM) and a new one joins: see the tests.
  void OneLeavesAndOneJoins(int copies);
  // A spare `tag`4 on node n2 waits (the world of Run(`tag`, `flags`) is
  // full); rank 3 of `*pids` is SIGKILLed and the spare takes its place
  // there; each of the four then exits 0 (its log where not).
  void ASpareReplacesRank3(const std::string& tag, const std::vector<std::string>& flags,
                           std::vector<pid_t>* pids) {
    const pid_t spare = Trainer(0, tag + "4", "n2", "hier", AdamW(flags));
    ASSERT_TRUE(WaitForLine("coordinator", "(a spare: the world is full)", absl::Seconds(30)))
        << ReadText(dir_ + "/" + tag + "4.log");
    ASSERT_EQ(::kill((*pids)[3], SIGKILL), 0);
    WaitExit((*pids)[3]);
    (*pids)[3] = spare;
    const int numbers[4] = {0, 1, 2, 4};  // in the tags, by rank
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(WaitExit((*pids)[r]), 0)
          << ReadText(absl::StrCat(dir_, "/", tag, numbers[r], ".log"));
    }
  }
  // Each of `tags` ended with the parameters of `summary` (a summary
  // JSON's text): the same checksum; its log where not.
  void ExpectParametersOf(const std::vector<std::string>& tags, const std::string& summary) {
    for (const std::string& tag : tags) {
      EXPECT_EQ(JsonNumber(ReadText(dir_ + "/" + tag + ".json"), "parameter_checksum"),
                JsonNumber(summary, "parameter_checksum"))
          << tag << "\n"
          << ReadText(dir_ + "/" + tag + ".log");
    }
  }
};

// A graceful leave with two copies: the leaver's parts live on in its
// buddy, so the survivors move the shards straight to a world of three
// (never whole); a joiner then receives only its shards; every rank ends
// with the same parameters, no step dropped.
TEST_F(ShardedStateFailureTest, ALeaverWithTwoCopiesAndAJoinerMoveOnlyTheShards) {
  OneLeavesAndOneJoins(2);
}

// With one copy the leaver's parts have no other holder: at the boundary it
// leaves after, the shards are handed over to the three ranks that stay,
// in the world of four, and the world of three takes them straight; no
// rank holds the whole state. The joiner that follows, at a boundary no
// rank leaves, receives only its shards, as with two copies.
TEST_F(ShardedStateFailureTest, WithOneCopyAJoinerReceivesOnlyItsShards) {
  OneLeavesAndOneJoins(1);
}

void ShardedStateFailureTest::OneLeavesAndOneJoins(int copies) {
  const std::vector<std::string> flags = {
      "--shard-optimizer", absl::StrCat("--optimizer-state-copies=", copies), "--steps=1000"};
  std::vector<pid_t> pids = Run("l", flags);
  ASSERT_TRUE(WaitForStep("l0", 40, absl::Seconds(60))) << ReadText(dir_ + "/l0.log");
  ASSERT_EQ(::kill(pids[3], SIGTERM), 0);
  EXPECT_EQ(WaitExit(pids[3]), 0) << ReadText(dir_ + "/l3.log");
  EXPECT_NE(ReadText(dir_ + "/l3.log").find("left the job"), std::string::npos);
  ASSERT_TRUE(WaitForLine("l0", "world 3 on 2 nodes", absl::Seconds(30)))
      << ReadText(dir_ + "/l0.log");
  const std::string straight3 = "optimizer state moved straight to the shards of a world of 3";
  const pid_t joiner = Trainer(1, "l3b", "n1", "hier", AdamW(flags));
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(WaitExit(pids[i]), 0) << ReadText(absl::StrCat(dir_, "/l", i, ".log"));
    const std::string log = ReadText(absl::StrCat(dir_, "/l", i, ".log"));
    EXPECT_NE(log.find(straight3), std::string::npos) << i << "\n" << log;
    EXPECT_EQ(log.find("handed over to the shards of the 3 ranks that stay") != std::string::npos,
              copies == 1)
        << i << "\n" << log;
  }
  EXPECT_EQ(WaitExit(joiner), 0) << ReadText(dir_ + "/l3b.log");
  const std::string joined = ReadText(dir_ + "/l3b.log");
  EXPECT_NE(joined.find("optimizer state moved straight to the shards of a world of 4"),
            std::string::npos)
      << joined;
  const std::string s0 = ReadText(dir_ + "/l0.json");
  EXPECT_EQ(JsonNumber(s0, "steps"), "1000") << s0;
  EXPECT_EQ(JsonNumber(s0, "world_size"), "4") << s0;
  EXPECT_EQ(JsonNumber(s0, "steps_dropped"), "0") << s0;
  ExpectParametersOf({"l1", "l2", "l3b"}, s0);
}

// A trainer SIGKILLed mid-run takes its parts of the state with it; their
// copies on the other node live on: the survivors regather the state from
// memory (no checkpoint: none is written), salvage the step and go on, a
// replacement joins, and every rank ends with the same parameters.
TEST_F(ShardedStateFailureTest, AKilledRanksPartsLiveOnInItsBuddyAndTheJobEndsAsOne) {
  KillOneOfFourAndReplaceIt({});
}

// The same with the gradients reduce-scattered by columns: the kill breaks
// a step's column reduction, the world of three (a node of one) all-reduces,
// and once the replacement makes two nodes of two again the new shards are
// reduce-scattered by columns again. The gradients are clipped throughout
// (the salvaged step's after its re-reduction): every rank ends with the
// same parameters and the same last norm.
TEST_F(ShardedStateFailureTest, WithReduceScatterAKilledRanksPartsLiveOnInItsBuddy) {
  KillOneOfFourAndReplaceIt({"--reduce-scatter", "--clip-grad-norm=0.5"});
  const std::string norm = JsonNumber(ReadText(dir_ + "/k0.json"), "last_gradient_norm");
  ASSERT_FALSE(norm.empty()) << ReadText(dir_ + "/k0.json");
  EXPECT_GT(std::stod(norm), 0) << norm;
  for (const char* tag : {"k1", "k2", "k3b"}) {
    EXPECT_EQ(JsonNumber(ReadText(dir_ + "/" + tag + ".json"), "last_gradient_norm"), norm)
        << tag;
  }
  const std::string log = ReadText(dir_ + "/k0.log");
  const std::string line = "gradients reduce-scattered over 4 ranks";
  const size_t first = log.find(line);
  ASSERT_NE(first, std::string::npos) << log;
  EXPECT_NE(log.find(line, first + 1), std::string::npos) << "not again after the join\n" << log;
  EXPECT_EQ(log.find("reduce-scattered over 3 ranks"), std::string::npos) << log;
}

// A hot spare on a third node takes a killed rank's place inside the step
// the kill broke, the gradients reduce-scattered by columns: the new world
// (nodes of two, one and one) all-reduces, and the survivors re-reduce the
// step through its buckets, not the failed world's, as the spare adds its
// zeros through them. Every rank ends with the same parameters, no step
// dropped.
TEST_F(ShardedStateFailureTest, WithReduceScatterAHotSpareOnAThirdNodeJoinsTheSalvagedStep) {
  const std::vector<std::string> flags = {"--shard-optimizer", "--reduce-scatter",
                                          "--steps=300"};
  std::vector<pid_t> pids = Run("h", flags);
  ASSERT_TRUE(WaitForStep("h0", 40, absl::Seconds(60))) << ReadText(dir_ + "/h0.log");
  ASSERT_NO_FATAL_FAILURE(ASpareReplacesRank3("h", flags, &pids));
  const std::string log = ReadText(dir_ + "/h0.log");
  EXPECT_NE(log.find("world 4 on 3 nodes"), std::string::npos) << log;
  // A kill inside a step is salvaged: three shares where every survivor
  // was in the step, two where one's boundary broke before it began it (it
  // adds zeros, as the spare does). A kill between steps leaves none.
  const std::string survivors = log + ReadText(dir_ + "/h1.log") + ReadText(dir_ + "/h2.log");
  if (std::regex_search(survivors, std::regex("step [0-9]+ failed: "))) {
    EXPECT_TRUE(std::regex_search(
        survivors,
        std::regex("step [0-9]+ salvaged in generation [0-9]+: [23] of 4 shares reduced")))
        << survivors;
  }
  const std::string s0 = ReadText(dir_ + "/h0.json");
  EXPECT_EQ(JsonNumber(s0, "steps"), "300") << s0;
  EXPECT_EQ(JsonNumber(s0, "steps_dropped"), "0") << s0;
  ExpectParametersOf({"h1", "h2", "h4"}, s0);
  EXPECT_NE(ReadText(dir_ + "/h4.log").find("optimizer state moved straight to the shards"),
            std::string::npos)
      << ReadText(dir_ + "/h4.log");
}

void ShardedStateFailureTest::KillOneOfFourAndReplaceIt(const std::vector<std::string>& extra) {
  std::vector<std::string> flags = {"--shard-optimizer", "--steps=1000"};
  flags.insert(flags.end(), extra.begin(), extra.end());
  std::vector<pid_t> pids = Run("k", flags);
  ASSERT_TRUE(WaitForLine("k0", "world 4 on 2 nodes", absl::Seconds(60)))
      << ReadText(dir_ + "/k0.log");
  ASSERT_TRUE(WaitForStep("k0", 40, absl::Seconds(60))) << ReadText(dir_ + "/k0.log");
  ASSERT_EQ(::kill(pids[3], SIGKILL), 0);
  WaitExit(pids[3]);
  ASSERT_TRUE(WaitForLine("k0", "world 3 on 2 nodes", absl::Seconds(30)))
      << ReadText(dir_ + "/k0.log") << "\nk1:\n" << ReadText(dir_ + "/k1.log") << "\nk2:\n"
      << ReadText(dir_ + "/k2.log");
  const pid_t replacement = Trainer(1, "k3b", "n1", "hier", AdamW(flags));
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(WaitExit(pids[i]), 0) << ReadText(absl::StrCat(dir_, "/k", i, ".log"));
  }
  EXPECT_EQ(WaitExit(replacement), 0) << ReadText(dir_ + "/k3b.log");
  const std::string s0 = ReadText(dir_ + "/k0.json");
  EXPECT_EQ(JsonNumber(s0, "steps"), "1000") << s0;
  EXPECT_GE(std::stoi(JsonNumber(s0, "regroups")), 1) << s0;
  EXPECT_EQ(JsonNumber(s0, "steps_dropped"), "0") << s0;
  ExpectParametersOf({"k1", "k2", "k3b"}, s0);
  EXPECT_EQ(ReadText(dir_ + "/k0.log").find("no living holder"), std::string::npos);
  // The replacement joined at a step boundary: it received only its shards.
  EXPECT_NE(ReadText(dir_ + "/k3b.log").find("optimizer state moved straight to the shards"),
            std::string::npos)
      << ReadText(dir_ + "/k3b.log");
}

// With one copy of each part, a SIGKILLed rank's parts are gone: the
// survivors say so, take the newest committed checkpoint in the running
// job (no restart), each reading only the ranges of its shards from the
// checkpoint's shard files, and train on from it; the failed step is
// dropped, and every rank ends with the same parameters.
TEST_F(ShardedStateFailureTest, WithOneCopyALostPartComesFromTheNewestCheckpoint) {
  KillOneOfFourWithOneCopy({});
}

// The same with the gradients reduce-scattered: the kill breaks a step's
// reduce-scatter instead of its all-reduce, and the survivors go on alike.
TEST_F(ShardedStateFailureTest, WithReduceScatterALostPartComesFromTheNewestCheckpoint) {
  KillOneOfFourWithOneCopy({"--reduce-scatter"});
}

void ShardedStateFailureTest::KillOneOfFourWithOneCopy(const std::vector<std::string>& extra) {
  std::vector<std::string> flags = {"--shard-optimizer", "--optimizer-state-copies=1",
                                    "--checkpoint-dir=" + dir_ + "/ckpt",
                                    "--checkpoint-every=20", "--steps=400"};
  flags.insert(flags.end(), extra.begin(), extra.end());
  std::vector<pid_t> pids = Run("c", flags);
  // Committed by the last of the four reports, which may come after rank
  // 0's "written".
  ASSERT_TRUE(WaitForLine("coordinator", "committed (latest step 40)", absl::Seconds(90)))
      << ReadText(dir_ + "/coordinator.log");
  ASSERT_EQ(::kill(pids[3], SIGKILL), 0);
  WaitExit(pids[3]);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(WaitExit(pids[i]), 0) << ReadText(absl::StrCat(dir_, "/c", i, ".log"));
  }
  const std::string log0 = ReadText(dir_ + "/c0.log");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(log0, m,
                                std::regex("no living holder: it must come from a checkpoint: "
                                           "restored the checkpoint of step ([0-9]+)")))
      << log0;
  EXPECT_GE(std::stoi(m[1]), 40) << log0;
  // Its optimizer state came from the shard files, each rank its own
  // ranges of the world of three, never whole.
  for (const char* tag : {"c0", "c1", "c2"}) {
    const std::string log = ReadText(dir_ + "/" + tag + ".log");
    EXPECT_NE(log.find(absl::StrCat("optimizer state of the checkpoint of step ", m[1].str(),
                                    " read into the shards of a world of 3")),
              std::string::npos)
        << tag << "\n" << log;
  }
  const std::string s0 = ReadText(dir_ + "/c0.json");
  EXPECT_EQ(JsonNumber(s0, "steps"), "400") << s0;
  EXPECT_EQ(JsonNumber(s0, "world_size"), "3") << s0;
  if (std::find(extra.begin(), extra.end(), "--reduce-scatter") != extra.end()) {
    EXPECT_NE(log0.find("gradients reduce-scattered over 3 ranks"), std::string::npos) << log0;
  }
  ExpectParametersOf({"c1", "c2"}, s0);
}

// With one copy, a hot spare (on a third node) takes the place of a rank
// SIGKILLed after the checkpoint of step 40. Where the kill falls inside a
// step, the spare could get that step only through the whole state on
// every rank, so the step is dropped and the world entered again; either
// way the dead rank's ranges are gone, and all four ranks, the spare
// among them, read only their own ranges of the world of four from the
// newest checkpoint's shard files, and end with the same parameters.
TEST_F(ShardedStateFailureTest, WithOneCopyAHotSpareReadsItsRangesFromTheNewestCheckpoint) {
  const std::vector<std::string> flags = {"--shard-optimizer", "--optimizer-state-copies=1",
                                          "--checkpoint-dir=" + dir_ + "/ckpt",
                                          "--checkpoint-every=20", "--steps=400"};
  std::vector<pid_t> pids = Run("o", flags);
  ASSERT_TRUE(WaitForLine("coordinator", "committed (latest step 40)", absl::Seconds(90)))
      << ReadText(dir_ + "/coordinator.log");
  ASSERT_NO_FATAL_FAILURE(ASpareReplacesRank3("o", flags, &pids));
  const std::string log0 = ReadText(dir_ + "/o0.log");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(log0, m, std::regex("restored the checkpoint of step ([0-9]+)")))
      << log0;
  EXPECT_GE(std::stoi(m[1]), 40) << log0;
  for (const char* tag : {"o0", "o1", "o2", "o4"}) {
    const std::string log = ReadText(dir_ + "/" + tag + ".log");
    EXPECT_NE(log.find(absl::StrCat("optimizer state of the checkpoint of step ", m[1].str(),
                                    " read into the shards of a world of 4")),
              std::string::npos)
        << tag << "\n"
        << log;
  }
  const std::string s0 = ReadText(dir_ + "/o0.json");
  EXPECT_EQ(JsonNumber(s0, "steps"), "400") << s0;
  EXPECT_EQ(JsonNumber(s0, "world_size"), "4") << s0;
  ExpectParametersOf({"o1", "o2", "o4"}, s0);
}

// With --reduce-scatter each rank receives only the average of the parts
// it steps: with one copy ("r") its own; with two ("c"), on two nodes of two
// ranks, its own and its buddy's, which share its column. Every rank ends
// with the same parameters, equal to the all-reduced sharded run's ("a")
// within float32 summation order; with one copy each held the same quarter
// of the state; the log says the gradients were reduce-scattered. The state
// check every 10 steps compares each rank's masters with its parameters
// and, with two copies, each part's owner with its buddy, bit for bit.
TEST_F(ShardedStateTest, ReduceScatteredGradientsTrainAsAllReducedWithinRounding) {
  for (const std::string& tag : {std::string("a"), std::string("r"), std::string("c")}) {
    std::vector<std::string> flags = {"--shard-optimizer", "--check-state-every=10"};
    flags.push_back(tag == "c" ? "--optimizer-state-copies=2" : "--optimizer-state-copies=1");
    if (tag != "a") {
      NewCoordinator();
      flags.push_back("--reduce-scatter");
    }
    RunToEnd(tag, flags);
  }
  const std::string c0 = ReadText(dir_ + "/c0.json");
  EXPECT_EQ(JsonNumber(c0, "steps"), "250") << c0;
  EXPECT_EQ(JsonNumber(c0, "regroups"), "0") << c0;
  const double columns = std::stod(JsonNumber(c0, "parameter_checksum"));
  const double reference = std::stod(JsonNumber(ReadText(dir_ + "/a0.json"), "parameter_checksum"));
  EXPECT_NEAR(columns, reference, kScatterTolerance * std::abs(reference)) << c0;
  for (int i = 1; i < 4; ++i) {
    EXPECT_EQ(JsonNumber(ReadText(absl::StrCat(dir_, "/c", i, ".json")), "parameter_checksum"),
              JsonNumber(c0, "parameter_checksum"))
        << i;
  }
  EXPECT_NE(ReadText(dir_ + "/c0.log").find("each rank keeping its column's segments"),
            std::string::npos)
      << ReadText(dir_ + "/c0.log");
  const std::string a0 = ReadText(dir_ + "/a0.json"), r0 = ReadText(dir_ + "/r0.json");
  EXPECT_EQ(JsonNumber(r0, "steps"), "250") << r0;
  EXPECT_EQ(JsonNumber(r0, "regroups"), "0") << r0;
  const double all_reduced = std::stod(JsonNumber(a0, "parameter_checksum"));
  const double scattered = std::stod(JsonNumber(r0, "parameter_checksum"));
  EXPECT_NEAR(scattered, all_reduced, kScatterTolerance * std::abs(all_reduced)) << r0;
  for (int i = 0; i < 4; ++i) {
    const std::string ri = ReadText(absl::StrCat(dir_, "/r", i, ".json"));
    EXPECT_EQ(JsonNumber(ri, "parameter_checksum"), JsonNumber(r0, "parameter_checksum")) << i;
    EXPECT_EQ(JsonNumber(ri, "optimizer_state_elements"),
              JsonNumber(ReadText(absl::StrCat(dir_, "/a", i, ".json")),
                         "optimizer_state_elements"))
        << i;
  }
  EXPECT_NE(ReadText(dir_ + "/r0.log").find("gradients reduce-scattered over 4 ranks"),
            std::string::npos)
      << ReadText(dir_ + "/r0.log");
  EXPECT_EQ(ReadText(dir_ + "/a0.log").find("reduce-scattered"), std::string::npos);
}

// A trainer started with options of its own (another bucket size: its
// collectives would be of other sizes) joins a running job of three, as
// local rank 0 of the first node: rank 0 of the next world. The options
// that count are those of the world's state source (an incumbent), so it
// is the newcomer that is told which option differs, before any
// collective, leaves, and exits with the configuration's code; the three
// go on without it and end alike.
class JobSettingsTest : public ShardedStateTest {
 protected:
  int MinMembers() const override { return 3; }
};

TEST_F(JobSettingsTest, AJoinerWithOtherOptionsLeavesNamingThemAndTheJobGoesOn) {
  std::vector<pid_t> pids;
  for (int i = 0; i < 3; ++i) {  // n0/1, n1/0, n1/1
    pids.push_back(Trainer((i + 1) % 2, absl::StrCat("j", i), absl::StrCat("n", (i + 1) / 2),
                           "hier", AdamW({"--steps=400"})));
  }
  ASSERT_TRUE(WaitForStep("j0", 20, absl::Seconds(60))) << ReadText(dir_ + "/j0.log");
  const pid_t odd = Trainer(0, "j3", "n0", "hier", AdamW({"--steps=400", "--bucket-mb=1"}));
  EXPECT_EQ(WaitExit(odd), 78) << ReadText(dir_ + "/j3.log");
  EXPECT_NE(ReadText(dir_ + "/j3.log").find("bucket_mb is 1 here, 25 there"), std::string::npos)
      << ReadText(dir_ + "/j3.log");
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(WaitExit(pids[i]), 0) << ReadText(absl::StrCat(dir_, "/j", i, ".log"));
  }
  const std::string j0 = ReadText(dir_ + "/j0.json");
  EXPECT_EQ(JsonNumber(j0, "steps"), "400") << j0;
  EXPECT_EQ(JsonNumber(j0, "steps_dropped"), "0") << j0;
  for (int i = 1; i < 3; ++i) {
    EXPECT_EQ(JsonNumber(ReadText(absl::StrCat(dir_, "/j", i, ".json")), "parameter_checksum"),
              JsonNumber(j0, "parameter_checksum"))
        << i;
  }
}

class ShardedStateResumeTest : public ShardedStateTest {
 protected:
  int MinMembers() const override { return 3; }
  std::string StateDir() const override { return dir_ + "/" + state_; }
  // The first job's coordinator is stopped and its state (the checkpoint
  // catalog) copied for each requeued job: "state-s" and "state-u".
  void CopyCatalog() {
    ::kill(coordinator_, SIGTERM);
    WaitExit(coordinator_);
    std::system(("cp -r " + dir_ + "/state " + dir_ + "/state-s && cp -r " + dir_ + "/state " +
                 dir_ + "/state-u")
                    .c_str());
  }
  // The job requeued as three trainers, sharded (`tag` "s") or not ("u"),
  // on its own copy of the catalog, with `common` flags; each must exit 0.
  // The first trainer's log.
  std::string RequeueAsThree(const std::string& tag, const std::vector<std::string>& common) {
    state_ = "state-" + tag;
    StartCoordinator();
    std::vector<std::string> flags = AdamW(common);
    if (tag == "s") flags.push_back("--shard-optimizer");
    const std::vector<pid_t> three = {Trainer(0, tag + "0", "n0", "hier", flags),
                                      Trainer(1, tag + "1", "n0", "hier", flags),
                                      Trainer(0, tag + "2", "n1", "hier", flags)};
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(WaitExit(three[i]), 0) << ReadText(absl::StrCat(dir_, "/", tag, i, ".log"));
      // Sharded, each rank read only the ranges it keeps from the files,
      // never the whole state.
      if (tag == "s") {
        const std::string log = ReadText(absl::StrCat(dir_, "/", tag, i, ".log"));
        EXPECT_TRUE(std::regex_search(
            log, std::regex("optimizer state of the checkpoint of step [0-9]+ read into the shards of "
                       "a world of 3")))
            << log;
      }
    }
    ::kill(coordinator_, SIGTERM);
    WaitExit(coordinator_);
    coordinator_ = -1;
    return ReadText(dir_ + "/" + tag + "0.log");
  }
  // Both requeued jobs trained to step 300 as three and ended with the
  // same parameters on every rank.
  void ExpectBothEndAsOne() {
    const std::string s0 = ReadText(dir_ + "/s0.json"), u0 = ReadText(dir_ + "/u0.json");
    EXPECT_EQ(JsonNumber(s0, "steps"), "300") << s0;
    EXPECT_EQ(JsonNumber(s0, "world_size"), "3") << s0;
    EXPECT_EQ(JsonNumber(s0, "parameter_checksum"), JsonNumber(u0, "parameter_checksum"));
    for (const char* tag : {"s1", "s2"}) {
      EXPECT_EQ(JsonNumber(ReadText(dir_ + "/" + tag + ".json"), "parameter_checksum"),
                JsonNumber(s0, "parameter_checksum"))
          << tag;
    }
  }
  std::string state_ = "state";
};

// Four trainers with sharded state, stopped by SIGUSR1 (every rank
// writes the part of the state it owns into the checkpoint to stop, a file
// a rank, and exits 75), requeued as three: the sharded job ends bit for
// bit as three unsharded trainers that resumed the same checkpoint.
TEST_F(ShardedStateResumeTest, StoppedAsFourResumedAsThreeEndsAsUnshardedFromTheSameCheckpoint) {
  const std::vector<std::string> common = {"--checkpoint-dir=" + dir_ + "/ckpt", "--steps=300"};
  std::vector<std::string> first = common;
  first.insert(first.end(), {"--shard-optimizer", "--checkpoint-every=50"});
  std::vector<pid_t> pids = Run("a", first);
  ASSERT_TRUE(WaitForLine("a0", "world 4 on 2 nodes", absl::Seconds(60)))
      << ReadText(dir_ + "/a0.log");
  ASSERT_TRUE(WaitForStep("a0", 60, absl::Seconds(60))) << ReadText(dir_ + "/a0.log");
  for (pid_t p : pids) ASSERT_EQ(::kill(p, SIGUSR1), 0);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(WaitExit(pids[i]), 75) << ReadText(absl::StrCat(dir_, "/a", i, ".log"));
  }
  const std::string log_a = ReadText(dir_ + "/a0.log");
  std::smatch m;
  ASSERT_TRUE(
      std::regex_search(log_a, m, std::regex("stopping at step ([0-9]+) after checkpointing")))
      << log_a;
  const std::string stopped = m[1];
  const std::string step_dir = dir_ + "/ckpt/step-" + stopped;
  for (int r = 0; r < 4; ++r) {
    EXPECT_TRUE(std::filesystem::exists(
        absl::StrCat(step_dir, "/optimizer-shard-", r, "-of-4.safetensors")));
  }
  EXPECT_FALSE(std::filesystem::exists(step_dir + "/optimizer.safetensors"));
  // The requeued job twice, neither writing a checkpoint.
  CopyCatalog();
  for (const std::string& tag : {std::string("s"), std::string("u")}) {
    const std::string log = RequeueAsThree(tag, common);
    EXPECT_NE(log.find("resumed from the checkpoint of step " + stopped), std::string::npos) << log;
  }
  ExpectBothEndAsOne();
  // Every rank told the coordinator it stopped with the job, so the world
  // was forgotten: the restarted coordinators waited for none of the four
  // (they once waited their 30 s reattach grace for members that were gone).
  const std::string coordinator = ReadText(dir_ + "/coordinator.log");
  EXPECT_NE(coordinator.find("the job stopped at generation 1"), std::string::npos) << coordinator;
  EXPECT_EQ(coordinator.find("restarted; waiting"), std::string::npos) << coordinator;
}

// Four trainers with sharded state write their checkpoints a file per
// part; all four are SIGKILLed, and the job is requeued as three: the
// newest checkpoint's parts are put together on load, so three sharded
// and three unsharded trainers resume the same step and end bit for bit
// the same.
TEST_F(ShardedStateResumeTest, KilledAsFourResumedAsThreeFromItsShardFiles) {
  const std::vector<std::string> common = {"--checkpoint-dir=" + dir_ + "/ckpt", "--steps=300"};
  std::vector<std::string> first = common;
  first.insert(first.end(), {"--shard-optimizer", "--checkpoint-every=50"});
  std::vector<pid_t> pids = Run("a", first);
  // Each rank writes and reports its own part and the last report
  // commits the checkpoint, which may come after rank 0's: wait for the
  // coordinator's commit before the kill.
  ASSERT_TRUE(WaitForLine("coordinator", "committed (latest step 100)", absl::Seconds(120)))
      << ReadText(dir_ + "/coordinator.log");
  for (pid_t p : pids) ::kill(p, SIGKILL);
  for (pid_t p : pids) WaitExit(p);
  CopyCatalog();
  std::string resumed;
  for (const std::string& tag : {std::string("s"), std::string("u")}) {
    const std::string log = RequeueAsThree(tag, common);
    std::smatch m;
    ASSERT_TRUE(
        std::regex_search(log, m, std::regex("resumed from the checkpoint of step ([0-9]+)")))
        << log;
    if (resumed.empty()) resumed = m[1];
    EXPECT_EQ(m[1], resumed) << log;
  }
  EXPECT_GE(std::stoi(resumed), 100);
  const std::string step_dir = dir_ + "/ckpt/step-" + resumed;
  EXPECT_TRUE(std::filesystem::exists(step_dir + "/optimizer-shard-3-of-4.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(step_dir + "/optimizer.safetensors"));
  ExpectBothEndAsOne();
  // The killed job's world paused as its members' sessions closed, and was
  // stored so: the restarted coordinators waited for none of them.
  const std::string coordinator = ReadText(dir_ + "/coordinator.log");
  EXPECT_EQ(coordinator.find("restarted; waiting"), std::string::npos) << coordinator;
}

}  // namespace
}  // namespace muster
