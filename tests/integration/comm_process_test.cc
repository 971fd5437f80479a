// Communicators as processes (muster-bench comm-worker) against an
// in-process coordinator: correctness across processes, and a peer killed
// (SIGKILL) or hung (SIGSTOP) mid-collective — the survivors' collective
// returns an error within 2 s of the coordinator's notice, and they rebuild
// the communicator with a replacement for the next generation.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "coordinator/server.h"
#include "tests/integration/scratch_dir.h"
#include "tests/integration/subprocess.h"
#ifdef MUSTER_HAVE_CUDA
#include "trainer/comm/nccl/nccl_communicator.h"
#endif

namespace muster {
namespace {

// The programs: where they were built, or $MUSTER_BIN_DIR (a packed copy on
// a GPU machine, deploy/gpu/pack).
const std::string kBin =
    std::getenv("MUSTER_BIN_DIR") != nullptr ? std::getenv("MUSTER_BIN_DIR") : MUSTER_BIN_DIR;

class CommProcessTest : public ::testing::Test {
 protected:
  void Start(int world) {
    ServerOptions o;
    o.coordinator.rules.min_members = world;
    o.coordinator.rules.max_members = world;
    o.coordinator.rules.last_call = absl::ZeroDuration();
    o.coordinator.heartbeat_interval = absl::Milliseconds(100);
    o.coordinator.heartbeat_timeout = absl::Milliseconds(1000);
    server_ = std::move(CoordinatorServer::Start(o)).value();
    dir_ = ::testing::TempDir() + "/commproc" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::system(("rm -rf " + dir_ + " && mkdir -p " + dir_).c_str());
  }

  void TearDown() override {
    for (pid_t p : pids_) {
      ::kill(p, SIGKILL);
      ::waitpid(p, nullptr, 0);
    }
    RemoveScratchUnlessFailed(dir_);
  }

  pid_t Spawn(int index, int node, int local, const std::string& backend, bool abort_test,
              const std::vector<std::string>& extra = {}) {
    std::vector<std::string> argv = {
        kBin + "/muster-bench", "comm-worker",
        absl::StrCat("--coordinator=127.0.0.1:", server_->port()),
        absl::StrCat("--member=m", index), absl::StrCat("--node=node", node),
        absl::StrCat("--local-rank=", local), "--backend=" + backend, "--sizes=4K,1M,4100",
        absl::StrCat("--job=proc", ::getpid()), "--report=" + Report(index)};
    argv.push_back(abort_test ? "--abort-test" : "--check");
    argv.insert(argv.end(), extra.begin(), extra.end());
    const pid_t pid = ::fork();
    if (pid == 0) {
      std::vector<char*> args;
      for (auto& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    pids_.push_back(pid);
    return pid;
  }

  std::string Report(int index) const { return absl::StrCat(dir_, "/worker", index, ".log"); }

  bool WaitFor(int index, const std::string& text, absl::Duration timeout) {
    const absl::Time end = absl::Now() + timeout;
    while (absl::Now() < end) {
      if (ReadText(Report(index)).find(text) != std::string::npos) return true;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return false;
  }

  // Exit code of `pid`, or -1 if it did not exit in time.
  int Reap(pid_t pid, absl::Duration timeout) {
    const absl::Time end = absl::Now() + timeout;
    while (absl::Now() < end) {
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        pids_.erase(std::find(pids_.begin(), pids_.end(), pid));
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    return -1;
  }

  void KillMidCollective(const std::string& backend, const std::vector<int>& split, int sig,
                         const std::vector<std::string>& extra = {}) {
    const int w = static_cast<int>(split.size());
    Start(w);
    std::vector<int> local(w);
    std::vector<pid_t> pids;
    for (int i = 0; i < w; ++i) {
      local[i] = static_cast<int>(std::count(split.begin(), split.begin() + i, split[i]));
      pids.push_back(Spawn(i, split[i], local[i], backend, /*abort_test=*/true, extra));
    }
    for (int i = 0; i < w; ++i) ASSERT_TRUE(WaitFor(i, "ready", absl::Seconds(30))) << i;
    absl::SleepFor(absl::Milliseconds(300));  // inside the all-reduce loop
    const int victim = w - 1;
    ASSERT_EQ(::kill(pids[victim], sig), 0);
    for (int i = 0; i < victim; ++i) {
      ASSERT_TRUE(WaitFor(i, "error code=", absl::Seconds(20))) << ReadText(Report(i));
      const std::string report = ReadText(Report(i));
      const size_t at = report.find("return_after_notice_ms=");
      ASSERT_NE(at, std::string::npos);
      double ms = 0;
      ASSERT_TRUE(absl::SimpleAtod(
          report.substr(at + 23, report.find(' ', at) - at - 23), &ms));
      EXPECT_LE(ms, 2000.0) << report;
    }
    // A replacement (same member id, new incarnation) joins; all rebuild.
    std::system(("mv " + Report(victim) + " " + Report(victim) + ".old").c_str());
    const pid_t replacement = Spawn(victim, split[victim], local[victim], backend, true, extra);
    for (int i = 0; i < victim; ++i) {
      EXPECT_EQ(Reap(pids[i], absl::Seconds(60)), 0) << ReadText(Report(i));
      const std::string report = ReadText(Report(i));
      EXPECT_NE(report.find("ready generation=2"), std::string::npos) << report;
      EXPECT_NE(report.find("rebuilt_done exit=0"), std::string::npos) << report;
      EXPECT_EQ(report.find("check_failed"), std::string::npos) << report;
    }
    EXPECT_EQ(Reap(replacement, absl::Seconds(60)), 0) << ReadText(Report(victim));
  }

  // Two workers as two nodes of one rank on the GPU, every check of
  // kGpuCheck passed (ExpectGpuChecksPassed, defined below).
  void CheckTwoNodesOnTheGpu();

  std::unique_ptr<CoordinatorServer> server_;
  std::string dir_;
  std::vector<pid_t> pids_;
};

TEST_F(CommProcessTest, HierarchicalAcrossProcessesMatchesReference) {
  const std::vector<int> split = {0, 0, 0, 1, 1, 1};
  Start(6);
  std::vector<pid_t> pids;
  for (int i = 0; i < 6; ++i) pids.push_back(Spawn(i, split[i], i % 3, "hier", false));
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(Reap(pids[i], absl::Seconds(60)), 0) << ReadText(Report(i));
    EXPECT_NE(ReadText(Report(i)).find("check_ok dtype=float32 bytes=1048576"),
              std::string::npos);
  }
}

// ---- On a GPU (skipped without one): NCCL, and the hierarchy with Gloo
// between nodes from pinned host buffers, two trainers sharing the GPU as
// two "nodes" of one rank each (inside which nothing is reduced: "self",
// single_rank.h).

bool HaveGpu() {
#ifdef MUSTER_HAVE_CUDA
  return CudaDeviceCount() > 0;
#else
  return false;
#endif
}

const std::vector<std::string> kGpuCheck = {"--device=cuda", "--dtypes=float32,bfloat16,float16",
                                            "--sizes=4,4100,4K,1M,16M,64M"};

// A worker's report after kGpuCheck on `backend`: every dtype up to the
// largest size checked, nothing wrong.
void ExpectGpuChecksPassed(const std::string& report, const std::string& backend) {
  EXPECT_NE(report.find("backend=" + backend), std::string::npos) << report;
  for (const char* dtype : {"float32", "bfloat16", "float16"}) {
    EXPECT_NE(report.find(absl::StrCat("check_ok dtype=", dtype, " bytes=67108864")),
              std::string::npos)
        << report;
  }
  EXPECT_EQ(report.find("check_failed"), std::string::npos) << report;
}

void CommProcessTest::CheckTwoNodesOnTheGpu() {
  Start(2);
  std::vector<pid_t> pids = {Spawn(0, 0, 0, "hier", false, kGpuCheck),
                             Spawn(1, 1, 0, "hier", false, kGpuCheck)};
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(Reap(pids[i], absl::Seconds(120)), 0) << ReadText(Report(i));
    ExpectGpuChecksPassed(ReadText(Report(i)), "hier(self+gloo)");
  }
}

TEST_F(CommProcessTest, NcclWorldOfOneOnTheGpu) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  Start(1);
  const pid_t pid = Spawn(0, 0, 0, "nccl", false, kGpuCheck);
  EXPECT_EQ(Reap(pid, absl::Seconds(120)), 0) << ReadText(Report(0));
  ExpectGpuChecksPassed(ReadText(Report(0)), "nccl");
}

TEST_F(CommProcessTest, NcclInsideNodesGlooAcrossOnTheGpu) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  CheckTwoNodesOnTheGpu();
}

TEST_F(CommProcessTest, NcclInsideNodesGlooAcrossSurvivesSigkillOnTheGpu) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  KillMidCollective("hier", {0, 1, 2}, SIGKILL, {"--device=cuda"});
}

// NCCL takes one rank per GPU: two ranks of one NCCL communicator on the
// one GPU are refused at once with INVALID_ARGUMENT and the reason, a
// configuration to change (a trainer ends on it instead of regrouping into
// the same refusal again and again).
TEST_F(CommProcessTest, TwoRanksOfOneNcclCommunicatorOnOneGpuAreRefusedWithTheReason) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  Start(2);
  std::vector<pid_t> pids = {Spawn(0, 0, 0, "nccl", false, {"--device=cuda"}),
                             Spawn(1, 1, 0, "nccl", false, {"--device=cuda"})};
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(Reap(pids[i], absl::Seconds(60)), 5) << ReadText(Report(i));
    const std::string report = ReadText(Report(i));
    EXPECT_NE(report.find("build_failed INVALID_ARGUMENT"), std::string::npos) << report;
    EXPECT_NE(report.find("NCCL takes one rank per GPU"), std::string::npos) << report;
  }
}

// The same two worlds with the staging between nodes pipelined
// (trainer/comm/staged.h) in 64 KiB chunks: 4100 elements make one chunk
// and a part, 64 MiB a thousand.
class PipelinedStagingProcessTest : public CommProcessTest {
 protected:
  void SetUp() override { ::setenv("MUSTER_STAGING_CHUNK_KB", "64", 1); }
  void TearDown() override {
    ::unsetenv("MUSTER_STAGING_CHUNK_KB");
    CommProcessTest::TearDown();
  }
};

TEST_F(PipelinedStagingProcessTest, NcclInsideNodesGlooAcrossOnTheGpu) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  CheckTwoNodesOnTheGpu();
}

TEST_F(PipelinedStagingProcessTest, NcclInsideNodesGlooAcrossSurvivesSigkillOnTheGpu) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  KillMidCollective("hier", {0, 1, 2}, SIGKILL, {"--device=cuda"});
}

TEST_F(CommProcessTest, ShmSurvivesSigkill) { KillMidCollective("shm", {0, 0, 0}, SIGKILL); }
TEST_F(CommProcessTest, GlooSurvivesSigkill) { KillMidCollective("gloo", {0, 1, 2}, SIGKILL); }
TEST_F(CommProcessTest, HierSurvivesSigkill) { KillMidCollective("hier", {0, 0, 1, 1}, SIGKILL); }
TEST_F(CommProcessTest, HierSurvivesSigstop) { KillMidCollective("hier", {0, 0, 1, 1}, SIGSTOP); }
TEST_F(CommProcessTest, ShmSurvivesSigstop) { KillMidCollective("shm", {0, 0, 0}, SIGSTOP); }

}  // namespace
}  // namespace muster
