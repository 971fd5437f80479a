// libmuster as a user meets it: examples/char_lm (a GRU language model with
// AdamW, a cosine schedule, an extra tensor and a blob of its own) run as
// real processes against a real coordinator, under muster-agent as 2 nodes
// x 2 trainers, or as plain processes joining and leaving. Each node is a
// host of a muster-lab lab (lab_hosts.h), with the coordinator on the
// bridge's address here; on loopback where the lab cannot start.
#include <signal.h>
#include <unistd.h>

#include <dirent.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "tests/integration/lab_hosts.h"
#include "tests/integration/scratch_dir.h"
#include "tests/integration/subprocess.h"

namespace muster {
namespace {

const std::string kBin = MUSTER_BIN_DIR;

std::vector<std::string> ListFiles(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] != '.') out.push_back(dir + "/" + e->d_name);
    }
    ::closedir(d);
  }
  return out;
}

std::string JsonString(const std::string& json, const std::string& name) {
  std::smatch m;
  if (std::regex_search(json, m, std::regex("\"" + name + "\": \"([^\"]*)\""))) return m[1];
  return "";
}

class LibraryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/library" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::system(("rm -rf " + dir_ + " && mkdir -p " + dir_ + "/summary " + dir_ +
                 "/summary-reference " + dir_ + "/record")
                    .c_str());
    // Shared memory segments are named after the job: one per test process.
    setenv("MUSTER_JOB", absl::StrCat("lib", ::getpid()).c_str(), 1);
    hosts_ = std::make_unique<LabHosts>("LibraryTest", 6);
  }
  void TearDown() override {
    StopCoordinator();
    hosts_.reset();  // ends what is left in its namespaces
    RemoveScratchUnlessFailed(dir_);
  }

  // A coordinator on `state` (kept across restarts, like a requeued job).
  void StartCoordinator(int min_members, int max_members, const std::string& state,
                        const std::string& last_call = "300ms") {
    target_ = absl::StrCat(hosts_->Gateway(), ":", FreeLoopbackPort());
    coordinator_ = SpawnLogged(
        {kBin + "/muster-coordinator", "--listen=" + target_, "--no-auth",
         "--state-dir=" + dir_ + "/" + state, absl::StrCat("--min-members=", min_members),
         absl::StrCat("--max-members=", max_members), "--last-call=" + last_call,
         "--heartbeat-interval=200ms", "--heartbeat-timeout=2s"},
        absl::StrCat(dir_, "/coordinator-", state, ".log"));
  }
  void StopCoordinator() {
    if (coordinator_ > 0) {
      ::kill(coordinator_, SIGTERM);
      WaitExit(coordinator_);
      coordinator_ = -1;
    }
  }

  std::vector<std::string> LmArgs(const std::string& summary, const std::vector<std::string>& more) {
    std::vector<std::string> args = {kBin + "/char_lm", "--batch", "4", "--pace-ms", "30",
                                     "--record", dir_ + "/record", "--summary",
                                     dir_ + "/" + summary + "/{pid}.json"};
    args.insert(args.end(), more.begin(), more.end());
    return args;
  }

  pid_t Agent(const std::string& node, const std::string& summary,
              const std::vector<std::string>& more, const std::string& spares = "0") {
    return AgentOf(node, LmArgs(summary, more), spares);
  }

  // examples/gan: a generator and a discriminator, two Adam optimizers, two
  // passes per step, on the first 4000 Fashion-MNIST images.
  pid_t GanAgent(const std::string& node, const std::string& summary,
                 const std::vector<std::string>& more) {
    std::vector<std::string> args = {kBin + "/gan", "--examples", "4000", "--batch", "16",
                                     "--pace-ms", "20", "--summary",
                                     dir_ + "/" + summary + "/{pid}.json"};
    args.insert(args.end(), more.begin(), more.end());
    return AgentOf(node, args);
  }

  pid_t AgentOf(const std::string& node, const std::vector<std::string>& program,
                const std::string& spares = "0") {
    std::vector<std::string> argv = {kBin + "/muster-agent", "--nproc-per-node=2",
                                     "--spares=" + spares, "--restart-backoff=100ms",
                                     "--max-restarts=2", "--node-id=" + node, "--"};
    for (const std::string& a : program) argv.push_back(a);
    setenv("MUSTER_COORDINATOR", target_.c_str(), 1);
    return SpawnLogged(hosts_->OnNode(node, argv), absl::StrCat(dir_, "/", node, ".log"));
  }

  bool WaitForLine(const std::string& log, const std::string& text, absl::Duration timeout) {
    const absl::Time end = absl::Now() + timeout;
    while (absl::Now() < end) {
      if (ReadText(dir_ + "/" + log).find(text) != std::string::npos) return true;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return false;
  }

  // Until `log` shows a step of at least `step`.
  bool WaitForStep(const std::string& log, int step, absl::Duration timeout) {
    const absl::Time end = absl::Now() + timeout;
    while (absl::Now() < end) {
      if (LatestLoggedStep(ReadText(dir_ + "/" + log)) >= step) return true;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return false;
  }

  // step -> digests of the processes that ended there.
  std::map<int, std::vector<std::string>> Summaries(const std::string& summary) {
    std::map<int, std::vector<std::string>> out;
    for (const std::string& f : ListFiles(dir_ + "/" + summary)) {
      const std::string json = ReadText(f);
      out[std::stoi(JsonNumber(json, "steps"))].push_back(JsonString(json, "digest"));
    }
    return out;
  }

  // The digest every one of `n` processes that ended at the last step holds.
  std::string CommonFinalDigest(const std::string& summary, size_t n) {
    auto by_step = Summaries(summary);
    if (by_step.empty()) return "no summaries";
    const std::vector<std::string>& last = by_step.rbegin()->second;
    EXPECT_EQ(last.size(), n) << "processes that ended at step " << by_step.rbegin()->first;
    for (const std::string& d : last) EXPECT_EQ(d, last[0]) << "state differs between ranks";
    return last[0];
  }

  // Every example of every epoch exactly once, summed over all the `record`
  // files of the processes (a data set of at least `at_least` examples).
  void ExpectEveryExampleOncePerEpoch(const std::string& record, int epochs, int at_least) {
    std::map<std::pair<int, int>, int> seen;
    int examples = 0;
    for (const std::string& f : ListFiles(dir_ + "/" + record)) {
      std::istringstream in(ReadText(f));
      int epoch = 0, index = 0;
      while (in >> epoch >> index) {
        ++seen[{epoch, index}];
        examples = std::max(examples, index + 1);
      }
    }
    ASSERT_GE(examples, at_least);
    for (int e = 0; e < epochs; ++e) {
      for (int i = 0; i < examples; ++i) {
        EXPECT_EQ((seen[{e, i}]), 1) << "epoch " << e << " example " << i;
      }
    }
    EXPECT_EQ(seen.size(), static_cast<size_t>(epochs * examples)) << "an example past the end";
  }

  // Agents `a` and `b` (logs a.log, b.log) train as a world of 4; past
  // step `at_step`, b's trainer 1 is SIGKILLed. Both agents end 0, b's
  // trainer restarted once and took its state from a live peer.
  void KillTrainer1OfBAndFinish(pid_t a, pid_t b, int at_step) {
    ASSERT_TRUE(WaitForLine("a.log", "world 4 on 2 nodes", absl::Seconds(60)))
        << ReadText(dir_ + "/a.log");
    ASSERT_TRUE(WaitForStep("a.log", at_step, absl::Seconds(60))) << ReadText(dir_ + "/a.log");
    const pid_t victim = LastTrainerPid(dir_ + "/b.log", 1);
    ASSERT_GT(victim, 0) << ReadText(dir_ + "/b.log");
    ASSERT_EQ(::kill(victim, SIGKILL), 0);
    EXPECT_EQ(WaitExit(a), 0) << ReadText(dir_ + "/a.log");
    EXPECT_EQ(WaitExit(b), 0) << ReadText(dir_ + "/b.log");
    const std::string log_b = ReadText(dir_ + "/b.log");
    EXPECT_NE(log_b.find("trainer 1 started (restart 1)"), std::string::npos) << log_b;
    // The replacement says where its state came from: a live peer.
    EXPECT_NE(log_b.find("took the live state of step"), std::string::npos) << log_b;
  }

  using AgentFn = std::function<pid_t(const std::string& node, const std::string& summary,
                                      const std::vector<std::string>& more)>;
  // The job `run` by two agents of `agent`, never interrupted (the
  // reference); then again, stopped by SIGUSR1 on both agents once past
  // step `stop_after` (every rank checkpoints and exits 75) and requeued
  // (the coordinator restarted on its state dir, the agents again): it
  // resumes from that checkpoint and ends bit-identical to the reference.
  void StopAndRestartEndAsTheUninterruptedRun(const AgentFn& agent,
                                               const std::vector<std::string>& run,
                                               int stop_after,
                                               const std::function<void()>& after_stop = {}) {
    StartCoordinator(4, 4, "reference");
    std::vector<std::string> ref = run;
    ref.insert(ref.end(), {"--checkpoint-dir", dir_ + "/ckpt-reference"});
    pid_t a = agent("a", "summary-reference", ref), b = agent("b", "summary-reference", ref);
    ASSERT_EQ(WaitExit(a), 0) << ReadText(dir_ + "/a.log");
    ASSERT_EQ(WaitExit(b), 0) << ReadText(dir_ + "/b.log");
    StopCoordinator();
    const std::string reference = CommonFinalDigest("summary-reference", 4);

    std::vector<std::string> stopped = run;
    stopped.insert(stopped.end(), {"--checkpoint-dir", dir_ + "/ckpt"});
    StartCoordinator(4, 4, "state");
    a = agent("a1", "summary", stopped);
    b = agent("b1", "summary", stopped);
    ASSERT_TRUE(WaitForStep("a1.log", stop_after, absl::Seconds(60)))
        << ReadText(dir_ + "/a1.log");
    ::kill(a, SIGUSR1);
    ::kill(b, SIGUSR1);
    EXPECT_EQ(WaitExit(a), 75) << ReadText(dir_ + "/a1.log");
    EXPECT_EQ(WaitExit(b), 75) << ReadText(dir_ + "/b1.log");
    ASSERT_NE(ReadText(dir_ + "/a1.log").find("after checkpointing"), std::string::npos);
    if (after_stop) after_stop();  // before the restart's checkpoints retire the stop's
    StopCoordinator();
    std::system(("rm -rf " + dir_ + "/summary/*").c_str());
    StartCoordinator(4, 4, "state");
    a = agent("a2", "summary", stopped);
    b = agent("b2", "summary", stopped);
    ASSERT_EQ(WaitExit(a), 0) << ReadText(dir_ + "/a2.log");
    ASSERT_EQ(WaitExit(b), 0) << ReadText(dir_ + "/b2.log");
    EXPECT_NE(ReadText(dir_ + "/a2.log").find("resumed from the checkpoint of step"),
              std::string::npos);
    EXPECT_EQ(CommonFinalDigest("summary", 4), reference);
  }

  std::string dir_, target_;
  std::unique_ptr<LabHosts> hosts_;
  pid_t coordinator_ = -1;
};

TEST_F(LibraryTest, AKilledTrainerIsReplacedAndEveryRankEndsBitIdentical) {
  StartCoordinator(/*min_members=*/2, /*max_members=*/4, "state");
  const std::vector<std::string> run = {"--epochs", "16"};
  const pid_t a = Agent("a", "summary", run), b = Agent("b", "summary", run);
  ASSERT_TRUE(WaitForLine("a.log", "world 4 on 2 nodes", absl::Seconds(60)))
      << ReadText(dir_ + "/a.log");
  ASSERT_TRUE(WaitForStep("a.log", 20, absl::Seconds(60))) << ReadText(dir_ + "/a.log");
  // Heartbeats carry each member's real step: `muster status` shows it.
  int code = -1;
  // Every member's, once its first heartbeat since the last regroup is in
  // (a heartbeat interval behind the trainer).
  std::string status;
  bool stepping = false;
  for (const absl::Time end = absl::Now() + absl::Seconds(10); !stepping && absl::Now() < end;) {
    status = RunShell(kBin + "/muster --coordinator=" + target_ + " status --json", &code);
    ASSERT_EQ(code, 0) << status;
    const std::vector<StatusMember> members = StatusMembers(status);
    stepping = members.size() == 4 && std::all_of(members.begin(), members.end(),
                                                  [](const StatusMember& m) { return m.step > 0; });
    if (!stepping) absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE(stepping) << status;
  // The full membership on request: every rank once, under one digest.
  const std::string world =
      RunShell(kBin + "/muster --coordinator=" + target_ + " world --json", &code);
  ASSERT_EQ(code, 0) << world;
  std::set<std::string> ranks;
  const std::regex rank_field("\"rank\": ([0-9]+)");
  for (std::sregex_iterator it(world.begin(), world.end(), rank_field), end; it != end; ++it) {
    ranks.insert((*it)[1]);
  }
  EXPECT_EQ(ranks, (std::set<std::string>{"0", "1", "2", "3"})) << world;
  EXPECT_NE(world.find("\"digest\""), std::string::npos) << world;
  const pid_t victim = LastTrainerPid(dir_ + "/b.log", 1);
  ASSERT_GT(victim, 0) << ReadText(dir_ + "/b.log");
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  EXPECT_EQ(WaitExit(a), 0) << ReadText(dir_ + "/a.log");
  EXPECT_EQ(WaitExit(b), 0) << ReadText(dir_ + "/b.log");
  const std::string log_a = ReadText(dir_ + "/a.log"), log_b = ReadText(dir_ + "/b.log");
  EXPECT_NE(log_a.find("(world 3, rank"), std::string::npos) << log_a;
  EXPECT_NE(log_b.find("trainer 1 started (restart 1)"), std::string::npos) << log_b;
  // The replacement took the full state from a live peer: at the end the
  // four ranks hold bit-identical model, AdamW state, extra tensor and blob.
  CommonFinalDigest("summary", 4);
}

// A refusal no restart can fix is not restarted: char_lm with a batch of 0
// is refused at Start (INVALID_ARGUMENT, named) and ends with 78, which
// muster-agent does not restart; the agent gives that slot up at once.
TEST_F(LibraryTest, AStartRefusedForItsOptionsExits78AndIsNotRestarted) {
  StartCoordinator(/*min_members=*/2, /*max_members=*/2, "state");
  const pid_t a = Agent("a", "summary", {"--batch", "0", "--epochs", "1"});
  EXPECT_EQ(WaitExit(a), 1);  // a slot gave up
  const std::string log = ReadText(dir_ + "/a.log");
  EXPECT_NE(log.find("batch_per_rank must be positive"), std::string::npos) << log;
  EXPECT_NE(log.find("exit 78"), std::string::npos) << log;
  EXPECT_EQ(log.find("(restart "), std::string::npos) << "restarted: " << log;
}

// examples/tabular as a user writes it: RMSprop with two parameter groups
// and a per-group step decay, BatchNorm, and LibTorch's data loader through
// muster::StepSampler; 2 agents x 2 trainers and one SIGKILL. Every rank
// holds the same state digest at every step (buffers are broadcast, the
// lazily created RMSprop state travels to the replacement), and each
// group's rate follows the schedule, the head's 10x the body's.
TEST_F(LibraryTest, RmspropGroupsBatchNormAndTheDataLoaderStayIdenticalThroughAKill) {
  StartCoordinator(/*min_members=*/2, /*max_members=*/4, "state");
  // The agent hands its coordinator to the program: nothing in the
  // environment says where it is.
  unsetenv("MUSTER_COORDINATOR");
  auto agent = [&](const std::string& node) {
    return SpawnLogged(
        hosts_->OnNode(node, {kBin + "/muster-agent", "--nproc-per-node=2",
                              "--restart-backoff=100ms", "--max-restarts=2", "--node-id=" + node,
                              "--coordinator=" + target_, "--", kBin + "/tabular", "--steps",
                              "400", "--decay-every", "50", "--pace-ms", "15", "--record",
                              dir_ + "/record", "--summary", dir_ + "/summary/{pid}.json"}),
        absl::StrCat(dir_, "/", node, ".log"));
  };
  KillTrainer1OfBAndFinish(agent("a"), agent("b"), /*at_step=*/100);
  // step -> the digests the ranks recorded after it
  std::map<int, std::set<std::string>> digests;
  int lines = 0;
  for (const std::string& f : ListFiles(dir_ + "/record")) {
    std::istringstream in(ReadText(f));
    int step = 0, prepared = 0;
    std::string digest;
    double body = 0, head = 0;
    while (in >> step >> digest >> prepared >> body >> head) {
      ++lines;
      digests[step].insert(digest);
      const double want = 1e-3 * std::pow(0.5, prepared / 50);
      EXPECT_NEAR(body, want, 1e-12 * want) << "body rate of step " << step;
      EXPECT_NEAR(head, 10 * want, 1e-11 * want) << "head rate of step " << step;
    }
  }
  EXPECT_GT(lines, 4 * 300);
  ASSERT_EQ(digests.rbegin()->first, 400);
  for (const auto& [step, seen] : digests) {
    EXPECT_EQ(seen.size(), 1u) << "the ranks' state differs after step " << step;
  }
  CommonFinalDigest("summary", 4);
}

TEST_F(LibraryTest, Sigusr1CheckpointsExits75AndTheRestartEndsAsAnUninterruptedRun) {
  StopAndRestartEndAsTheUninterruptedRun(
      [this](const std::string& node, const std::string& summary,
             const std::vector<std::string>& more) { return Agent(node, summary, more); },
      {"--epochs", "10", "--checkpoint-every", "25"}, /*stop_after=*/30);
}

bool HasFashionMnist() {
  return ::access("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", R_OK) == 0;
}

// examples/gan, 2 agents x 2 trainers: a trainer is SIGKILLed mid-run (in
// either pass of a step); its replacement takes both models and both
// optimizers' state from a live peer, and every rank ends bit-identical.
TEST_F(LibraryTest, AGanWithOneTrainerKilledEndsBitIdenticalOnEveryRank) {
  if (!HasFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  StartCoordinator(/*min_members=*/2, /*max_members=*/4, "state");
  const std::vector<std::string> run = {"--steps", "160"};
  KillTrainer1OfBAndFinish(GanAgent("a", "summary", run), GanAgent("b", "summary", run),
                           /*at_step=*/40);
  EXPECT_NE(ReadText(dir_ + "/a.log").find("gan: rank 0 of 4, step 160"), std::string::npos)
      << ReadText(dir_ + "/a.log");
  CommonFinalDigest("summary", 4);
}

// examples/gan with muster::SyncBatchNorm in both models: rank 3 SIGKILLs
// itself in step 30 as the discriminator's pass begins, so the others lose
// it inside SyncBatchNorm's sum in that pass's forward. They regroup and
// drop the pass rather than salvage it (its statistics held the dead
// rank's examples), the replacement takes the live state, and every rank
// ends bit-identical after all 120 steps.
TEST_F(LibraryTest, ASyncBatchNormGanDropsThePassALostRankWasInAndEndsBitIdentical) {
  if (!HasFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  StartCoordinator(/*min_members=*/2, /*max_members=*/4, "state");
  const std::vector<std::string> run = {"--steps", "120", "--sync-bn", "1", "--kill-rank", "3",
                                        "--kill-at-step", "30"};
  const pid_t a = GanAgent("a", "summary", run), b = GanAgent("b", "summary", run);
  EXPECT_EQ(WaitExit(a), 0) << ReadText(dir_ + "/a.log");
  EXPECT_EQ(WaitExit(b), 0) << ReadText(dir_ + "/b.log");
  const std::string logs = ReadText(dir_ + "/a.log") + ReadText(dir_ + "/b.log");
  EXPECT_NE(logs.find("started (restart 1)"), std::string::npos) << logs;
  EXPECT_NE(logs.find("SyncBatchNorm's statistics could not be summed"), std::string::npos)
      << logs;
  EXPECT_NE(logs.find("of step 31 failed"), std::string::npos) << logs;
  EXPECT_EQ(logs.find("salvaged"), std::string::npos) << logs;
  EXPECT_NE(logs.find(" of 4, step 120"), std::string::npos) << logs;
  CommonFinalDigest("summary", 4);
}

// examples/gan with both optimizers' state sharded: the generator's pass
// runs through the discriminator its optimizer has just stepped, each rank
// its own parts, so that pass's BeforeBackwardFor gathers the parts first.
// The gradients are all-reduced as unsharded, so the run ends bit for bit
// as the unsharded one, with about half the optimizer state per rank.
TEST_F(LibraryTest, AShardedGanEndsBitIdenticalToTheUnshardedRun) {
  if (!HasFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  const std::vector<std::string> run = {"--steps", "40"};
  std::vector<std::string> sharded = run;
  sharded.insert(sharded.end(), {"--shard-optimizer", "1"});
  StartCoordinator(/*min_members=*/4, /*max_members=*/4, "reference");
  pid_t a = GanAgent("a", "summary-reference", run), b = GanAgent("b", "summary-reference", run);
  EXPECT_EQ(WaitExit(a), 0) << ReadText(dir_ + "/a.log");
  EXPECT_EQ(WaitExit(b), 0) << ReadText(dir_ + "/b.log");
  StopCoordinator();
  StartCoordinator(/*min_members=*/4, /*max_members=*/4, "sharded");
  a = GanAgent("a1", "summary", sharded);
  b = GanAgent("b1", "summary", sharded);
  EXPECT_EQ(WaitExit(a), 0) << ReadText(dir_ + "/a1.log");
  EXPECT_EQ(WaitExit(b), 0) << ReadText(dir_ + "/b1.log");
  EXPECT_EQ(CommonFinalDigest("summary", 4), CommonFinalDigest("summary-reference", 4));
  // Each sharded rank held two of the four parts (its own and its buddy's).
  const std::vector<std::string> whole = ListFiles(dir_ + "/summary-reference");
  ASSERT_FALSE(whole.empty());
  const double unsharded = std::stod(JsonNumber(ReadText(whole[0]), "state_elements"));
  EXPECT_GT(unsharded, 0) << ReadText(whole[0]);
  for (const std::string& f : ListFiles(dir_ + "/summary")) {
    const std::string json = ReadText(f);
    const double held = std::stod(JsonNumber(json, "state_elements"));
    EXPECT_GT(held, 0) << f << ": " << json;
    EXPECT_LE(held, 0.51 * unsharded) << f << ": " << json;
  }
}

// The sharded GAN with a trainer SIGKILLed mid-run, in either pass: the
// survivors regather the dead rank's parts from their buddies (the
// discriminator's stepped parts among them, where the kill comes in the
// generator's pass), the replacement takes the live state, and every rank
// ends bit-identical.
TEST_F(LibraryTest, AShardedGanWithOneTrainerKilledEndsBitIdenticalOnEveryRank) {
  if (!HasFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  StartCoordinator(/*min_members=*/2, /*max_members=*/4, "state");
  const std::vector<std::string> run = {"--steps", "160", "--shard-optimizer", "1"};
  KillTrainer1OfBAndFinish(GanAgent("a", "summary", run), GanAgent("b", "summary", run),
                           /*at_step=*/40);
  EXPECT_NE(ReadText(dir_ + "/a.log").find("gan: rank 0 of 4, step 160"), std::string::npos)
      << ReadText(dir_ + "/a.log");
  CommonFinalDigest("summary", 4);
}

// examples/gan stopped by SIGUSR1 on every rank, then run again: it resumes
// from the checkpoint of the step it stopped at and ends bit-identical to
// the same job never interrupted.
TEST_F(LibraryTest, AGanStoppedBySigusr1ResumesToTheStateOfAnUninterruptedRun) {
  if (!HasFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  StopAndRestartEndAsTheUninterruptedRun(
      [this](const std::string& node, const std::string& summary,
             const std::vector<std::string>& more) { return GanAgent(node, summary, more); },
      {"--steps", "120", "--checkpoint-every", "20"}, /*stop_after=*/30);
}

// The same with both optimizers' state sharded: each rank writes the part
// it owns into the checkpoint to stop (a file a rank), and the restart
// puts the parts together and ends as the sharded run never interrupted.
TEST_F(LibraryTest, AShardedGanStoppedBySigusr1WritesItsPartsAndResumesAsUninterrupted) {
  if (!HasFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  StopAndRestartEndAsTheUninterruptedRun(
      [this](const std::string& node, const std::string& summary,
             const std::vector<std::string>& more) { return GanAgent(node, summary, more); },
      {"--steps", "120", "--checkpoint-every", "20", "--shard-optimizer", "1"},
      /*stop_after=*/30, [this] {
        const std::string log = ReadText(dir_ + "/a1.log");
        std::smatch m;
        ASSERT_TRUE(std::regex_search(
            log, m, std::regex("stopping at step ([0-9]+) after checkpointing")))
            << log;
        const std::string step_dir = absl::StrCat(dir_, "/ckpt/step-", m[1].str());
        for (int r = 0; r < 4; ++r) {
          EXPECT_TRUE(std::filesystem::exists(
              absl::StrCat(step_dir, "/optimizer-shard-", r, "-of-4.safetensors")))
              << step_dir << ", shard " << r;
        }
        EXPECT_FALSE(std::filesystem::exists(step_dir + "/optimizer.safetensors")) << step_dir;
      });
}

// Every program under examples/, as a user wrote it, run as 2 agents x 2
// trainers: each ends with the same state digest on all four ranks. gan
// calls backward twice in its discriminator's pass and keeps a graph through
// the generator's BatchNorm from one pass to the next; multitask calls
// backward once per loss term; distill carries a frozen teacher in eval
// mode; finetune unfreezes its backbone mid-run; tabular has BatchNorm and
// LibTorch's data loader.
struct ExampleRun {
  std::string program;
  std::vector<std::string> args;
  bool fashion_mnist = false;  // reads Debian's dataset-fashion-mnist
};

std::vector<std::string> ExampleArgs(const std::string& dir, const ExampleRun& run,
                                     const std::string& summary) {
  std::vector<std::string> args = {kBin + "/" + run.program};
  args.insert(args.end(), run.args.begin(), run.args.end());
  args.insert(args.end(), {"--summary", dir + "/" + summary + "/{pid}.json"});
  return args;
}

class ExamplesTest : public LibraryTest, public ::testing::WithParamInterface<ExampleRun> {};

TEST_P(ExamplesTest, RunsAsTwoNodesOfTwoWithTheSameStateOnEveryRank) {
  if (GetParam().fashion_mnist && !HasFashionMnist()) {
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  }
  StartCoordinator(/*min_members=*/4, /*max_members=*/4, "state");
  const pid_t a = AgentOf("a", ExampleArgs(dir_, GetParam(), "summary"));
  const pid_t b = AgentOf("b", ExampleArgs(dir_, GetParam(), "summary"));
  EXPECT_EQ(WaitExit(a), 0) << ReadText(dir_ + "/a.log");
  EXPECT_EQ(WaitExit(b), 0) << ReadText(dir_ + "/b.log");
  const std::string logs = ReadText(dir_ + "/a.log") + ReadText(dir_ + "/b.log");
  EXPECT_EQ(logs.find("(restart "), std::string::npos) << "a trainer was restarted: " << logs;
  CommonFinalDigest("summary", 4);
}

INSTANTIATE_TEST_SUITE_P(
    Examples, ExamplesTest,
    ::testing::Values(
        ExampleRun{"gan", {"--examples", "2000", "--batch", "16", "--steps", "40"}, true},
        ExampleRun{"multitask", {"--steps", "60"}},
        ExampleRun{"distill", {"--steps", "60"}},
        ExampleRun{"finetune", {"--steps", "60", "--unfreeze-at", "20"}},
        ExampleRun{"tabular", {"--steps", "60"}},
        ExampleRun{"char_lm", {"--steps", "30", "--batch", "4"}},
        ExampleRun{"lm", {"--steps", "30", "--eval-every", "10"}},
        ExampleRun{"fashion_mnist", {"--steps", "20"}, true}),
    [](const auto& info) { return info.param.program; });

// examples/lm evaluates on rank 0 alone every 10 steps, as nanoGPT-style
// programs do; here each evaluation is 600 passes over the held-out
// windows (seconds of computing), against a collective deadline of 1 s.
// The other ranks wait for rank 0 in the next step's reduction past their
// deadline; its training thread runs meanwhile, so the coordinator waits
// for it instead of fencing it as hung. No trainer is restarted and the
// job ends bit-identical to the same job with a short evaluation. Before
// the coordinator told work from a stuck thread, rank 0 was fenced and
// restarted at each evaluation, and its shares of those steps were lost.
TEST_F(LibraryTest, AnEvaluationOnRankZeroLongerThanThePeersDeadlineFencesNobody) {
  const std::vector<std::string> run = {"--steps", "30", "--eval-every", "10"};
  StartCoordinator(4, 4, "reference");
  const auto job = [&](const std::string& tag, const std::vector<std::string>& more) {
    std::vector<std::string> args = {kBin + "/lm"};
    args.insert(args.end(), run.begin(), run.end());
    args.insert(args.end(), more.begin(), more.end());
    args.insert(args.end(), {"--summary", dir_ + "/" + tag + "/{pid}.json"});
    const pid_t a = AgentOf("a", args), b = AgentOf("b", args);
    EXPECT_EQ(WaitExit(a), 0) << ReadText(dir_ + "/a.log");
    EXPECT_EQ(WaitExit(b), 0) << ReadText(dir_ + "/b.log");
    const std::string logs = ReadText(dir_ + "/a.log") + ReadText(dir_ + "/b.log");
    EXPECT_EQ(logs.find("(restart "), std::string::npos) << "a trainer was restarted: " << logs;
    return CommonFinalDigest(tag, 4);
  };
  const std::string reference = job("summary-reference", {});
  StopCoordinator();
  StartCoordinator(4, 4, "state");
  EXPECT_EQ(job("summary", {"--eval-iters", "600", "--collective-timeout", "1"}), reference);
  const std::string coordinator = ReadText(dir_ + "/coordinator-state.log");
  EXPECT_NE(coordinator.find("is in the program's own work"), std::string::npos) << coordinator;
  EXPECT_EQ(coordinator.find("hung"), std::string::npos) << coordinator;
}

// examples/lm stops early (--patience 2): with a learning rate of 0 its
// held-out loss never falls, so after the evaluations of steps 5, 10 and
// 15 rank 0 asks the job to finish, and all four ranks end after step 16
// with exit 0 and one digest; the coordinator marks the job finished.
// Their agents, which restart a trainer only after a failure, end too.
TEST_F(LibraryTest, AnLmThatStopsEarlyEndsEveryRankAfterTheSameStepAsFinished) {
  StartCoordinator(4, 4, "state");
  const std::vector<std::string> args = {kBin + "/lm",
                                         "--steps",
                                         "60",
                                         "--eval-every",
                                         "5",
                                         "--patience",
                                         "2",
                                         "--lr",
                                         "0",
                                         "--summary",
                                         dir_ + "/summary/{pid}.json"};
  const pid_t a = AgentOf("a", args), b = AgentOf("b", args);
  EXPECT_EQ(WaitExit(a), 0) << ReadText(dir_ + "/a.log");
  EXPECT_EQ(WaitExit(b), 0) << ReadText(dir_ + "/b.log");
  const std::string logs = ReadText(dir_ + "/a.log") + ReadText(dir_ + "/b.log");
  EXPECT_EQ(logs.find("(restart "), std::string::npos) << "a trainer was restarted: " << logs;
  EXPECT_NE(logs.find("muster: finished at step 16, as the program asked"), std::string::npos)
      << logs;
  const auto by_step = Summaries("summary");
  ASSERT_EQ(by_step.size(), 1u) << "the ranks ended after different steps";
  EXPECT_EQ(by_step.begin()->first, 16);
  CommonFinalDigest("summary", 4);
  const std::string coordinator = ReadText(dir_ + "/coordinator-state.log");
  EXPECT_NE(coordinator.find("finished at step 16"), std::string::npos) << coordinator;
}

// gan, multitask (both tasks a step, or one task a step: the other head
// keeps no gradient), distill and finetune, 2 x 2, against the same job in one process
// that takes each global batch at once (batch 64 = 4 x 16): the same
// parameters within float rounding (the sums run in another order). gan's
// one process splits its batch into parts of 16 (--ghost-batch), each with
// its own forwards and backward calls, as BatchNorm in a world of four sees
// them; it compares after 10 steps, as a GAN trained with Adam turns
// rounding differences into steps of a whole learning rate once gradients
// near zero change sign (here: 3.4e-6 apart at steps 1 to 10, 4.7e-4 at
// step 20, 2.3e-3 at step 40; with Debian's LibTorch 1.13, whose kernels
// round differently, 1.1e-5 at step 10, so the GAN is allowed a quarter
// of one Adam step at its learning rate of 2e-4). Before a pass averaged
// the sum of its backward calls, multitask's ranks reduced only a part of
// it and ended 0.03 away from one process.
struct OneProcessRun {
  std::string program;
  std::vector<std::string> args;          // both runs
  std::vector<std::string> one_process;   // the one process's own
  bool fashion_mnist = false;
  double tolerance = 1e-5;                // largest difference of a parameter
  bool relative = false;  // tolerance times the largest parameter magnitude
};

class OneProcessTest : public LibraryTest, public ::testing::WithParamInterface<OneProcessRun> {
 protected:
  std::vector<double> ReadValues(const std::string& path) {
    std::vector<double> out;
    std::istringstream in(ReadText(path));
    for (double v; in >> v;) out.push_back(v);
    return out;
  }
};

TEST_P(OneProcessTest, TwoNodesOfTwoEndAsOneProcessOnTheGlobalBatch) {
  const OneProcessRun& run = GetParam();
  if (run.fashion_mnist && !HasFashionMnist()) {
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  }
  const std::string program = kBin + "/" + run.program;
  StartCoordinator(/*min_members=*/4, /*max_members=*/4, "world4");
  std::vector<std::string> four_args = {program, "--batch", "16", "--summary",
                                        dir_ + "/summary/{pid}.json", "--parameters",
                                        dir_ + "/world4.txt"};
  four_args.insert(four_args.end(), run.args.begin(), run.args.end());
  const pid_t a = AgentOf("a", four_args), b = AgentOf("b", four_args);
  ASSERT_EQ(WaitExit(a), 0) << ReadText(dir_ + "/a.log");
  ASSERT_EQ(WaitExit(b), 0) << ReadText(dir_ + "/b.log");
  CommonFinalDigest("summary", 4);
  StopCoordinator();

  StartCoordinator(/*min_members=*/1, /*max_members=*/1, "world1");
  setenv("MUSTER_COORDINATOR", target_.c_str(), 1);
  std::vector<std::string> one_args = {program, "--batch", "64", "--parameters",
                                       dir_ + "/world1.txt"};
  one_args.insert(one_args.end(), run.args.begin(), run.args.end());
  one_args.insert(one_args.end(), run.one_process.begin(), run.one_process.end());
  const pid_t one = SpawnLogged(one_args, dir_ + "/one.log");
  ASSERT_EQ(WaitExit(one), 0) << ReadText(dir_ + "/one.log");
  const std::vector<double> four = ReadValues(dir_ + "/world4.txt");
  const std::vector<double> single = ReadValues(dir_ + "/world1.txt");
  ASSERT_EQ(four.size(), single.size());
  ASSERT_GT(four.size(), 100u);
  double worst = 0, largest = 0;
  for (size_t i = 0; i < four.size(); ++i) {
    worst = std::max(worst, std::abs(four[i] - single[i]));
    largest = std::max(largest, std::abs(single[i]));
  }
  const double tolerance = run.relative ? run.tolerance * largest : run.tolerance;
  // One line for docs/benchmarks.md's tables (deploy/bench_table.py).
  std::cout << "one_process test="
            << ::testing::UnitTest::GetInstance()->current_test_info()->name()
            << " max_abs_diff=" << worst << " largest_magnitude=" << largest
            << " tolerance=" << tolerance << std::endl;
  EXPECT_LT(worst, tolerance) << "parameters of 2 x 2 and of one process differ by up to "
                              << worst << " (largest magnitude " << largest << ")";
}

INSTANTIATE_TEST_SUITE_P(
    Programs, OneProcessTest,
    ::testing::Values(
        OneProcessRun{"gan", {"--examples", "2000", "--steps", "10"}, {"--ghost-batch", "16"}, true,
                      /*tolerance=*/5e-5},
        // SyncBatchNorm: the world's statistics are the global batch's, so
        // the one process takes its batch whole (noise drawn per example).
        // Its statistics round otherwise than LibTorch's kernel, and the
        // weights of pixels that are background in every image have a
        // gradient of rounding alone (BatchNorm takes out the mean), which
        // Adam's first steps turn into up to a third of a step (6.0e-5 at
        // steps 2 and 10): one step at the learning rate is allowed. Four
        // ranks of plain BatchNorm end 3.8e-3 away.
        OneProcessRun{"gan", {"--examples", "2000", "--steps", "10", "--sync-bn", "1"}, {}, true,
                      /*tolerance=*/2e-4},
        OneProcessRun{"multitask", {"--steps", "60"}, {}},
        OneProcessRun{"multitask", {"--steps", "60", "--tasks", "alternate"}, {}},
        OneProcessRun{"distill", {"--steps", "60"}, {}},
        OneProcessRun{"finetune", {"--steps", "60", "--unfreeze-at", "20"}, {}},
        // Tied weights, two micro-batches, its own clipping and schedule,
        // 30 AdamW steps; dropout 0, so both runs draw nothing.
        OneProcessRun{"lm", {"--steps", "30", "--dropout", "0"}, {}, false, /*tolerance=*/1e-4,
                      /*relative=*/true}),
    [](const auto& info) {  // the program, and its --tasks where given
      std::string name = info.param.program;
      const std::vector<std::string>& args = info.param.args;
      for (size_t i = 0; i + 1 < args.size(); ++i) {
        if (args[i] == "--tasks") name += "_" + args[i + 1];
        if (args[i] == "--sync-bn") name += "_sync_bn";
      }
      return name;
    });

// multitask, distill, finetune and lm through a SIGKILL of one trainer (its
// replacement takes the live state), and through a stop by SIGUSR1 and a
// restart that must end as the uninterrupted run (finetune unfreezes its
// backbone at step 150 of 300, and at 75 of 150: after the kill, and
// after the restart; lm draws its dropout masks from the step and the
// examples, so the restart draws what the uninterrupted run drew).
class ExampleFaultsTest : public LibraryTest, public ::testing::WithParamInterface<std::string> {
 protected:
  pid_t Run(const std::string& node, const std::string& summary,
            const std::vector<std::string>& more) {
    std::vector<std::string> args = {kBin + "/" + GetParam(), "--pace-ms", "10", "--summary",
                                     dir_ + "/" + summary + "/{pid}.json"};
    args.insert(args.end(), more.begin(), more.end());
    return AgentOf(node, args);
  }
};

TEST_P(ExampleFaultsTest, AKilledTrainerIsReplacedAndEveryRankEndsBitIdentical) {
  StartCoordinator(/*min_members=*/2, /*max_members=*/4, "state");
  const std::vector<std::string> run = {"--steps", "300"};
  KillTrainer1OfBAndFinish(Run("a", "summary", run), Run("b", "summary", run), /*at_step=*/40);
  CommonFinalDigest("summary", 4);
}

TEST_P(ExampleFaultsTest, Sigusr1CheckpointsAndTheRestartEndsAsAnUninterruptedRun) {
  StopAndRestartEndAsTheUninterruptedRun(
      [this](const std::string& node, const std::string& summary,
             const std::vector<std::string>& more) { return Run(node, summary, more); },
      {"--steps", "150", "--checkpoint-every", "20"}, /*stop_after=*/30);
}

INSTANTIATE_TEST_SUITE_P(Programs, ExampleFaultsTest,
                         ::testing::Values("multitask", "distill", "finetune", "lm"),
                         [](const auto& info) { return info.param; });

// examples/finetune lowers its learning rate tenfold itself after step 20
// (its unfreezing), with no Options::lr_schedule: the rate is training
// state. A trainer SIGKILLed at step 40 is replaced by one that takes the
// lowered rate with the live state, and a run stopped by SIGUSR1 at step
// 30 resumes at it from the checkpoint; both end as one run does.
class ProgramRateTest : public LibraryTest {
 protected:
  pid_t Finetune(const std::string& node, const std::string& summary,
                 const std::vector<std::string>& more) {
    std::vector<std::string> args = {kBin + "/finetune",
                                     "--pace-ms",
                                     "10",
                                     "--unfreeze-at",
                                     "20",
                                     "--summary",
                                     dir_ + "/" + summary + "/{pid}.json"};
    args.insert(args.end(), more.begin(), more.end());
    return AgentOf(node, args);
  }
};

TEST_F(ProgramRateTest, AReplacementTakesTheRateTheProgramLowered) {
  StartCoordinator(/*min_members=*/2, /*max_members=*/4, "state");
  const std::vector<std::string> run = {"--steps", "200"};
  KillTrainer1OfBAndFinish(Finetune("a", "summary", run), Finetune("b", "summary", run),
                           /*at_step=*/40);
  CommonFinalDigest("summary", 4);
}

TEST_F(ProgramRateTest, ARunStoppedAfterTheProgramLoweredItsRateResumesAtIt) {
  StopAndRestartEndAsTheUninterruptedRun(
      [this](const std::string& node, const std::string& summary,
             const std::vector<std::string>& more) { return Finetune(node, summary, more); },
      {"--steps", "100", "--checkpoint-every", "20"}, /*stop_after=*/30);
}

// examples/lm.cc in bf16 autocast with muster::GradScaler growing its scale
// every 2 steps, so that it overflows float32 and backs off again and
// again: a trainer SIGKILLed at step 40 is replaced and takes the scaler's
// state with the rest, and the four ranks end with one digest, one scale
// and the same steps skipped (some).
TEST_F(LibraryTest, ALossScaledLmSkipsTheSameStepsOnEveryRankThroughAKill) {
  StartCoordinator(/*min_members=*/2, /*max_members=*/4, "state");
  const std::vector<std::string> run = {
      kBin + "/lm", "--steps", "300", "--pace-ms", "10", "--amp", "bf16", "--loss-scale",
      "dynamic", "--loss-scale-growth", "2", "--summary", dir_ + "/summary/{pid}.json"};
  KillTrainer1OfBAndFinish(AgentOf("a", run), AgentOf("b", run), /*at_step=*/40);
  CommonFinalDigest("summary", 4);
  std::set<std::string> scales, skipped;
  for (const std::string& f : ListFiles(dir_ + "/summary")) {
    const std::string json = ReadText(f);
    if (JsonNumber(json, "steps") != "300") continue;
    scales.insert(JsonNumber(json, "loss_scale"));
    skipped.insert(JsonNumber(json, "skipped_steps"));
  }
  EXPECT_EQ(scales.size(), 1u) << absl::StrJoin(scales, ", ");
  ASSERT_EQ(skipped.size(), 1u) << absl::StrJoin(skipped, ", ");
  EXPECT_GT(std::stoi(*skipped.begin()), 0) << "the scale never overflowed";
}

// examples/images.cc loads through muster::DataLoader with 4 workers
// (each example costs CPU time to load), 2 agents x 2, 2 epochs; rank 3
// SIGKILLs itself inside step 20, after its backward, while its loader
// fetches step 21 ahead. Its share is salvaged away and returned; counted
// over every process's record (written after each step that counted, the
// index read from each example the loader delivered), every example of
// both epochs was trained on exactly once. The four ranks end with one
// digest, their steps found examples fetched ahead, and the world changes
// (3, then 4 again) dropped some fetched for shares that moved.
TEST_F(LibraryTest, ALoaderWithWorkersSeesEveryExampleOncePerEpochThroughAKill) {
  StartCoordinator(/*min_members=*/2, /*max_members=*/4, "state");
  const std::vector<std::string> run = {
      kBin + "/images", "--workers", "4", "--decode-us", "200", "--epochs", "2", "--batch", "8",
      "--pace-ms", "5", "--kill-rank", "3", "--kill-at-step", "20", "--record", dir_ + "/record",
      "--summary", dir_ + "/summary/{pid}.json"};
  const pid_t a = AgentOf("a", run), b = AgentOf("b", run);
  EXPECT_EQ(WaitExit(a), 0) << ReadText(dir_ + "/a.log");
  EXPECT_EQ(WaitExit(b), 0) << ReadText(dir_ + "/b.log");
  const std::string logs = ReadText(dir_ + "/a.log") + ReadText(dir_ + "/b.log");
  EXPECT_NE(logs.find("started (restart 1)"), std::string::npos) << logs;
  EXPECT_NE(logs.find("salvaged"), std::string::npos) << logs;
  ExpectEveryExampleOncePerEpoch("record", /*epochs=*/2, /*at_least=*/2048);
  CommonFinalDigest("summary", 4);
  int64_t dropped = 0;
  for (const std::string& f : ListFiles(dir_ + "/summary")) {
    const std::string json = ReadText(f);
    EXPECT_GT(std::stoll(JsonNumber(json, "fetched_ahead")), 0) << f;
    dropped += std::stoll(JsonNumber(json, "dropped_ahead"));
  }
  EXPECT_GT(dropped, 0) << "no world change moved a share fetched ahead";
}

// member id -> state, from `muster status --json`.
std::map<std::string, std::string> MemberStates(const std::string& target) {
  int code = -1;
  const std::string json =
      RunShell(kBin + "/muster --coordinator=" + target + " status --json", &code);
  std::map<std::string, std::string> out;
  for (const StatusMember& m : StatusMembers(json)) out[m.id] = m.state;
  return out;
}

// Hot spares: node a keeps one spare trainer. A trainer of the world is
// SIGKILLed: the spare takes its place in the very next generation (the
// world never shrinks), and the killed trainer's restart is the new spare.
TEST_F(LibraryTest, ASpareTakesTheKilledTrainersPlaceAndItsRestartIsTheNextSpare) {
  StartCoordinator(/*min_members=*/3, /*max_members=*/4, "state");
  const std::vector<std::string> run = {"--epochs", "14"};
  const pid_t a = Agent("a", "summary", run, /*spares=*/"1"), b = Agent("b", "summary", run);
  ASSERT_TRUE(WaitForStep("a.log", 20, absl::Seconds(60))) << ReadText(dir_ + "/a.log");
  std::map<std::string, std::string> states = MemberStates(target_);
  std::string spare, victim;
  for (const auto& [id, state] : states) {
    if (state == "spare") spare = id;
    if (state == "active" && id != "a/0") victim = id;
  }
  ASSERT_FALSE(spare.empty()) << "no spare among " << states.size() << " members";
  ASSERT_FALSE(victim.empty());
  const std::string node = victim.substr(0, victim.find('/'));
  const pid_t pid = LastTrainerPid(dir_ + "/" + node + ".log", std::stoi(victim.substr(2)));
  ASSERT_GT(pid, 0);
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  // The pool is refilled: the restarted trainer waits as the spare.
  const absl::Time end = absl::Now() + absl::Seconds(30);
  while (absl::Now() < end && MemberStates(target_)[victim] != "spare") {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(MemberStates(target_)[victim], "spare");
  EXPECT_EQ(MemberStates(target_)[spare], "active");
  EXPECT_EQ(WaitExit(a), 0) << ReadText(dir_ + "/a.log");
  EXPECT_EQ(WaitExit(b), 0) << ReadText(dir_ + "/b.log");
  const std::string logs = ReadText(dir_ + "/a.log") + ReadText(dir_ + "/b.log");
  EXPECT_EQ(logs.find("(world 3,"), std::string::npos) << "the world shrank: " << logs;
  EXPECT_NE(logs.find("salvaged"), std::string::npos) << logs;
  EXPECT_NE(logs.find("no world for this trainer: the job has finished"), std::string::npos);
  // The spare took the full state: four ranks end bit-identical.
  CommonFinalDigest("summary", 4);
}

// A hot spare that the job ends without leaves with exit 0, though the
// checkpoint directory it found empty at its start holds the job's
// checkpoints by then: it entered no world and writes over nothing.
TEST_F(LibraryTest, ASpareTheJobNeverNeededLeavesThoughCheckpointsCameMeanwhile) {
  StartCoordinator(/*min_members=*/2, /*max_members=*/2, "state");
  const pid_t a =
      Agent("a", "summary",
            {"--epochs", "2", "--checkpoint-dir", dir_ + "/ckpt", "--checkpoint-every", "10"},
            /*spares=*/"1");
  EXPECT_EQ(WaitExit(a), 0) << ReadText(dir_ + "/a.log");
  const std::string log = ReadText(dir_ + "/a.log");
  EXPECT_NE(log.find("no world for this trainer: the job has finished"), std::string::npos) << log;
  EXPECT_EQ(log.find("INVALID_ARGUMENT"), std::string::npos) << log;
  EXPECT_EQ(::access((dir_ + "/ckpt/step-10/manifest.json").c_str(), F_OK), 0);
}

// Agent-less trainers: three start, one leaves on SIGTERM, two join.
TEST_F(LibraryTest, EveryExampleIsSeenOncePerEpochThroughWorldsOfThreeTwoAndFour) {
  StartCoordinator(/*min_members=*/2, /*max_members=*/4, "state");
  const int epochs = 20;
  setenv("MUSTER_COORDINATOR", target_.c_str(), 1);
  auto trainer = [&](int local, const std::string& tag) {
    (void)local;
    return SpawnLogged(LmArgs("summary", {"--epochs", std::to_string(epochs)}),
                       dir_ + "/" + tag + ".log");
  };
  // The identity goes through the environment, the way muster-agent passes it.
  setenv("MUSTER_NODE_ID", "n", 1);
  std::vector<pid_t> first;
  for (int i = 0; i < 3; ++i) {
    setenv("MUSTER_LOCAL_RANK", std::to_string(i).c_str(), 1);
    first.push_back(trainer(i, "t" + std::to_string(i)));
  }
  ASSERT_TRUE(WaitForLine("t0.log", "world 3 on 1 nodes", absl::Seconds(60)))
      << ReadText(dir_ + "/t0.log");
  ASSERT_TRUE(WaitForStep("t0.log", 20, absl::Seconds(60))) << ReadText(dir_ + "/t0.log");
  ::kill(first[2], SIGTERM);  // leaves at the next step boundary
  EXPECT_EQ(WaitExit(first[2]), 0) << ReadText(dir_ + "/t2.log");
  ASSERT_TRUE(WaitForLine("t0.log", "world 2 on 1 nodes", absl::Seconds(30)))
      << ReadText(dir_ + "/t0.log");
  std::vector<pid_t> joined;
  for (int i = 2; i < 4; ++i) {
    setenv("MUSTER_LOCAL_RANK", std::to_string(i).c_str(), 1);
    joined.push_back(trainer(i, "j" + std::to_string(i)));
  }
  unsetenv("MUSTER_NODE_ID");
  unsetenv("MUSTER_LOCAL_RANK");
  for (pid_t p : {first[0], first[1], joined[0], joined[1]}) EXPECT_EQ(WaitExit(p), 0);
  EXPECT_NE(ReadText(dir_ + "/t0.log").find("world 4 on 1 nodes"), std::string::npos)
      << ReadText(dir_ + "/t0.log");
  ExpectEveryExampleOncePerEpoch("record", epochs, /*at_least=*/100);
  // The four that finished left at the same step with the same state.
  CommonFinalDigest("summary", 4);
}

// Step salvage. Four members, each its own node, train salvage_member (an
// MLP with Adam, in several gradient buckets). In the drill, the last rank
// SIGKILLs itself inside step 7; the reference is the same job whose last
// rank leaves after step 6, so that step 7 is taken by a world of 3 on the
// same examples. The survivors must end bit-identical to the reference.
class SalvageTest : public LibraryTest, public ::testing::WithParamInterface<int> {
 protected:
  static constexpr int kEpochs = 2;
  // Runs the job; `last` are the extra flags of the fourth member. Returns
  // the survivors' summaries (JSON).
  std::vector<std::string> RunJob(const std::string& tag, const std::vector<std::string>& last,
                                  const std::vector<std::string>& common) {
    StartCoordinator(/*min_members=*/3, /*max_members=*/4, tag, /*last_call=*/"10s");
    setenv("MUSTER_COORDINATOR", target_.c_str(), 1);
    std::system(("mkdir -p " + dir_ + "/" + tag + "-summary " + dir_ + "/" + tag + "-record").c_str());
    std::vector<pid_t> pids;
    for (int i = 0; i < 4; ++i) {
      std::vector<std::string> argv = {kBin + "/salvage_member", "--node-id", absl::StrCat("n", i),
                                       "--epochs", std::to_string(kEpochs), "--record",
                                       dir_ + "/" + tag + "-record", "--summary",
                                       dir_ + "/" + tag + "-summary/{pid}.json"};
      argv.insert(argv.end(), common.begin(), common.end());
      if (i == 3) argv.insert(argv.end(), last.begin(), last.end());
      pids.push_back(SpawnLogged(hosts_->OnNode(absl::StrCat("n", i), argv),
                                 absl::StrCat(dir_, "/", tag, "-n", i, ".log")));
    }
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(WaitExit(pids[i]), 0) << ReadText(absl::StrCat(dir_, "/", tag, "-n", i, ".log"));
    }
    last_exit_ = WaitExit(pids[3]);
    StopCoordinator();
    std::vector<std::string> out;
    for (const std::string& f : ListFiles(dir_ + "/" + tag + "-summary")) {
      const std::string json = ReadText(f);
      if (JsonNumber(json, "world_size") == "3") out.push_back(json);
    }
    EXPECT_EQ(out.size(), 3u) << tag << ": survivors that ended in a world of 3";
    return out;
  }
  int last_exit_ = 0;
};

TEST_P(SalvageTest, ASalvagedStepEndsBitIdenticalToTheStepTakenWithoutTheDeadRank) {
  const std::vector<std::string> common = {"--accumulate", std::to_string(GetParam())};
  const std::vector<std::string> reference =
      RunJob("reference", {"--leave-after-step", "6"}, common);
  const std::vector<std::string> salvaged = RunJob("salvaged", {"--die-at-step", "7"}, common);
  EXPECT_EQ(last_exit_, 128 + SIGKILL);
  ASSERT_EQ(reference.size(), 3u);
  ASSERT_EQ(salvaged.size(), 3u);
  const std::string digest = JsonString(reference[0], "digest");
  for (const std::string& json : reference) EXPECT_EQ(JsonString(json, "digest"), digest) << json;
  for (const std::string& json : salvaged) {
    EXPECT_EQ(JsonNumber(json, "dropped"), "0") << "no step was lost: " << json;
    EXPECT_EQ(JsonNumber(json, "steps"), JsonNumber(reference[0], "steps")) << json;
    EXPECT_EQ(JsonString(json, "digest"), digest) << "salvaged state differs: " << json;
  }
  const std::string log = ReadText(dir_ + "/salvaged-n0.log");
  EXPECT_NE(log.find("step 7 salvaged"), std::string::npos) << log;
  EXPECT_NE(log.find("3 of 4 shares reduced, 1 returned to the sampler"), std::string::npos) << log;
  // The dead rank's examples of step 7 were trained on later in the epoch.
  ExpectEveryExampleOncePerEpoch("salvaged-record", kEpochs, /*at_least=*/200);
}

// A rank whose state drifts (one weight of n2 moved by 1e-6 after step 10,
// as a bit flip or a bug would) is caught before the checkpoint of step 10
// commits: every rank stops with DATA_LOSS (exit 65), naming the rank and
// the first tensor that differs, and the newest committed checkpoint stays
// the one of step 5.
TEST_F(LibraryTest, ARankWhoseStateDriftsIsCaughtBeforeItsCheckpointCommits) {
  StartCoordinator(/*min_members=*/3, /*max_members=*/3, "state");
  setenv("MUSTER_COORDINATOR", target_.c_str(), 1);
  std::vector<pid_t> pids;
  for (int i = 0; i < 3; ++i) {
    std::vector<std::string> argv = {kBin + "/salvage_member", "--node-id", absl::StrCat("n", i),
                                     "--steps", "30", "--checkpoint-dir", dir_ + "/ckpt",
                                     "--checkpoint-every", "5", "--check-state-every", "0"};
    if (i == 2) argv.insert(argv.end(), {"--corrupt-at-step", "10"});
    pids.push_back(SpawnLogged(hosts_->OnNode(absl::StrCat("n", i), argv),
                               absl::StrCat(dir_, "/n", i, ".log")));
  }
  std::string logs;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(WaitExit(pids[i]), 65) << ReadText(absl::StrCat(dir_, "/n", i, ".log"));
    logs += ReadText(absl::StrCat(dir_, "/n", i, ".log"));
  }
  EXPECT_NE(logs.find("state check at step 10 (before a checkpoint): the ranks disagree: rank "),
            std::string::npos)
      << logs;
  EXPECT_NE(logs.find(" of 3 holds another state than ranks "), std::string::npos) << logs;
  EXPECT_NE(logs.find("first difference: model param.0.weight"), std::string::npos) << logs;
  int code = -1;
  const std::string catalog =
      RunShell(kBin + "/muster --coordinator=" + target_ + " checkpoints --json", &code);
  ASSERT_EQ(code, 0) << catalog;
  std::set<int> steps;
  const std::regex step_field(R"re("step": "?([0-9]+)"?)re");
  for (std::sregex_iterator it(catalog.begin(), catalog.end(), step_field), end; it != end; ++it) {
    steps.insert(std::stoi((*it)[1]));
  }
  EXPECT_EQ(steps, (std::set<int>{5})) << catalog;
}

// Sharded optimizer state takes no change of what requires grad (its
// layout holds the trained parameters of when it was made): finetune with
// --shard-optimizer ends at its unfreezing with a clear INVALID_ARGUMENT
// (exit 78) rather than train on with a layout that no longer fits.
TEST_F(LibraryTest, UnfreezingWithShardedStateIsRefusedWithTheReason) {
  StartCoordinator(/*min_members=*/2, /*max_members=*/2, "state");
  const pid_t a = AgentOf("a", {kBin + "/finetune", "--steps", "30", "--unfreeze-at", "10",
                                "--shard-optimizer", "1"});
  EXPECT_NE(WaitExit(a), 0) << ReadText(dir_ + "/a.log");
  const std::string log = ReadText(dir_ + "/a.log");
  // Both trainers, and neither restarted: a misconfiguration (exit 78).
  size_t refusals = 0;
  const std::string why =
      "the parameters that require grad changed (2 -> 6 tensors) while the optimizer state is "
      "sharded";
  for (size_t at = log.find(why); at != std::string::npos; at = log.find(why, at + 1)) ++refusals;
  EXPECT_EQ(refusals, 2u) << log;
  EXPECT_EQ(log.find("(restart "), std::string::npos) << log;
}

// A drift in one rank's optimizer state, which no parameter shows yet, is
// caught by the periodic state check (every 5 steps, no checkpoint):
// unsharded, as the first optimizer tensor that differs; with sharded
// state, as the two copies of that rank's part (its own and its buddy's),
// compared where they are kept. Every rank stops with DATA_LOSS (65).
TEST_F(LibraryTest, ADriftInOneRanksOptimizerStateIsCaughtShardedOrNot) {
  for (const bool sharded : {false, true}) {
    StopCoordinator();  // the first run's job is over
    StartCoordinator(/*min_members=*/3, /*max_members=*/3, sharded ? "drift-s" : "drift-u");
    setenv("MUSTER_COORDINATOR", target_.c_str(), 1);
    std::vector<pid_t> pids;
    const std::string tag = sharded ? "s" : "u";
    for (int i = 0; i < 3; ++i) {
      std::vector<std::string> argv = {kBin + "/salvage_member", "--node-id", absl::StrCat("n", i),
                                       "--steps", "30", "--check-state-every", "5",
                                       "--shard-optimizer", sharded ? "1" : "0"};
      if (i == 2) argv.insert(argv.end(), {"--corrupt-state-at-step", "10"});
      pids.push_back(SpawnLogged(hosts_->OnNode(absl::StrCat("n", i), argv),
                                 absl::StrCat(dir_, "/", tag, i, ".log")));
    }
    std::string logs;
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(WaitExit(pids[i]), 65) << ReadText(absl::StrCat(dir_, "/", tag, i, ".log"));
      logs += ReadText(absl::StrCat(dir_, "/", tag, i, ".log"));
    }
    EXPECT_NE(logs.find("state check at step 10 (every 5 steps): "), std::string::npos) << logs;
    EXPECT_NE(logs.find(sharded ? "the two copies of optimizer shard "
                                : "first difference: optimizer 0.weight.exp_avg"),
              std::string::npos)
        << logs;
  }
}

INSTANTIATE_TEST_SUITE_P(Accumulate, SalvageTest, ::testing::Values(1, 2),
                         [](const auto& info) { return absl::StrCat("micro_batches_", info.param); });

TEST_F(SalvageTest, WithSalvageOffTheStepIsDroppedAndItsExamplesComeAgain) {
  const std::vector<std::string> dropped =
      RunJob("dropped", {"--die-at-step", "7"}, {"--salvage", "0"});
  for (const std::string& json : dropped) EXPECT_EQ(JsonNumber(json, "dropped"), "1") << json;
  const std::string log = ReadText(dir_ + "/dropped-n0.log");
  EXPECT_EQ(log.find("salvaged"), std::string::npos) << log;
  ExpectEveryExampleOncePerEpoch("dropped-record", kEpochs, /*at_least=*/200);
}

// A hot spare takes the place of a rank SIGKILLed inside a step of a job
// whose optimizer state is sharded with two copies of each part: the three
// survivors salvage the step in a world of four with the spare, which was
// not in it. The state goes straight to the new world's shards on every
// rank, and the spare receives the parts it keeps as the step left them,
// from the survivors that stepped them; nobody makes the state whole. No
// step is lost and the four end bit-identical.
TEST_F(SalvageTest, AHotSpareMeetingASalvagedShardedStepReceivesOnlyItsParts) {
  StartCoordinator(/*min_members=*/4, /*max_members=*/4, "spare");
  setenv("MUSTER_COORDINATOR", target_.c_str(), 1);
  std::system(("mkdir -p " + dir_ + "/spare-summary").c_str());
  const std::string die = dir_ + "/die";
  auto member = [&](int node, const std::vector<std::string>& more) {
    std::vector<std::string> argv = {kBin + "/salvage_member", "--node-id", absl::StrCat("n", node),
                                     "--steps", "300", "--shard-optimizer", "1",
                                     "--check-state-every", "50", "--summary",
                                     dir_ + "/spare-summary/{pid}.json"};
    argv.insert(argv.end(), more.begin(), more.end());
    return SpawnLogged(hosts_->OnNode(absl::StrCat("n", node), argv),
                       absl::StrCat(dir_, "/spare-n", node, ".log"));
  };
  std::vector<pid_t> pids;
  for (int i = 0; i < 3; ++i) pids.push_back(member(i, {}));
  const pid_t victim = member(3, {"--die-once", die});
  const auto wait_until = [&](const std::string& member, const std::string& state) {
    const absl::Time end = absl::Now() + absl::Seconds(60);
    while (absl::Now() < end && MemberStates(target_)[member] != state) {
      absl::SleepFor(absl::Milliseconds(50));
    }
    return MemberStates(target_)[member] == state;
  };
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(wait_until(absl::StrCat("n", i, "/0"), "active"));
  const pid_t spare = member(4, {});
  ASSERT_TRUE(wait_until("n4/0", "spare")) << ReadText(dir_ + "/spare-n4.log");
  std::ofstream(die) << "now\n";
  EXPECT_EQ(WaitExit(victim), 128 + SIGKILL);
  pids.push_back(spare);
  std::vector<std::string> logs;
  for (int i : {0, 1, 2, 4}) {
    const pid_t pid = pids[static_cast<size_t>(i == 4 ? 3 : i)];
    logs.push_back(ReadText(absl::StrCat(dir_, "/spare-n", i, ".log")));
    EXPECT_EQ(WaitExit(pid), 0) << logs.back();
    logs.back() = ReadText(absl::StrCat(dir_, "/spare-n", i, ".log"));
  }
  StopCoordinator();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(logs[0], m, std::regex("step ([0-9]+) salvaged in generation")))
      << logs[0];
  EXPECT_NE(logs[0].find("3 of 4 shares reduced, 1 returned to the sampler"), std::string::npos)
      << logs[0];
  EXPECT_NE(logs[3].find("optimizer state of the salvaged step taken into this rank's shards"),
            std::string::npos)
      << logs[3];
  for (const std::string& log : logs) {
    EXPECT_NE(log.find("optimizer state moved straight to the shards of a world of 4"),
              std::string::npos)
        << log;
  }
  const std::vector<std::string> files = ListFiles(dir_ + "/spare-summary");
  ASSERT_EQ(files.size(), 4u);
  const std::string first = ReadText(files[0]);
  for (const std::string& f : files) {
    const std::string json = ReadText(f);
    EXPECT_EQ(JsonNumber(json, "world_size"), "4") << json;
    EXPECT_EQ(JsonNumber(json, "steps"), "300") << json;
    EXPECT_EQ(JsonNumber(json, "dropped"), "0") << json;
    EXPECT_EQ(JsonString(json, "digest"), JsonString(first, "digest")) << json;
  }
}

}  // namespace
}  // namespace muster
