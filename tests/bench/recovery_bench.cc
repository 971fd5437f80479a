// muster-bench recovery: a job of W trainers on M nodes (one muster-agent per
// node) on loopback against a real coordinator, with --spares S warm spare
// trainers (on node 0's agent). In each trial a random trainer other than
// rank 0 is SIGKILLed at a random step; its agent restarts it. Rank 0 logs
// every step with its wall time, world size and generation; from that:
//   survivors_resume: from the kill to the first completed step of the next
//                     generation (the smaller world, or the full one when a
//                     spare took the dead trainer's place);
//   full_world:       from the kill to the first step of a later generation
//                     with W trainers again;
//   lost_steps:       steps dropped (the step in flight at the kill, unless it
//                     was salvaged) plus completed steps the smaller world did
//                     again (0: no work lost);
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
ABSL_FLAG(int, spares, 0, "recovery: warm spare trainers (muster-agent --spares on node 0)");
ABSL_FLAG(bool, spare_node, false,
          "recovery: the spares run on a node of their own (an agent with --nproc-per-node 0, "
          "as MUSTER_SPARE_NODES does on Slurm) instead of on node 0");
ABSL_DECLARE_FLAG(int, world);
ABSL_DECLARE_FLAG(int, nodes);
ABSL_DECLARE_FLAG(std::string, device);
ABSL_FLAG(int64_t, job_steps, 600, "recovery: steps of each trial's job");
ABSL_FLAG(std::vector<std::string>, trainer_flags, {},
          "recovery: more muster-train flags, comma-separated (e.g. "
          "--dataset=synthetic,--compute-ms=10 where Fashion-MNIST is not installed)");

namespace muster {
namespace {

struct Trial {
  bool ok = false;
  double survivors_resume_s = 0, full_world_s = 0;
  int lost_steps = 0;
  bool params_equal = false;
};

// A trial's job: coordinator, one agent per node (node 0 or a node of their
// own with the spares),
// rank 0 logging every step.
struct TrialJob {
  std::string dir, target;
  pid_t coordinator = -1;
  std::vector<pid_t> agents;
};

// Agents: one per node, and one more for the spares with --spare_node.
int AgentCount(int nodes) { return nodes + (absl::GetFlag(FLAGS_spare_node) ? 1 : 0); }

// Trainers agent `n` starts, and how many of them are spares.
std::pair<int, int> SlotsOf(int n, int world, int nodes) {
  const int spares = absl::GetFlag(FLAGS_spares);
  if (n == nodes) return {0, spares};  // the spare node
  const int here = n == 0 && !absl::GetFlag(FLAGS_spare_node) ? spares : 0;
  return {world / nodes, here};
}

TrialJob StartTrialJob(int index, int world, int nodes) {
  const int64_t steps = absl::GetFlag(FLAGS_job_steps);
  TrialJob job;
  job.dir = absl::StrCat("/tmp/muster-bench-recovery-", ::getpid(), "-", index);
  std::system(("rm -rf " + job.dir + " && mkdir -p " + job.dir).c_str());
  job.target = "127.0.0.1:" + std::to_string(FreeLoopbackPort());
  job.coordinator = SpawnLogged(
      {SelfDir() + "/muster-coordinator", "--listen=" + job.target, "--no-auth",
       absl::StrCat("--min-members=", world - 1), absl::StrCat("--max-members=", world),
       "--last-call=200ms"},
      job.dir + "/coordinator.log");
  for (int n = 0; n < AgentCount(nodes); ++n) {
    const auto [trainers, spares] = SlotsOf(n, world, nodes);
    std::vector<std::string> argv = {
        SelfDir() + "/muster-agent", absl::StrCat("--nproc-per-node=", trainers),
        absl::StrCat("--spares=", spares),
        absl::StrCat("--node-id=node", n), "--coordinator=" + job.target, "--",
        SelfDir() + "/muster-train",
        "--coordinator=" + job.target, "--model=mlp", "--batch-size=32",
        absl::StrCat("--steps=", steps), "--log-every=1", "--quiet", "--threads=1",
        absl::StrCat("--job=rb", ::getpid(), "-", index, "-", n),
        absl::StrCat("--summary-json=", job.dir, "/{node}-{local_rank}.json")};
    if (n == 0) argv.push_back("--log-dir=" + job.dir + "/rank0");
    for (const std::string& f : absl::GetFlag(FLAGS_trainer_flags)) argv.push_back(f);
    if (absl::GetFlag(FLAGS_device) == "cuda") {
      // NCCL inside each node, Gloo across: with one GPU, one trainer per node.
      argv.insert(argv.end(), {"--device=cuda", "--backend=hier"});
    }
    job.agents.push_back(SpawnLogged(argv, absl::StrCat(job.dir, "/agent", n, ".log")));
  }
  return job;
}

// Waits for a random step of the full world, then SIGKILLs a random member
// of it: its pid (<= 0: none found) and the time of the kill.
std::pair<pid_t, double> KillAtRandom(const TrialJob& job, int world, std::mt19937_64& rng) {
  std::uniform_int_distribution<int> at(40, 160);
  const int64_t kill_step = at(rng);
  const std::string metrics = job.dir + "/rank0/metrics.jsonl";
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  while (absl::Now() < deadline) {
    const auto recs = ReadStepRecords(metrics);
    if (!recs.empty() && recs.back().step >= kill_step && recs.back().world == world) break;
    absl::SleepFor(absl::Milliseconds(2));
  }
  const std::vector<std::pair<int, int>> members = WorldMembers(job.target);
  if (members.empty()) return {-1, 0};
  const auto [node, slot] =
      members[std::uniform_int_distribution<size_t>(0, members.size() - 1)(rng)];
  const pid_t pid = LastTrainerPid(absl::StrCat(job.dir, "/agent", node, ".log"), slot);
  const double kill_time = absl::ToUnixMicros(absl::Now()) / 1e6;
  if (pid > 0) ::kill(pid, SIGKILL);
  return {pid, kill_time};
}

// From rank 0's step records: when the survivors resumed, when the world
// was full again, and the completed steps done again.
void ScoreRecovery(const std::string& metrics, double kill_time, int world, Trial* t) {
  bool resumed = false, regrown = false;
  int64_t last_step = 0;
  uint64_t generation = 0;  // of the world at the kill
  for (const StepRecord& r : ReadStepRecords(metrics)) {
    if (r.time < kill_time) {
      last_step = r.step;
      generation = r.generation;
      continue;
    }
    if (!resumed && r.generation > generation) {
      resumed = true;
      t->survivors_resume_s = r.time - kill_time;
      // Completed steps done again (a state source behind the others).
      t->lost_steps = static_cast<int>(std::max<int64_t>(0, last_step + 1 - r.step));
    }
    if (resumed && !regrown && r.world == world) {
      regrown = true;
      t->full_world_s = r.time - kill_time;
    }
  }
  t->ok = resumed && regrown;
}

// The trainers that finished in the full world (a spare left over ends
// outside it) hold the same parameters.
bool ParametersEqual(const std::string& dir, int world, int nodes) {
  std::string first;
  int finished = 0;
  bool equal = true;
  for (int n = 0; n < AgentCount(nodes); ++n) {
    const auto [trainers, spares] = SlotsOf(n, world, nodes);
    for (int s = 0; s < trainers + spares; ++s) {
      const std::string json = ReadText(absl::StrCat(dir, "/node", n, "-", s, ".json"));
      if (JsonNumber(json, "world_size") != std::to_string(world)) continue;
      const std::string sum = JsonNumber(json, "parameter_checksum");
      if (finished++ == 0) first = sum;
      if (sum.empty() || sum != first) equal = false;
    }
  }
  return equal && finished == world;
}

Trial RunTrial(int index, std::mt19937_64& rng) {
  const int world = absl::GetFlag(FLAGS_world), nodes = absl::GetFlag(FLAGS_nodes);
  const TrialJob job = StartTrialJob(index, world, nodes);
  const auto [pid, kill_time] = KillAtRandom(job, world, rng);
  int failures = 0;
  for (pid_t a : job.agents) {
    if (pid <= 0) ::kill(a, SIGTERM);
    int status = 0;
    ::waitpid(a, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failures;
  }
  StopProcess(job.coordinator);
  Trial t;
  if (pid <= 0 || failures > 0) {
    std::cerr << "muster-bench recovery: trial " << index << " failed"
              << (pid <= 0 ? " (no world member to kill)" : "") << "; see " << job.dir << "\n";
    return t;
  }
  ScoreRecovery(job.dir + "/rank0/metrics.jsonl", kill_time, world, &t);
  // The step in flight at the kill, if rank 0 dropped it.
  const std::string dropped = JsonNumber(ReadText(job.dir + "/node0-0.json"), "steps_dropped");
  t.lost_steps += dropped.empty() ? 1 : std::stoi(dropped);
  t.params_equal = ParametersEqual(job.dir, world, nodes);
  if (!t.ok) {
    std::cerr << "muster-bench recovery: trial " << index << ": no full world again after the "
              << "kill; see " << job.dir << "\n";
  } else if (t.params_equal && std::getenv("MUSTER_KEEP") == nullptr) {
    std::system(("rm -rf " + job.dir).c_str());
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
                   "recovery world=%d nodes=%d spares=%d trials=%d survivors_resume_p50_s=%.3f "
                   "survivors_resume_max_s=%.3f full_world_p50_s=%.3f lost_steps_max=%d "
                   "params_equal=%d/%d",
                   absl::GetFlag(FLAGS_world), absl::GetFlag(FLAGS_nodes),
                   absl::GetFlag(FLAGS_spares), trials, resume.empty() ? 0 : Percentile(resume, 50),
                   resume_sorted.empty() ? 0 : *std::max_element(resume_sorted.begin(), resume_sorted.end()),
                   full.empty() ? 0 : Percentile(full, 50), lost_max, equal, trials)
            << std::endl;
  return completed == trials ? 0 : 1;
}

}  // namespace muster
