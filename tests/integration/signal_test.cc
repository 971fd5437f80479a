// SIGUSR1 (Slurm's warning before the time limit) to one trainer: every rank
// checkpoints at the next step boundary and exits 75; `muster checkpoints
// --verify` shows the committed checkpoint; restarted trainers resume from it
// and finish.
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/integration/subprocess.h"

namespace muster {
namespace {

const std::string kBin = MUSTER_BIN_DIR;

// Swaps the paths `a` and `b` in one step (renameat2's RENAME_EXCHANGE): at
// no moment is either missing.
bool Exchange(const std::string& a, const std::string& b) {
  return ::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0;
}

// A coordinator for two trainers on `target`, its state and log in `dir`.
pid_t TwoMemberCoordinator(const std::string& dir, const std::string& target) {
  return SpawnLogged({kBin + "/muster-coordinator", "--listen=" + target, "--no-auth",
                      "--state-dir=" + dir + "/state", "--min-members=2", "--max-members=2"},
                     dir + "/coordinator.log");
}

// Two muster-train processes of node n with `flags`; logs <dir>/<tag><rank>.log.
std::vector<pid_t> TwoTrainers(const std::string& dir, const std::string& target,
                               const std::string& tag, const std::vector<std::string>& flags) {
  std::vector<pid_t> pids;
  for (int i = 0; i < 2; ++i) {
    std::vector<std::string> argv = {kBin + "/muster-train", "--coordinator=" + target,
                                     "--node-id=n", absl::StrCat("--local-rank=", i),
                                     "--log-every=10", "--threads=1",
                                     "--checkpoint-dir=" + dir + "/ckpt"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    pids.push_back(SpawnLogged(argv, absl::StrCat(dir, "/", tag, i, ".log")));
  }
  return pids;
}

TEST(SignalTest, Sigusr1CheckpointsStopsAndTheNextStartResumes) {
  if (::access("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", R_OK) != 0) {
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  }
  const std::string dir = ::testing::TempDir() + "/signal" + std::to_string(::getpid());
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  const std::string target = absl::StrCat("127.0.0.1:", FreeLoopbackPort());
  KillOnExit left;
  const pid_t coordinator = left.Add(TwoMemberCoordinator(dir, target));
  auto trainers = [&](const std::string& tag) {
    return TwoTrainers(dir, target, tag,
                       {"--model=mlp", "--steps=300", "--batch-size=32", "--checkpoint-every=1000",
                        absl::StrCat("--job=sig", ::getpid())});
  };
  std::vector<pid_t> first = left.Add(trainers("first"));
  // Wait until rank 0 trains, then warn one trainer.
  const absl::Time end = absl::Now() + absl::Seconds(60);
  while (ReadText(dir + "/first0.log").find("step 20/") == std::string::npos && absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_EQ(::kill(first[1], SIGUSR1), 0);
  EXPECT_EQ(WaitExit(first[0]), 75) << ReadText(dir + "/first0.log");
  EXPECT_EQ(WaitExit(first[1]), 75) << ReadText(dir + "/first1.log");
  const std::string log0 = ReadText(dir + "/first0.log");
  EXPECT_NE(log0.find("stopping at step"), std::string::npos) << log0;

  int code = 0;
  const std::string listing =
      RunShell(kBin + "/muster --coordinator " + target + " checkpoints --verify", &code);
  EXPECT_EQ(code, 0) << listing;
  EXPECT_NE(listing.find("committed"), std::string::npos) << listing;
  EXPECT_NE(listing.find("ok   step"), std::string::npos) << listing;

  std::vector<pid_t> second = left.Add(trainers("second"));
  EXPECT_EQ(WaitExit(second[0]), 0) << ReadText(dir + "/second0.log");
  EXPECT_EQ(WaitExit(second[1]), 0) << ReadText(dir + "/second1.log");
  const std::string log = ReadText(dir + "/second0.log");
  EXPECT_NE(log.find("resumed from the checkpoint of step"), std::string::npos) << log;
  EXPECT_NE(log.find("done: 300 steps"), std::string::npos) << log;
  ::kill(coordinator, SIGTERM);
  WaitExit(coordinator);
}

// The checkpoint a stop needs cannot be written (here the checkpoint dir
// is replaced by a file, which even root cannot write into): the trainers
// do not exit 75, which promises a committed checkpoint of the step they
// stopped at. They exit 74 and name the step a restart resumes from, and a
// restart does resume from exactly that step.
TEST(SignalTest, AStopWhoseCheckpointFailsSaysSoAndWhereARestartResumes) {
  const std::string dir = ::testing::TempDir() + "/stopfail" + std::to_string(::getpid());
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  const std::string target = absl::StrCat("127.0.0.1:", FreeLoopbackPort());
  KillOnExit left;
  const pid_t coordinator = left.Add(TwoMemberCoordinator(dir, target));
  auto trainers = [&](const std::string& tag) {
    return TwoTrainers(dir, target, tag,
                       {"--model=mlp", "--dataset=synthetic", "--steps=100000", "--batch-size=16",
                        "--checkpoint-every=20", absl::StrCat("--job=sf", ::getpid())});
  };
  std::vector<pid_t> first = left.Add(trainers("first"));
  const absl::Time end = absl::Now() + absl::Seconds(90);
  while (ReadText(dir + "/first0.log").find("step 60/") == std::string::npos && absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  // One atomic exchange: a `mv` then a `touch` leaves a moment without
  // `ckpt`, in which the trainer's next write makes it again as a directory.
  const std::string ckpt = dir + "/ckpt", away = dir + "/ckpt.away";
  { std::ofstream(away).put('x'); }
  ASSERT_TRUE(Exchange(ckpt, away)) << std::strerror(errno);
  ASSERT_EQ(::kill(first[1], SIGUSR1), 0);
  EXPECT_EQ(WaitExit(first[0]), 74) << ReadText(dir + "/first0.log");
  EXPECT_EQ(WaitExit(first[1]), 74) << ReadText(dir + "/first1.log");
  const std::string log0 = ReadText(dir + "/first0.log");
  // "... without a checkpoint of it (its checkpoint did not commit): a restart
  // resumes from the checkpoint of step R and repeats N steps"
  const std::string key = "a restart resumes from the checkpoint of step ";
  const size_t at = log0.find(key);
  ASSERT_NE(at, std::string::npos) << log0;
  const size_t from = at + key.size();
  const std::string resumes = log0.substr(from, log0.find(' ', from) - from);
  EXPECT_NE(log0.find("its checkpoint did not commit"), std::string::npos) << log0;
  EXPECT_EQ(log0.find("after checkpointing"), std::string::npos) << log0;

  ASSERT_TRUE(Exchange(ckpt, away)) << std::strerror(errno);
  ASSERT_EQ(::unlink(away.c_str()), 0) << std::strerror(errno);
  std::vector<pid_t> second = left.Add(trainers("second"));
  const std::string said = absl::StrCat("resumed from the checkpoint of step ", resumes, "\n");
  const absl::Time end2 = absl::Now() + absl::Seconds(90);
  while (ReadText(dir + "/second0.log").find("resumed from") == std::string::npos &&
         absl::Now() < end2) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_NE(ReadText(dir + "/second0.log").find(said), std::string::npos)
      << said << ReadText(dir + "/second0.log");
  for (pid_t p : second) ::kill(p, SIGKILL);
  for (pid_t p : second) WaitExit(p);
  ::kill(coordinator, SIGTERM);
  WaitExit(coordinator);
}

}  // namespace
}  // namespace muster

namespace muster {
namespace {

// kill -9 of the rank that writes, while it writes: that checkpoint never
// commits, the previous one stays, and the next start resumes from it.
TEST(SignalTest, KillDuringACheckpointWriteNeverCommitsIt) {
  const std::string dir = ::testing::TempDir() + "/killwrite" + std::to_string(::getpid());
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  const int port = FreeLoopbackPort();
  const std::string target = absl::StrCat("127.0.0.1:", port);
  KillOnExit left;
  const pid_t coordinator = left.Add(TwoMemberCoordinator(dir, target));
  std::vector<pid_t> pids;
  for (int i = 0; i < 2; ++i) {
    // ResNet-18's 11M parameters and momentum make a ~90 MB checkpoint.
    const std::vector<std::string> argv = {
        kBin + "/muster-train", "--coordinator=" + target, "--node-id=n",
        absl::StrCat("--local-rank=", i), "--model=resnet18", "--dataset=synthetic",
        "--synthetic-size=8", "--steps=1000", "--batch-size=4", "--threads=1",
        "--checkpoint-dir=" + dir + "/ckpt", "--checkpoint-every=2",
        absl::StrCat("--job=kw", ::getpid())};
    pids.push_back(left.Add(SpawnLogged(argv, absl::StrCat(dir, "/t", i, ".log"))));
  }
  // Wait for a committed checkpoint, then for the next one to be mid-write.
  const absl::Time end = absl::Now() + absl::Seconds(120);
  std::string victim;
  while (absl::Now() < end && victim.empty()) {
    for (int step = 4; step < 1000 && victim.empty(); step += 2) {
      const std::string tmp = absl::StrCat(dir, "/ckpt/step-", step, "/model.safetensors.tmp");
      if (::access(tmp.c_str(), F_OK) == 0) victim = absl::StrCat("step ", step);
    }
  }
  ASSERT_FALSE(victim.empty()) << "no checkpoint write was caught in time";
  ::kill(pids[0], SIGKILL);
  WaitExit(pids[0]);
  ::kill(pids[1], SIGKILL);
  WaitExit(pids[1]);
  int code = 0;
  const std::string listing = RunShell(kBin + "/muster --coordinator " + target + " checkpoints", &code);
  EXPECT_EQ(code, 0) << listing;
  const std::string step = victim.substr(5);
  EXPECT_EQ(listing.find(absl::StrCat("  ", step, "  ")), std::string::npos)
      << "the checkpoint being written was committed:\n" << listing;
  EXPECT_NE(listing.find("committed"), std::string::npos) << listing;
  std::cout << "killed during the write of " << victim << "; catalog:\n" << listing;
  ::kill(coordinator, SIGTERM);
  WaitExit(coordinator);
}

}  // namespace
}  // namespace muster
