// muster-bench recovery: a job of W trainers on M nodes (one muster-agent per
// node) on loopback against a real coordinator. In each trial a random
// trainer other than rank 0 is SIGKILLed at a random step; its agent restarts
// it. Rank 0 logs every step with its wall time and world size; from that:
//   survivors_resume: from the kill to the survivors' first completed step in
//                     the smaller world;
//   full_world:       from the kill to the first step with the restarted
//                     trainer back;
//   lost_steps:       the step in flight at the kill plus completed steps the
//                     smaller world did again (1: nothing completed was lost);
//   params_equal:     every trainer, the restarted one included, ends with
//                     the same parameter checksum.
// Prints:
//   recovery trials=N survivors_resume_p50_s=.. survivors_resume_max_s=..
//   full_world_p50_s=.. lost_steps_max=.. params_equal=K/N
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <iostream>
#include <random>
#include <regex>
#include <sstream>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "tests/bench/process_stats.h"

ABSL_FLAG(int, trials, 5, "recovery: kills to measure");
ABSL_FLAG(uint64_t, seed, 1, "recovery: seed of the victim and kill step choice");
ABSL_DECLARE_FLAG(int, world);
ABSL_DECLARE_FLAG(int, nodes);

namespace muster {
namespace {

struct Trial {
  bool ok = false;
  double survivors_resume_s = 0, full_world_s = 0;
  int lost_steps = 0;
  bool params_equal = false;
};

Trial RunTrial(int index, std::mt19937_64& rng) {
  const int world = absl::GetFlag(FLAGS_world), nodes = absl::GetFlag(FLAGS_nodes);
  const int per_node = world / nodes;
  const int64_t steps = 600;
  const std::string dir = absl::StrCat("/tmp/muster-bench-recovery-", ::getpid(), "-", index);
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  const std::string target = "127.0.0.1:" + std::to_string(FreeLoopbackPort());
  const pid_t coordinator = SpawnLogged(
      {SelfDir() + "/muster-coordinator", "--listen=" + target, "--no-auth",
       absl::StrCat("--min-members=", world - 1), absl::StrCat("--max-members=", world),
       "--last-call=200ms"},
      dir + "/coordinator.log");
  std::vector<pid_t> agents;
  for (int n = 0; n < nodes; ++n) {
    std::vector<std::string> argv = {
        SelfDir() + "/muster-agent", absl::StrCat("--nproc-per-node=", per_node),
        absl::StrCat("--node-id=node", n), "--", SelfDir() + "/muster-train",
        "--coordinator=" + target, "--model=mlp", "--batch-size=32",
        absl::StrCat("--steps=", steps), "--log-every=1", "--quiet", "--threads=1",
        absl::StrCat("--job=rb", ::getpid(), "-", index, "-", n),
        absl::StrCat("--summary-json=", dir, "/{node}-{local_rank}.json")};
    if (n == 0) argv.push_back("--log-dir=" + dir + "/rank0");
    agents.push_back(SpawnLogged(argv, absl::StrCat(dir, "/agent", n, ".log")));
  }
  Trial t;
  // A random victim other than rank 0 (node0's trainer 0), at a random step.
  std::uniform_int_distribution<int> pick(1, world - 1);
  std::uniform_int_distribution<int> at(40, 160);
  const int victim = pick(rng);
  const int64_t kill_step = at(rng);
  const std::string metrics = dir + "/rank0/metrics.jsonl";
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  while (absl::Now() < deadline) {
    const auto recs = ReadStepRecords(metrics);
    if (!recs.empty() && recs.back().step >= kill_step && recs.back().world == world) break;
    absl::SleepFor(absl::Milliseconds(2));
  }
  const std::string victim_log = absl::StrCat(dir, "/agent", victim / per_node, ".log");
  const pid_t pid = LastTrainerPid(victim_log, victim % per_node);
  const double kill_time = absl::ToUnixMicros(absl::Now()) / 1e6;
  if (pid > 0) ::kill(pid, SIGKILL);
  int failures = 0;
  for (pid_t a : agents) {
    int status = 0;
    ::waitpid(a, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failures;
  }
  StopProcess(coordinator);
  if (pid <= 0 || failures > 0) {
    std::cerr << "muster-bench recovery: trial " << index << " failed; see " << dir << "\n";
    return t;
  }
  bool shrunk = false, regrown = false;
  int64_t last_full_step = 0;
  for (const StepRecord& r : ReadStepRecords(metrics)) {
    if (!shrunk && r.world == world) last_full_step = r.step;
    if (r.time < kill_time) continue;
    if (!shrunk && r.world < world) {
      shrunk = true;
      t.survivors_resume_s = r.time - kill_time;
      // The step in flight at the kill, plus any completed step done again.
      t.lost_steps = static_cast<int>(last_full_step - r.step + 2);
    }
    if (shrunk && !regrown && r.world == world) {
      regrown = true;
      t.full_world_s = r.time - kill_time;
    }
  }
  std::string first;
  t.params_equal = true;
  for (int i = 0; i < world; ++i) {
    const std::string sum =
        JsonNumber(ReadText(absl::StrCat(dir, "/node", i / per_node, "-", i % per_node, ".json")),
                   "parameter_checksum");
    if (i == 0) first = sum;
    if (sum.empty() || sum != first) t.params_equal = false;
  }
  t.ok = shrunk && regrown;
  if (!t.ok) {
    std::cerr << "muster-bench recovery: trial " << index << ": no "
              << (shrunk ? "full world again" : "smaller world") << " after the kill; see " << dir
              << "\n";
  } else if (t.params_equal) {
    std::system(("rm -rf " + dir).c_str());
  }
  return t;
}

}  // namespace

int RunRecoveryBench() {
  const int trials = absl::GetFlag(FLAGS_trials);
  if (absl::GetFlag(FLAGS_world) < 2 || absl::GetFlag(FLAGS_nodes) < 1 ||
      absl::GetFlag(FLAGS_world) % absl::GetFlag(FLAGS_nodes) != 0 || trials < 1) {
    std::cerr << "muster-bench recovery: --world >= 2 must be a multiple of --nodes; --trials >= 1\n";
    return 2;
  }
  std::mt19937_64 rng(absl::GetFlag(FLAGS_seed));
  std::vector<double> resume, full;
  int lost_max = 0, equal = 0, completed = 0;
  for (int i = 0; i < trials; ++i) {
    const Trial t = RunTrial(i, rng);
    if (!t.ok) continue;
    ++completed;
    resume.push_back(t.survivors_resume_s);
    full.push_back(t.full_world_s);
    lost_max = std::max(lost_max, t.lost_steps);
    if (t.params_equal) ++equal;
    std::cerr << absl::StrFormat("trial %d: survivors_resume_s=%.3f full_world_s=%.3f lost_steps=%d params_equal=%d\n",
                                 i, t.survivors_resume_s, t.full_world_s, t.lost_steps,
                                 t.params_equal ? 1 : 0);
  }
  std::vector<double> resume_sorted = resume;
  std::cout << absl::StrFormat(
                   "recovery trials=%d survivors_resume_p50_s=%.3f survivors_resume_max_s=%.3f "
                   "full_world_p50_s=%.3f lost_steps_max=%d params_equal=%d/%d",
                   trials, resume.empty() ? 0 : Percentile(resume, 50),
                   resume_sorted.empty() ? 0 : *std::max_element(resume_sorted.begin(), resume_sorted.end()),
                   full.empty() ? 0 : Percentile(full, 50), lost_max, equal, trials)
            << std::endl;
  return completed == trials ? 0 : 1;
}

}  // namespace muster
