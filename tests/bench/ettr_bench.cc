// muster-bench ettr --mtbf S --minutes M: effective training time under a
// storm of failures. A real job on this machine (coordinator, one
// muster-agent per node, --spares on node 0, MLP trainers checkpointing every
// 40 steps) runs for M minutes while failures arrive as a Poisson process of
// mean S seconds, their kind drawn evenly (seeded):
//   trainer   SIGKILL of a random trainer of the world; its agent restarts it;
//   node      SIGKILL of a random node's agent, which takes its trainers
//             along; the node comes back (a new agent) after 2 s;
//   hang      SIGSTOP of a random trainer of the world, SIGCONT after 4 s
//             (detached by its agent at its stopped limit, it rejoins);
//   link      one TCP connection between two trainers destroyed (ss -K);
//             the two ends report, the world regroups;
//   freeze    the training thread of a random trainer of the world frozen
//             (ptrace) while its heartbeats go on: its agent sees the thread
//             held stopped and, past its stopped limit, kills and restarts
//             it.
// link and freeze need root; without it they are not drawn.
// Each step also spends --compute-ms as if computing: on a 2-core machine a
// smaller world would otherwise step faster than the full one (fewer
// processes share the cores), which no accelerator cluster does. Then
// SIGUSR1 stops the job with a checkpoint. The same job without
// failures (for min(M, 5) minutes) is the reference. Prints
//   ettr mtbf_s=.. minutes=.. world=.. nodes=.. spares=.. failures=.. ettr=..
//        steps_committed_pct=.. world_full_pct=.. lost_steps=..
// The job's shape comes from --world, --nodes and --spares (defaults 2, 1, 0:
// the issue's job is --world 4 --nodes 2 --spares 1), and the line says it.
// ettr: committed steps per second of the stormy run over the reference's
// (both from the first world to the stop signal); lost_steps: steps dropped
// (a failure no salvage could rescue) plus steps done again; world_full_pct:
// the share of that time the world had all its members (from the
// coordinator's regroup log).
//
// With --false-alarms only the failure-free job runs, for M minutes, with
// the defaults that decide who is dead or hung (agents' stopped limit, the
// coordinator's heartbeat timeout, the collective deadline that follows the
// job unless --collective-timeout says otherwise), an evaluation every
// --eval-every steps and a checkpoint every 40; nothing may be failed,
// fenced, detached or regrouped. Prints
//   false_alarms minutes=.. steps=.. checkpoints=.. failed=.. fenced=..
//                broken=.. detached=.. ended=.. regroups=..
#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <iostream>
#include <random>
#include <regex>
#include <set>
#include <sstream>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "tests/bench/process_stats.h"
#include "tests/bench/trainer_faults.h"

ABSL_FLAG(double, mtbf, 30, "ettr: mean seconds between failures");
ABSL_FLAG(double, minutes, 10, "ettr: minutes of training under failures");
ABSL_FLAG(int, compute_ms, 40,
          "ettr: per-step compute time the trainers add (muster-train --compute-ms), so that "
          "on this small machine a smaller world does not step faster than the full one");
ABSL_FLAG(double, collective_timeout, 0,
          "ettr: the trainers' --collective-timeout (0: theirs, which follows the job); a frozen "
          "training thread costs about that long");
ABSL_FLAG(bool, false_alarms, false,
          "ettr: run the job without failures for --minutes and count whatever was failed, "
          "fenced, detached or regrouped (all must be 0)");
ABSL_FLAG(int, eval_every, 0, "ettr: the trainers' --eval-every (0: at the end only)");
ABSL_DECLARE_FLAG(int, world);
ABSL_DECLARE_FLAG(int, nodes);
ABSL_DECLARE_FLAG(int, spares);
ABSL_DECLARE_FLAG(uint64_t, seed);

namespace muster {
namespace {

struct Run {
  double seconds = 0;  // first world to the stop signal
  int64_t steps = 0;   // committed
  int failures = 0;
  int dropped = 0;
  double full_pct = 0;
  double stop_of_day = 0;  // the stop signal, seconds of the UTC day
};

class Job {
 public:
  explicit Job(const std::string& dir) : dir_(dir) {
    std::system(("rm -rf " + dir_ + " && mkdir -p " + dir_).c_str());
    target_ = "127.0.0.1:" + std::to_string(FreeLoopbackPort());
    coordinator_ = SpawnLogged({SelfDir() + "/muster-coordinator", "--listen=" + target_,
                                "--no-auth", "--state-dir=" + dir_ + "/state", "--min-members=2",
                                absl::StrCat("--max-members=", absl::GetFlag(FLAGS_world)),
                                "--last-call=200ms", "--heartbeat-interval=500ms",
                                "--heartbeat-timeout=2s"},
                               dir_ + "/coordinator.log");
    agents_.assign(absl::GetFlag(FLAGS_nodes), -1);
    for (int n = 0; n < static_cast<int>(agents_.size()); ++n) StartAgent(n);
  }
  ~Job() {
    for (pid_t a : agents_) {
      if (a > 0) StopProcess(a);
    }
    StopProcess(coordinator_);
  }

  void StartAgent(int n) {
    const int per_node = absl::GetFlag(FLAGS_world) / absl::GetFlag(FLAGS_nodes);
    agents_[n] = SpawnLogged(
        {SelfDir() + "/muster-agent", absl::StrCat("--nproc-per-node=", per_node),
         absl::StrCat("--spares=", n == 0 ? absl::GetFlag(FLAGS_spares) : 0),
         "--max-restarts=1000", absl::StrCat("--node-id=node", n), "--coordinator=" + target_,
         "--",
         SelfDir() + "/muster-train", "--coordinator=" + target_, "--model=mlp",
         "--batch-size=32", "--steps=100000000", "--log-every=100", "--quiet", "--threads=1",
         absl::StrCat("--compute-ms=", absl::GetFlag(FLAGS_compute_ms)),
         absl::StrCat("--collective-timeout=", absl::GetFlag(FLAGS_collective_timeout)),
         absl::StrCat("--job=ettr", ::getpid(), "-", n), "--checkpoint-dir=" + dir_ + "/ckpt",
         "--checkpoint-every=40", absl::StrCat("--eval-every=", absl::GetFlag(FLAGS_eval_every)),
         absl::StrCat("--summary-json=", dir_, "/{node}-{local_rank}.json")},
        absl::StrCat(dir_, "/agent", n, "-", ++starts_, ".log"));
  }

  // Kill, hang or take down something, as `kind` says.
  void Inject(int kind, std::mt19937_64& rng) {
    const std::vector<std::pair<int, int>> members = WorldMembers(target_);
    if (kind == 1 || members.empty()) {
      const int n = std::uniform_int_distribution<int>(0, static_cast<int>(agents_.size()) - 1)(rng);
      ::kill(agents_[n], SIGKILL);
      ::waitpid(agents_[n], nullptr, 0);
      downs_.push_back({absl::Now() + absl::Seconds(2), n, -1});
      return;
    }
    const auto [node, slot] =
        members[std::uniform_int_distribution<size_t>(0, members.size() - 1)(rng)];
    const pid_t pid = TrainerPid(node, slot);
    if (pid <= 0) return;
    if (kind == 0) {
      ::kill(pid, SIGKILL);
    } else if (kind == 2) {
      ::kill(pid, SIGSTOP);
      downs_.push_back({absl::Now() + absl::Seconds(4), -1, pid});
    } else if (kind == 3) {
      std::set<pid_t> trainers;
      for (const auto& [n, s] : members) trainers.insert(TrainerPid(n, s));
      const std::vector<TrainerLink> links = TrainerLinks(trainers);
      if (!links.empty()) {
        CutLink(links[std::uniform_int_distribution<size_t>(0, links.size() - 1)(rng)]);
      }
    } else if (FreezeMainThread(pid).empty()) {
      frozen_.push_back(pid);
    }
  }
  // Brings back what Inject took down, when it is due.
  void Heal(bool all) {
    // A frozen trainer ends when its agent kills it; its tracer collects it.
    for (auto it = frozen_.begin(); it != frozen_.end();) {
      if (FrozenEnded(*it)) {
        it = frozen_.erase(it);
      } else if (all) {
        Thaw(*it);
        it = frozen_.erase(it);
      } else {
        ++it;
      }
    }
    for (auto it = downs_.begin(); it != downs_.end();) {
      if (!all && absl::Now() < it->at) {
        ++it;
        continue;
      }
      if (it->node >= 0) StartAgent(it->node);
      if (it->pid > 0) ::kill(it->pid, SIGCONT);
      it = downs_.erase(it);
    }
  }
  // SIGUSR1 to every agent (checkpoint and stop); waits for them.
  void Stop() {
    Heal(true);
    for (pid_t a : agents_) ::kill(a, SIGUSR1);
    for (pid_t& a : agents_) {
      ::waitpid(a, nullptr, 0);
      a = -1;
    }
  }

  pid_t TrainerPid(int node, int slot) const {
    pid_t pid = -1;
    for (int i = 1; i <= starts_; ++i) {
      const pid_t p = LastTrainerPid(absl::StrCat(dir_, "/agent", node, "-", i, ".log"), slot);
      if (p > 0) pid = p;
    }
    return pid;
  }
  std::string AgentLogs() const {
    std::string all;
    for (int n = 0; n < static_cast<int>(agents_.size()); ++n) {
      for (int i = 1; i <= starts_; ++i) all += ReadText(absl::StrCat(dir_, "/agent", n, "-", i, ".log"));
    }
    return all;
  }
  const std::string& dir() const { return dir_; }

 private:
  struct Down {
    absl::Time at;
    int node;
    pid_t pid;
  };
  std::string dir_, target_;
  pid_t coordinator_ = -1;
  std::vector<pid_t> agents_;
  std::vector<Down> downs_;
  std::vector<pid_t> frozen_;
  int starts_ = 0;
};

// Seconds of the day of a log line's "I hh:mm:ss.mmm" stamp.
double LogTime(const std::string& hms) {
  return std::stoi(hms.substr(0, 2)) * 3600.0 + std::stoi(hms.substr(3, 2)) * 60.0 +
         std::stod(hms.substr(6));
}

// From the coordinator's log: the first world's time, the share of time
// until `end` (seconds of the day) with `world` members.
std::pair<double, double> WorldTimeline(const std::string& log, double end, int world) {
  const std::regex line(R"re(^. ([0-9:.]+) \S+\] (regroup: generation [0-9]+: ([0-9]+) members|pause:))re");
  double first = -1, last = 0, full = 0;
  int size = 0;
  std::istringstream in(log);
  std::string text;
  std::smatch m;
  while (std::getline(in, text)) {
    if (!std::regex_search(text, m, line)) continue;
    double t = LogTime(m[1]);
    if (first >= 0 && t < last) t += 86400;  // past midnight
    if (first >= 0 && end < first) end += 86400;
    if (first >= 0 && t > end) break;  // the stop itself
    if (first < 0) first = t;
    if (size == world) full += t - last;
    last = t;
    size = m[3].matched ? std::stoi(m[3]) : 0;
  }
  if (first < 0) return {0, 0};
  if (end < first) end += 86400;
  if (size == world) full += end - last;
  return {first, end > first ? 100.0 * full / (end - first) : 0};
}

Run RunJob(const std::string& dir, double minutes, double mtbf, std::mt19937_64& rng) {
  Run r;
  Job job(dir);
  std::exponential_distribution<double> gap(mtbf > 0 ? 1.0 / mtbf : 1.0);
  const absl::Time end = absl::Now() + absl::Seconds(minutes * 60);
  absl::Time next = mtbf > 0 ? absl::Now() + absl::Seconds(gap(rng)) : absl::InfiniteFuture();
  while (absl::Now() < end) {
    if (absl::Now() >= next) {
      job.Inject(std::uniform_int_distribution<int>(0, ::geteuid() == 0 ? 4 : 2)(rng), rng);
      ++r.failures;
      next = absl::Now() + absl::Seconds(gap(rng));
    }
    job.Heal(false);
    absl::SleepFor(absl::Milliseconds(50));
  }
  // The stop signal in the log's clock: the UTC time of day.
  const double stop_of_day = std::fmod(absl::ToUnixMicros(absl::Now()) / 1e6, 86400.0);
  r.stop_of_day = stop_of_day;
  job.Stop();
  // The committed step: the largest step any trainer ended at.
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name.size() < 5 || name.substr(name.size() - 5) != ".json") continue;
      const std::string steps = JsonNumber(ReadText(dir + "/" + name), "steps");
      if (!steps.empty()) r.steps = std::max<int64_t>(r.steps, std::stoll(steps));
    }
    ::closedir(d);
  }
  // Steps dropped: distinct (step, generation) over every trainer's log.
  std::set<std::string> dropped;
  const std::string logs = job.AgentLogs();
  const std::regex drop(R"(step ([0-9]+) dropped in generation ([0-9]+))");
  for (auto it = std::sregex_iterator(logs.begin(), logs.end(), drop); it != std::sregex_iterator(); ++it) {
    dropped.insert((*it)[1].str() + "/" + (*it)[2].str());
  }
  r.dropped = static_cast<int>(dropped.size());
  const auto [first, full] = WorldTimeline(ReadText(dir + "/coordinator.log"), stop_of_day,
                                           absl::GetFlag(FLAGS_world));
  double seconds = stop_of_day - first;
  if (seconds < 0) seconds += 86400;
  r.seconds = seconds;
  r.full_pct = full;
  return r;
}

int CountOf(const std::string& text, const std::string& pattern) {
  const std::regex re(pattern);
  return static_cast<int>(
      std::distance(std::sregex_iterator(text.begin(), text.end(), re), std::sregex_iterator()));
}

// The lines of `log` stamped before `stop` (seconds of the day): the stop
// itself ends every session.
std::string BeforeStop(const std::string& log, double stop) {
  const std::regex stamp(R"(^. ([0-9]{2}:[0-9]{2}:[0-9.]+) )");
  std::istringstream in(log);
  std::string line, out;
  std::smatch m;
  while (std::getline(in, line)) {
    if (std::regex_search(line, m, stamp) && LogTime(m[1]) >= stop) continue;
    out += line + "\n";
  }
  return out;
}

// --false-alarms: the failure-free job, and everything its logs say was
// done to a member before it was told to stop.
int RunFalseAlarms(double minutes) {
  std::mt19937_64 rng(absl::GetFlag(FLAGS_seed));
  const std::string dir = absl::StrCat("/tmp/muster-bench-false-alarms-", ::getpid());
  const Run run = RunJob(dir, minutes, 0, rng);
  const std::string coordinator = BeforeStop(ReadText(dir + "/coordinator.log"), run.stop_of_day);
  std::string agents;
  for (int n = 0; n < absl::GetFlag(FLAGS_nodes); ++n) {
    agents += BeforeStop(ReadText(absl::StrCat(dir, "/agent", n, "-", n + 1, ".log")),
                         run.stop_of_day);
  }
  const int checkpoints = CountOf(coordinator, "\\] checkpoint: checkpoint [^ ]+ committed");
  const int failed = CountOf(coordinator, "\\] fail: ");
  const int fenced = CountOf(coordinator, "\\] fail: [^\\n]*hung");
  const int broken = CountOf(coordinator, "\\] broken: ");
  const int detached = CountOf(agents, "stopped for [^\\n]*detaching it");
  const int ended = CountOf(agents, "held stopped for|the coordinator fenced trainer");
  // Generations after the first full world (a node that came first may
  // have started one of its own).
  int regroups = -1;
  const std::regex regroup("regroup: generation [0-9]+: ([0-9]+) members");
  for (auto it = std::sregex_iterator(coordinator.begin(), coordinator.end(), regroup);
       it != std::sregex_iterator(); ++it) {
    if (regroups >= 0) ++regroups;
    else if (std::stoi((*it)[1]) == absl::GetFlag(FLAGS_world)) regroups = 0;
  }
  regroups = std::max(regroups, 0);
  std::cout << absl::StrFormat(
                   "false_alarms minutes=%g world=%d nodes=%d spares=%d steps=%lld "
                   "checkpoints=%d failed=%d fenced=%d broken=%d detached=%d ended=%d regroups=%d",
                   minutes, absl::GetFlag(FLAGS_world), absl::GetFlag(FLAGS_nodes),
                   absl::GetFlag(FLAGS_spares), static_cast<long long>(run.steps), checkpoints,
                   failed, fenced, broken, detached, ended, regroups)
            << std::endl;
  if (std::getenv("MUSTER_BENCH_KEEP") == nullptr) std::system(("rm -rf " + dir).c_str());
  return failed + broken + detached + ended + regroups == 0 && run.steps > 0 ? 0 : 1;
}

}  // namespace

int RunEttrBench() {
  if (absl::GetFlag(FLAGS_false_alarms)) {
    if (!(absl::GetFlag(FLAGS_minutes) > 0)) {
      std::cerr << "muster-bench ettr: --minutes must be positive\n";
      return 2;
    }
    return RunFalseAlarms(absl::GetFlag(FLAGS_minutes));
  }
  const double minutes = absl::GetFlag(FLAGS_minutes), mtbf = absl::GetFlag(FLAGS_mtbf);
  if (!(minutes > 0) || !(mtbf > 0) || absl::GetFlag(FLAGS_world) % absl::GetFlag(FLAGS_nodes) != 0) {
    std::cerr << "muster-bench ettr: --minutes and --mtbf must be positive, --world a multiple "
                 "of --nodes\n";
    return 2;
  }
  std::mt19937_64 rng(absl::GetFlag(FLAGS_seed));
  const std::string base = absl::StrCat("/tmp/muster-bench-ettr-", ::getpid());
  const Run reference = RunJob(base + "-reference", std::min(minutes, 5.0), 0, rng);
  const Run storm = RunJob(base + "-storm", minutes, mtbf, rng);
  if (reference.steps == 0 || reference.seconds <= 0 || storm.seconds <= 0) {
    std::cerr << "muster-bench ettr: a run made no progress; see " << base << "-*\n";
    return 1;
  }
  const double ettr = (storm.steps / storm.seconds) / (reference.steps / reference.seconds);
  std::cout << absl::StrFormat(
                   "ettr mtbf_s=%g minutes=%g world=%d nodes=%d spares=%d failures=%d ettr=%.3f "
                   "steps_committed_pct=%.2f world_full_pct=%.1f lost_steps=%d",
                   mtbf, minutes, absl::GetFlag(FLAGS_world), absl::GetFlag(FLAGS_nodes),
                   absl::GetFlag(FLAGS_spares), storm.failures, ettr,
                   100.0 * storm.steps / std::max<int64_t>(1, storm.steps + storm.dropped),
                   storm.full_pct, storm.dropped)
            << std::endl;
  std::cerr << absl::StrFormat("reference: %lld steps in %.1f s; storm: %lld steps in %.1f s\n",
                               static_cast<long long>(reference.steps), reference.seconds,
                               static_cast<long long>(storm.steps), storm.seconds);
  if (std::getenv("MUSTER_BENCH_KEEP") == nullptr) {
    std::system(("rm -rf " + base + "-reference " + base + "-storm").c_str());
  }
  return 0;
}

}  // namespace muster
