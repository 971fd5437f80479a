// muster-fault SCENARIO --trials N [--seed S]: runs a real job (coordinator,
// two muster-agents with two trainers each) per trial, injects the fault at a
// random moment drawn from a seeded generator, waits for the job to end and
// checks the invariants:
//   - the job finishes: every agent exits 0;
//   - all trainers that finished hold bit-identical parameters;
//   - every committed checkpoint verifies (`muster checkpoints --verify`),
//     except one the scenario damaged on purpose;
//   - the logs explain what happened (a line naming the fault's effect).
// Prints one line per scenario:
//   fault scenario=.. trials=N survived=K recovered_p50_s=.. recovered_max_s=..
//   lost_steps_max=.. committed_ckpt_lost=..
// recovered: how long rank 0's training stalled after the fault (the longest
// wait for a step from the fault on). Scenarios: kill-trainer, kill-node,
// salvage (kill-trainer that must lose no step), spare (the same with a spare
// trainer: the world never shrinks), hang-trainer, kill-coordinator, failover (the coordinator's
// node hangs; a standby takes over), kill-during-checkpoint, corrupt-checkpoint,
// disk-full, churn; the network's faults in a muster-lab lab (partition,
// flap, isolate-peers, one-way, cut-coordinator, loss-2, loss-10: see
// Networked and docs/fault-injection.md); and two faults only the trainers
// see: cut-link (one TCP connection between two trainers destroyed),
// hang-compute (one trainer's training thread frozen while its session
// thread lives) and failover-stale (the old coordinator's words reach
// trainers after a takeover); fd-flood (idle connections exhaust the
// coordinator's file descriptors); "all" runs each.
#include <signal.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/flag_names.h"
#include "tests/bench/process_stats.h"
#include "tests/bench/trainer_faults.h"
#include "tests/fault/fault_job.h"
#include "tests/fault/net_lab.h"

ABSL_FLAG(int, trials, 2, "trials per scenario");
ABSL_FLAG(uint64_t, seed, 1, "seed of the random fault moments and victims");
ABSL_FLAG(double, collective_timeout, 0,
          "the trainers' --collective-timeout (0: theirs, which follows the job)");
ABSL_FLAG(std::string, device, "cpu",
          "hang-compute: cpu, or cuda: two nodes of one trainer each on GPU 0, synthetic data, "
          "--backend hier (one GPU holds one rank of an NCCL communicator, so the nodes meet "
          "over Gloo)");
ABSL_FLAG(double, stopped_limit, -1,
          "hang-compute: the agents' --stopped-limit in seconds (-1: theirs; 0: off, so the "
          "frozen trainer is left to its peers' collective deadline)");
ABSL_FLAG(std::string, dir, "/tmp", "where trial directories go (kept when a trial fails, or always with MUSTER_KEEP set)");

namespace muster {
namespace {

constexpr int kSkipped = 77;

struct Trial {
  bool survived = false;
  double recovered_s = 0;
  int lost_steps = 0;
  int committed_lost = 0;
  std::string problem;  // why it did not survive
  double takeover_s = -1;  // failover: from the fault to the standby serving
  bool holder_killed = false;  // failover: the frozen holder had to be killed
  double served_s = -1;  // fd-flood: from the flood's end to the first served call
  double around_s = -1;  // cut-relay: from the cut to every agent's session on the next address
};

// kill(2) for a trainer's pid read from its agent's log. A pid the log did
// not name (-1) is never signalled: kill(-1, sig) reaches every process
// this one may signal.
bool SignalPid(pid_t pid, int sig) { return pid > 0 && ::kill(pid, sig) == 0; }

// A scenario this host cannot run: says why on one line, and is counted
// as skipped, not as survived or failed.
Trial Skipped(const std::string& scenario, const std::string& why) {
  std::cerr << "muster-fault: " << scenario << " skipped: " << why << "\n";
  return {false, 0, 0, 0, "skipped"};
}

Trial NoPid(int node, int slot) {
  return {false, 0, 0, 0, absl::StrCat("agent", node, ".log names no live trainer ", slot)};
}

struct Context {
  int index;
  std::mt19937_64* rng;
  std::string dir;
  int Uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(*rng); }
};

// After the fault: waits for the job and judges it.
struct Judge {
  double fault_time = 0;
  int expected_trainers = 4;
  int nodes_to_compare = -1;  // -1: all
  std::string explained_by;   // regex over the job's logs ("" = nothing needed)
  std::set<int64_t> damaged;  // checkpoints hurt on purpose
  std::vector<int> killed_agents;  // nodes whose agent the scenario killed
  int max_lost_steps = -1;         // >= 0: more lost steps is a failure
  std::string forbidden;           // regex over the logs that must not match ("": none)
};

Trial Finish(FaultJob& job, const Judge& j) {
  Trial t;
  const int failed = job.WaitAgents(absl::Seconds(240), j.killed_agents);
  const CheckpointCheck check = job.VerifyCheckpoints();
  for (int64_t step : check.bad_steps) {
    if (j.damaged.count(step) == 0) ++t.committed_lost;
  }
  const auto steps = job.Steps();
  t.recovered_s = StallAfter(steps, j.fault_time);
  t.lost_steps = LostSteps(steps, j.fault_time, job.DroppedSteps());
  const std::string logs = job.Logs();
  if (failed > 0) t.problem = absl::StrCat(failed, " agents failed");
  else if (!job.ParamsEqual(j.expected_trainers, j.nodes_to_compare)) t.problem = "parameters differ";
  else if (t.committed_lost > 0) t.problem = absl::StrCat(t.committed_lost, " committed checkpoints do not verify");
  else if (check.committed == 0) t.problem = "no committed checkpoint";
  else if (j.max_lost_steps >= 0 && t.lost_steps > j.max_lost_steps) {
    t.problem = absl::StrCat(t.lost_steps, " steps lost (at most ", j.max_lost_steps, " allowed)");
  }
  else if (!j.explained_by.empty() && !std::regex_search(logs, std::regex(j.explained_by))) {
    t.problem = "the logs do not explain the fault (no /" + j.explained_by + "/)";
  }
  else if (!j.forbidden.empty() && std::regex_search(logs, std::regex(j.forbidden))) {
    t.problem = "the logs show what this fault must not cause (/" + j.forbidden + "/)";
  }
  t.survived = t.problem.empty();
  return t;
}

// The trainers' flags every scenario adds.
std::vector<std::string> TrainFlags() {
  const double t = absl::GetFlag(FLAGS_collective_timeout);
  if (t <= 0) return {};
  return {absl::StrCat("--collective-timeout=", t)};
}

// A random trainer other than rank 0 (node 0, slot 0).
std::pair<int, int> Victim(Context& c) {
  const int i = c.Uniform(1, 3);
  return {i / 2, i % 2};
}

// Waits until some trainer writes the checkpoint after `after_step` (its
// temporary file exists). False if none is seen in time.
bool WaitForCheckpointWrite(const FaultJob& job, int64_t after_step, int every) {
  const absl::Time end = absl::Now() + absl::Seconds(60);
  const int64_t first = (after_step / every + 1) * every;
  while (absl::Now() < end) {
    const int64_t step = std::max(first, (job.LastStep() / every) * every);
    for (int64_t s = step; s <= step + every; s += every) {
      for (const char* f : {"model", "optimizer"}) {
        const std::string tmp =
            absl::StrCat(job.checkpoint_dir(), "/step-", s, "/", f, ".safetensors.tmp");
        if (::access(tmp.c_str(), F_OK) == 0) return true;
      }
    }
  }
  return false;
}

// A trainer of the world (not rank 0) SIGKILLed in the middle of training;
// its agent restarts it. `zero_lost`: the step in flight must be salvaged
// (no step lost). With `spares`, a spare must take its place at once: rank
// 0 never trains in a smaller world.
Trial KillTrainer(Context& c, bool zero_lost, int spares) {
  FaultJobOptions o;
  o.spares = spares;
  FaultJob job(c.dir, o);
  job.StartAll();
  if (!job.WaitForStep(c.Uniform(40, 160), absl::Seconds(120))) return {false, 0, 0, 0, "no progress"};
  std::pair<int, int> victim = Victim(c);
  if (spares > 0) {  // which trainers are spares depends on who joined first
    const std::vector<std::pair<int, int>> members = WorldMembers(job.target());
    if (members.empty()) return {false, 0, 0, 0, "no world in muster status"};
    victim = members[c.Uniform(0, static_cast<int>(members.size()) - 1)];
  }
  const auto [node, slot] = victim;
  Judge j;
  j.fault_time = UnixNow();
  if (!SignalPid(job.TrainerPid(node, slot), SIGKILL)) return NoPid(node, slot);
  // A kill inside a step is salvaged; one that lands between steps (the
  // boundary's collectives) is a member's failure, with no step in flight.
  const std::string failed = absl::StrCat("member node", node, "/", slot, " failed");
  j.explained_by = zero_lost ? "step [0-9]+ salvaged in generation|" + failed : failed;
  if (zero_lost) j.max_lost_steps = 0;
  Trial t = Finish(job, j);
  if (t.survived && spares > 0) {
    for (const StepRecord& r : job.Steps()) {
      if (r.time > j.fault_time && r.world < 4) {
        t.survived = false;
        t.problem = absl::StrCat("the world shrank to ", r.world, " at step ", r.step);
        break;
      }
    }
  }
  return t;
}

Trial KillNode(Context& c) {
  FaultJob job(c.dir, {});
  job.StartAll();
  if (!job.WaitForStep(c.Uniform(40, 160), absl::Seconds(120))) return {false, 0, 0, 0, "no progress"};
  Judge j;
  j.fault_time = UnixNow();
  ::kill(job.agent(1), SIGKILL);  // its trainers die with it (PDEATHSIG)
  j.expected_trainers = 2;
  j.nodes_to_compare = 1;
  j.explained_by = "member node1/[01] failed";
  j.killed_agents = {1};
  return Finish(job, j);
}

Trial HangTrainer(Context& c) {
  FaultJob job(c.dir, {});
  job.StartAll();
  if (!job.WaitForStep(c.Uniform(40, 160), absl::Seconds(120))) return {false, 0, 0, 0, "no progress"};
  const auto [node, slot] = Victim(c);
  const pid_t pid = job.TrainerPid(node, slot);
  Judge j;
  j.fault_time = UnixNow();
  if (!SignalPid(pid, SIGSTOP)) return NoPid(node, slot);
  // Past its agent's 1 s stopped limit and the 2 s heartbeat timeout.
  absl::SleepFor(absl::Milliseconds(c.Uniform(2500, 4000)));
  ::kill(pid, SIGCONT);
  j.explained_by = "rejoining as a new incarnation";
  return Finish(job, j);
}

Trial KillCoordinator(Context& c) {
  FaultJob job(c.dir, {});
  job.StartAll();
  const int64_t at = c.Uniform(40, 160);
  if (!job.WaitForStep(at, absl::Seconds(120))) return {false, 0, 0, 0, "no progress"};
  // Odd trials: while a checkpoint is being written.
  if (c.index % 2 == 1 && !WaitForCheckpointWrite(job, at, 40)) {
    return {false, 0, 0, 0, "no checkpoint write caught"};
  }
  Judge j;
  j.fault_time = UnixNow();
  job.KillCoordinator();
  absl::SleepFor(absl::Milliseconds(c.Uniform(200, 1500)));
  job.StartCoordinator();
  j.explained_by = "coordinator restarted";
  return Finish(job, j);
}

// The coordinator holding the lease is lost while a standby watches the
// same state dir: it hangs (SIGSTOP: no lease beats, no answers, its
// connections stay open), or, with `lab`, its namespace is cut off from
// everyone while it still reaches the state dir (a local disk here).
// `while_lost` runs then (a problem it returns ends the trial). Once the
// standby serves, the old holder is woken or its link healed after
// `wake_ms`, and it must stand down (exit 4).
Trial TakeOverFromALostHolder(Context& c, FaultJobOptions o, NetLab* lab,
                              const std::function<std::string(FaultJob&)>& while_lost,
                              std::pair<int, int> wake_ms) {
  o.standby = true;
  FaultJob job(c.dir, o);
  job.StartAll();
  const int64_t at = c.Uniform(40, 160);
  if (!job.WaitForStep(at, absl::Seconds(120))) return {false, 0, 0, 0, "no progress"};
  // Both started together: either may hold the lease.
  const bool first_holds = job.AddressFileText() == job.target() + "\n";
  const pid_t holder = first_holds ? job.coordinator() : job.standby();
  const std::string host = first_holds ? "coord" : "standby";
  const std::string next = (first_holds ? job.standby_target() : job.target()) + "\n";
  auto restore = [&] {
    if (lab != nullptr) {
      lab->Heal(host);
    } else {
      ::kill(holder, SIGCONT);
    }
  };
  Judge j;
  j.fault_time = UnixNow();
  if (lab != nullptr ? !lab->Cut(host) : ::kill(holder, SIGSTOP) != 0) {
    return {false, 0, 0, 0, "the holder could not be cut off: " + (lab ? lab->error() : "")};
  }
  if (std::string problem = while_lost(job); !problem.empty()) {
    restore();
    return {false, 0, 0, 0, std::move(problem)};
  }
  auto wait_takeover = [&](absl::Duration limit) {
    const absl::Time end = absl::Now() + limit;
    while (job.AddressFileText() != next && absl::Now() < end) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    return job.AddressFileText() == next;
  };
  // Frozen inside a write, the holder keeps SQLite's lock on the state file
  // and nobody can take the lease over while it lives (the standby says
  // "database is locked"): the node is then lost for good (SIGKILL), as a
  // hung node ends up rebooted, and its locks go with it. A holder cut off
  // is not frozen: it must let its lease lapse by itself.
  bool killed = false;
  if (!wait_takeover(absl::Seconds(10)) && lab == nullptr) {
    ::kill(holder, SIGKILL);
    killed = true;
  }
  if (!wait_takeover(absl::Seconds(lab != nullptr ? 0 : 20))) {
    restore();
    return {false, 0, 0, 0, "the standby did not take over"};
  }
  const double takeover = UnixNow() - j.fault_time;
  const bool took = lab == nullptr || lab->Verify(host);  // the link was down all along
  absl::SleepFor(absl::Milliseconds(c.Uniform(wake_ms.first, wake_ms.second)));
  restore();
  if (!took) return {false, 0, 0, 0, "the fault did not take effect: " + lab->error()};
  const int code = job.WaitCoordinator(holder, absl::Seconds(20));
  j.explained_by = killed ? "lease of [^ ]+: epoch 2, held by"
                          : "lease \\(epoch 1\\) was taken over: epoch 2";
  if (lab != nullptr) j.forbidden = "no heartbeat for";  // nobody failed for the holder's silence
  Trial t = Finish(job, j);
  t.takeover_s = takeover;
  t.holder_killed = killed;
  if (t.survived && !killed && code != 4) {
    t.survived = false;
    t.problem = absl::StrCat("the old coordinator exited ", code, ", not 4 (lease lost)");
  }
  if (t.survived && lab != nullptr && job.Logs().find("no member heard for") == std::string::npos) {
    t.survived = false;
    t.problem = "the cut holder never said that it heard no member";
  }
  return t;
}

// A job whose two nodes and coordinator are hosts of `lab` ("coord").
FaultJobOptions InLab(const NetLab& lab) {
  FaultJobOptions o;
  o.steps = 2000;
  o.netns = lab.namespaces();
  o.addresses = lab.addresses();
  o.coordinator_host = lab.HostAddress("coord");
  o.coordinator_netns = lab.HostNamespace("coord");
  o.extra_train_flags = TrainFlags();
  return o;
}

// The namespace of the coordinator holding the lease is cut from everyone
// (its links down) while a standby runs in a namespace of its own; the
// trainer nodes are namespaces too. Healed 0.5-2 s after the takeover.
Trial CutPrimary(Context& c) {
  NetLab lab(NetLabOptions{2, "", {"coord", "standby"}});
  if (!lab.ok()) return Skipped("cut-primary", lab.error());
  FaultJobOptions o = InLab(lab);
  o.standby_host = lab.HostAddress("standby");
  o.standby_netns = lab.HostNamespace("standby");
  return TakeOverFromALostHolder(c, o, &lab, [](FaultJob&) { return std::string(); },
                                 {500, 2000});
}

// The relay that carries every agent's and trainer's calls is cut off
// (its namespace's links down, 3-6 s, then up): the agents must go round it
// to the coordinator, the next address of their list, and no member may
// be failed for the relay's silence.
Trial CutRelay(Context& c) {
  NetLab lab(NetLabOptions{2, "", {"coord", "relay0"}});
  if (!lab.ok()) return Skipped("cut-relay", lab.error());
  FaultJobOptions o = InLab(lab);
  o.relay_host = lab.HostAddress("relay0");
  o.relay_netns = lab.HostNamespace("relay0");
  FaultJob job(c.dir, o);
  job.StartAll();
  if (!job.WaitForStep(c.Uniform(40, 160), absl::Seconds(120))) return {false, 0, 0, 0, "no progress"};
  // An agent is round the relay once it said it went to the coordinator
  // and opened its node session again after that.
  const std::string coordinator = "coordinator now at " + job.target();
  const std::string open = "node session open";
  auto log = [&](int a) { return ReadText(absl::StrCat(job.dir(), "/agent", a, ".log")); };
  auto moved = [&] {
    int n = 0;
    for (int a = 0; a < 2; ++a) {
      const std::string text = log(a);
      const size_t at = text.find(coordinator);
      n += at != std::string::npos && text.find(open, at) != std::string::npos;
    }
    return n;
  };
  if (moved() != 0) return {false, 0, 0, 0, "an agent went to the coordinator before the cut"};
  Judge j;
  j.fault_time = UnixNow();
  if (!lab.Cut("relay0")) return {false, 0, 0, 0, "the relay could not be cut: " + lab.error()};
  const absl::Time end = absl::Now() + absl::Seconds(20);
  while (moved() < 2 && absl::Now() < end) absl::SleepFor(absl::Milliseconds(5));
  const double around = UnixNow() - j.fault_time;
  absl::SleepFor(absl::Milliseconds(c.Uniform(1000, 4000)));
  const bool took = lab.Verify("relay0");
  lab.Heal("relay0");
  if (!took) return {false, 0, 0, 0, "the fault did not take effect: " + lab.error()};
  if (moved() < 2) return {false, 0, 0, 0, "the agents did not go round the cut relay in 20 s"};
  j.forbidden = "fail: node";  // no member failed
  j.max_lost_steps = 0;
  Trial t = Finish(job, j);
  t.around_s = around;
  return t;
}

// The coordinator's node hangs at a random step and comes back 0.5–2 s
// after the standby took over.
Trial Failover(Context& c) {
  return TakeOverFromALostHolder(c, {}, nullptr, [](FaultJob&) { return std::string(); },
                                 {500, 2000});
}

// The woken old holder's words reach trainers after the standby took over.
// Heartbeats every second here, so the agents hold their streams to the
// frozen holder for four seconds (three periods and a second), past the 2 s
// lease; min_members is the whole world, and a trainer of node 1 is killed
// while the holder is frozen: woken right after the takeover, the holder
// finds that member gone and would pause the job for the trainers still
// connected to it, while the standby runs their world with every member.
Trial FailoverStale(Context& c) {
  FaultJobOptions o;
  o.min_members = 4;
  o.extra_coordinator_flags = {"--heartbeat-interval=1s", "--heartbeat-timeout=5s"};
  o.extra_train_flags = TrainFlags();
  return TakeOverFromALostHolder(
      c, o, nullptr,
      [&c](FaultJob& job) {
        const int slot = c.Uniform(0, 1);
        return SignalPid(job.TrainerPid(1, slot), SIGKILL) ? std::string()
                                                           : NoPid(1, slot).problem;
      },
      {0, 300});
}

Trial KillDuringCheckpoint(Context& c) {
  FaultJob job(c.dir, {});
  job.StartAll();
  const int64_t at = c.Uniform(40, 160);
  if (!job.WaitForStep(at, absl::Seconds(120))) return {false, 0, 0, 0, "no progress"};
  const auto [node, slot] = Victim(c);
  const pid_t pid = job.TrainerPid(node, slot);
  if (!WaitForCheckpointWrite(job, at, 40)) return {false, 0, 0, 0, "no checkpoint write caught"};
  Judge j;
  j.fault_time = UnixNow();
  if (!SignalPid(pid, SIGKILL)) return NoPid(node, slot);
  j.explained_by = absl::StrCat("member node", node, "/", slot, " failed");
  return Finish(job, j);
}

Trial CorruptCheckpoint(Context& c) {
  FaultJob job(c.dir, {});
  job.StartAll();
  if (!job.WaitForStep(c.Uniform(130, 200), absl::Seconds(120))) return {false, 0, 0, 0, "no progress"};
  // Freeze the job, damage its newest committed checkpoint, kill every
  // trainer: the agents restart them and they must fall back to the
  // previous checkpoint.
  std::vector<pid_t> pids;
  for (int n = 0; n < 2; ++n) {
    for (int s = 0; s < 2; ++s) {
      pids.push_back(job.TrainerPid(n, s));
      if (pids.back() <= 0) return NoPid(n, s);  // kill(-1, ...) below would reach all
    }
  }
  for (pid_t p : pids) ::kill(p, SIGSTOP);
  std::vector<std::string> files;
  const int64_t step = job.NewestCommitted(&files);
  if (step < 0) return {false, 0, 0, 0, "no committed checkpoint to damage"};
  Judge j;
  j.damaged.insert(step);
  switch (c.index % 3) {
    case 0: {  // flip bytes in the middle of the model
      FILE* f = std::fopen(files[0].c_str(), "r+b");
      std::fseek(f, 0, SEEK_END);
      const long size = std::ftell(f);
      std::fseek(f, size / 2, SEEK_SET);
      const char junk[8] = {'\x5a', '\x5a', '\x5a', '\x5a', '\x5a', '\x5a', '\x5a', '\x5a'};
      std::fwrite(junk, 1, sizeof(junk), f);
      std::fclose(f);
      break;
    }
    case 1:  // truncate the model
      ::truncate(files[0].c_str(), 1000);
      break;
    default:  // delete a shard
      ::unlink(files[1].c_str());
  }
  j.fault_time = UnixNow();
  for (pid_t p : pids) ::kill(p, SIGKILL);
  j.explained_by = absl::StrCat("checkpoint of step ", step, " is unusable");
  return Finish(job, j);
}

Trial DiskFull(Context& c) {
  // A 12 MB tmpfs holds two of this job's 5.4 MB checkpoints.
  const std::string mnt = c.dir + "-ckpt";
  std::system(("mkdir -p " + mnt).c_str());
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=12m") != 0) {
    return Skipped("disk-full", absl::StrCat("cannot mount a tmpfs (", std::strerror(errno),
                                             "); it needs root"));
  }
  Trial t;
  {
    FaultJobOptions o;
    o.checkpoint_dir = mnt;
    o.checkpoint_every = c.Uniform(20, 40);
    FaultJob job(c.dir, o);
    job.StartAll();
    Judge j;
    // The disk fills at the third checkpoint.
    if (!job.WaitForStep(3 * o.checkpoint_every, absl::Seconds(120))) {
      t.problem = "no progress";
    } else {
      j.fault_time = UnixNow();
      j.explained_by = "checkpoint of step [0-9]+ failed";
      t = Finish(job, j);
    }
  }
  ::umount2(mnt.c_str(), MNT_DETACH);
  return t;
}

Trial Churn(Context& c) {
  FaultJobOptions o;
  o.nodes = 3;
  o.steps = 900;
  FaultJob job(c.dir, o);
  job.StartCoordinator();
  job.StartAgent(0);
  job.StartAgent(1);
  if (!job.WaitForStep(c.Uniform(40, 100), absl::Seconds(120))) return {false, 0, 0, 0, "no progress"};
  Judge j;
  j.fault_time = UnixNow();
  // Node 2 joins and leaves (SIGTERM to its agent) twice.
  for (int round = 0; round < 2; ++round) {
    job.StartAgent(2);
    if (!job.WaitForWorld(6, absl::Seconds(60))) return {false, 0, 0, 0, "node2 did not join"};
    if (!job.WaitForStep(job.LastStep() + c.Uniform(30, 90), absl::Seconds(120))) break;
    ::kill(job.agent(2), SIGTERM);
    if (job.WaitAgent(2) != 0) return {false, 0, 0, 0, "a leaving agent failed"};
    job.WaitForStep(job.LastStep() + 40, absl::Seconds(60));
  }
  j.nodes_to_compare = 1;
  j.explained_by = "member node2/[01] left, at step boundary";
  return Finish(job, j);
}

// The network's own faults, in a muster-lab lab: each node a network
// namespace on a bridge, the coordinator in this namespace at the bridge's
// address. Node 1 is the victim; every fault is checked to have taken
// effect (a link down, an nft rule that matched) before the job is judged.
enum class NetFault {
  kPartition,    // node 1's links down past the heartbeat timeout, then up
  kFlap,         // node 1's links down 2 s, then up
  kIsolatePeers, // node 1 and node 0 drop each other's packets; both reach the coordinator
  kOneWay,       // node 1's packets to node 0 dropped; the other way works
  kCoordinator,  // node 1 cannot reach the coordinator; its peers it can
  kLoss2,        // 2% of node 1's packets lost each way
  kLoss10,       // 10%
};

Trial Networked(Context& c, NetFault fault, const std::string& name) {
  NetLab lab(2);
  if (!lab.ok()) return Skipped(name, lab.error());
  FaultJobOptions o;
  // The job must outlast the fault, and with a lost link the hold too, so
  // that the node left out has a world to rejoin.
  const bool held = fault == NetFault::kIsolatePeers || fault == NetFault::kOneWay;
  o.steps = held ? 4000 : 2000;
  o.netns = lab.namespaces();
  o.addresses = lab.addresses();
  o.coordinator_host = lab.bridge_address();
  o.extra_train_flags = TrainFlags();
  FaultJob job(c.dir, o);
  job.StartAll();
  if (!job.WaitForStep(c.Uniform(40, 160), absl::Seconds(120))) return {false, 0, 0, 0, "no progress"};
  Judge j;
  j.fault_time = UnixNow();
  bool put = false;
  // Past the collective deadline (10 s early in a job) and the probe: the
  // world must leave a node out while the fault lasts.
  absl::Duration length = absl::Seconds(c.Uniform(14, 18));
  switch (fault) {
    case NetFault::kPartition:
      put = lab.Cut(1);
      length = absl::Milliseconds(c.Uniform(3000, 4500));  // past the heartbeat timeout
      j.explained_by = "rejoining as a new incarnation";
      break;
    case NetFault::kFlap:
      put = lab.Cut(1);
      length = absl::Seconds(2);
      break;
    case NetFault::kIsolatePeers:
      put = lab.Isolate(1, {0});
      j.explained_by = "partition: node node[01] left out";
      j.max_lost_steps = 0;
      break;
    case NetFault::kOneWay:
      put = lab.DropTo(1, {0});
      j.explained_by = "partition: node node[01] left out";
      j.max_lost_steps = 0;
      break;
    case NetFault::kCoordinator:
      put = lab.IsolateFromGateway(1);
      length = absl::Milliseconds(c.Uniform(3000, 4500));  // past the heartbeat timeout
      j.explained_by = "fail: node1/[01]";
      break;
    case NetFault::kLoss2:
      put = lab.Loss(1, 2);
      length = absl::Seconds(10);
      j.forbidden = "reports that generation [0-9]+ broke|fail: node";
      break;
    case NetFault::kLoss10:
      put = lab.Loss(1, 10);
      length = absl::Seconds(10);
      break;
  }
  if (!put) return {false, 0, 0, 0, "the fault was not put in place: " + lab.error()};
  absl::SleepFor(length);
  // Verified while in place: a rule that never matched injected nothing.
  const bool took = lab.Verify(1);
  lab.Heal(1);
  if (!took) return {false, 0, 0, 0, "the fault did not take effect: " + lab.error()};
  return Finish(job, j);
}

// One TCP connection between two trainers of different nodes is destroyed
// (ss -K: both ends get an error) while every session with the coordinator
// stays up. Only the two trainers see it; their report regroups the world.
Trial CutLink(Context& c) {
  if (::geteuid() != 0) {
    std::cerr << "muster-fault: cut-link needs root (ss -K: CAP_NET_ADMIN)\n";
    return {false, 0, 0, 0, "skipped"};
  }
  FaultJobOptions o;
  o.extra_train_flags = TrainFlags();
  FaultJob job(c.dir, o);
  job.StartAll();
  if (!job.WaitForStep(c.Uniform(40, 160), absl::Seconds(120))) return {false, 0, 0, 0, "no progress"};
  std::set<pid_t> trainers;
  for (int n = 0; n < 2; ++n) {
    for (int s = 0; s < 2; ++s) trainers.insert(job.TrainerPid(n, s));
  }
  const std::vector<TrainerLink> links = TrainerLinks(trainers);
  if (links.empty()) return {false, 0, 0, 0, "no TCP connection between trainers found"};
  const TrainerLink& cut = links[c.Uniform(0, static_cast<int>(links.size()) - 1)];
  Judge j;
  j.fault_time = UnixNow();
  if (!CutLink(cut)) return {false, 0, 0, 0, "ss -K failed on " + cut.local + " - " + cut.peer};
  j.explained_by = "reports that generation [0-9]+ broke";
  j.max_lost_steps = 0;  // the step in flight is salvaged
  return Finish(job, j);
}

// One trainer's training thread (its main thread) is frozen with ptrace
// while its other threads, the session's heartbeats among them, go on:
// nothing inside the trainer knows. Its agent reads that one of its threads
// is held stopped (a tracer's stop) and, past its stopped limit, ends it and
// restarts it; the others regroup as for a kill. (Were the agent not to look,
// the others' collective would pass its deadline, they would report, and the
// coordinator would fence the frozen one as hung.)
Trial HangCompute(Context& c) {
  FaultJobOptions o;
  o.extra_train_flags = TrainFlags();
  const bool cuda = absl::GetFlag(FLAGS_device) == "cuda";
  if (cuda) {
    o.per_node = 1;
    o.min_members = 1;
    o.steps = 3000;  // GPU steps are short; the job must outlast the fault
    for (const char* f :
         {"--device=cuda", "--backend=hier", "--dataset=synthetic", "--compute-ms=5"}) {
      o.extra_train_flags.push_back(f);
    }
  }
  if (const double limit = absl::GetFlag(FLAGS_stopped_limit); limit >= 0) {
    o.extra_agent_flags.push_back(absl::StrCat("--stopped-limit=", limit));
  }
  FaultJob job(c.dir, o);
  job.StartAll();
  if (!job.WaitForStep(c.Uniform(40, 160), absl::Seconds(120))) return {false, 0, 0, 0, "no progress"};
  const auto [node, slot] = cuda ? std::pair<int, int>{1, 0} : Victim(c);
  const pid_t pid = job.TrainerPid(node, slot);  // its main thread's id
  Judge j;
  j.fault_time = UnixNow();
  if (const std::string why = FreezeMainThread(pid); !why.empty()) {
    std::cerr << "muster-fault: hang-compute: " << why << "\n";
    return {false, 0, 0, 0, "skipped"};
  }
  const absl::Time end = absl::Now() + absl::Seconds(200);
  bool ended = false;
  while (!(ended = FrozenEnded(pid)) && absl::Now() < end) absl::SleepFor(absl::Milliseconds(20));
  if (!ended) {
    Thaw(pid);
    return {false, 0, 0, 0, "the frozen trainer was never ended"};
  }
  // Its agent sees the thread held stopped (muster-agent --stopped-limit);
  // with that off, the coordinator fences it at its peers' deadline.
  j.explained_by = absl::StrCat("node node", node, ": trainer ", slot,
                                " \\(pid [0-9]+\\) has a thread held stopped|fenced trainer node",
                                node, "/", slot, " .*as hung");
  if (cuda) j.expected_trainers = 2;
  return Finish(job, j);
}

// A client without the token opens 1,100 idle TCP connections to a
// coordinator whose hard limit is 1,024 open files, holds them 1–4 s and
// closes them (`held`: holds them until a client with the token is served).
// gRPC 1.51's listener fails accept4 with EMFILE and never polls its socket
// again; the coordinator must serve a client with the token again (timed
// from the flood's end, or `held`, from when its connections were all
// open), and the members' sessions, on connections opened before, must
// live through it: no member fails, training goes on.
Trial FdFlood(Context& c, bool held) {
  constexpr int kFlood = 1100;
  if (!AllowOpenFiles(kFlood + 200)) {
    return Skipped("fd-flood", absl::StrCat("cannot open ", kFlood, " files"));
  }
  FaultJobOptions o;
  o.coordinator_nofile = 1024;
  o.token = absl::StrCat("fd-flood-", c.index, "-", ::getpid());
  FaultJob job(c.dir, o);
  job.StartAll();
  if (!job.WaitForStep(c.Uniform(40, 160), absl::Seconds(120))) return {false, 0, 0, 0, "no progress"};
  const int port = std::stoi(job.target().substr(job.target().rfind(':') + 1));
  Judge j;
  j.fault_time = UnixNow();
  std::vector<int> flood;
  for (int i = 0; i < kFlood; ++i) {
    if (const int fd = ConnectLoopback(port); fd >= 0) flood.push_back(fd);
  }
  if (!held) {
    absl::SleepFor(absl::Milliseconds(c.Uniform(1000, 4000)));
    for (int fd : flood) ::close(fd);
  }
  const double ended = UnixNow();
  std::string out;
  const absl::Time limit = absl::Now() + absl::Seconds(60);
  while (job.Cli("status", &out) != 0 && absl::Now() < limit) absl::SleepFor(absl::Milliseconds(20));
  const double served = UnixNow() - ended;
  if (held) {
    for (int fd : flood) ::close(fd);
  }
  j.explained_by = "the listener on port [0-9]+ stopped accepting";
  Trial t = Finish(job, j);
  t.served_s = served;
  const std::string logs = job.Logs();
  if (flood.size() < kFlood) t.problem = absl::StrCat("only ", flood.size(), " connections opened");
  else if (served >= 60) t.problem = "not served within 60 s";
  else if (std::regex_search(logs, std::regex("member node[0-9]+/[0-9]+ failed"))) {
    t.problem = "a member failed during the flood";
  }
  t.survived = t.survived && t.problem.empty();
  return t;
}

const std::map<std::string, std::function<Trial(Context&)>>& Scenarios() {
  static const auto* s = new std::map<std::string, std::function<Trial(Context&)>>{
      {"kill-trainer", [](Context& c) { return KillTrainer(c, false, 0); }},
      {"salvage", [](Context& c) { return KillTrainer(c, true, 0); }},
      {"spare", [](Context& c) { return KillTrainer(c, true, 1); }},
      {"kill-node", KillNode},
      {"hang-trainer", HangTrainer},
      {"kill-coordinator", KillCoordinator},
      {"failover", Failover},
      {"kill-during-checkpoint", KillDuringCheckpoint},
      {"corrupt-checkpoint", CorruptCheckpoint},
      {"disk-full", DiskFull},
      {"partition", [](Context& c) { return Networked(c, NetFault::kPartition, "partition"); }},
      {"flap", [](Context& c) { return Networked(c, NetFault::kFlap, "flap"); }},
      {"isolate-peers",
       [](Context& c) { return Networked(c, NetFault::kIsolatePeers, "isolate-peers"); }},
      {"one-way", [](Context& c) { return Networked(c, NetFault::kOneWay, "one-way"); }},
      {"cut-coordinator",
       [](Context& c) { return Networked(c, NetFault::kCoordinator, "cut-coordinator"); }},
      {"loss-2", [](Context& c) { return Networked(c, NetFault::kLoss2, "loss-2"); }},
      {"loss-10", [](Context& c) { return Networked(c, NetFault::kLoss10, "loss-10"); }},
      {"churn", Churn},
      {"cut-link", CutLink},
      {"hang-compute", HangCompute},
      {"failover-stale", FailoverStale},
      {"cut-primary", CutPrimary},
      {"cut-relay", CutRelay},
      {"fd-flood", [](Context& c) { return FdFlood(c, false); }},
      {"fd-flood-held", [](Context& c) { return FdFlood(c, true); }},
  };
  return *s;
}

// A figure's median and maximum: " NAME_p50_s=.. NAME_max_s=..", or ""
// when no trial measured it. `values` is a copy: Percentile sorts it.
std::string Figures(const std::string& name, std::vector<double> values) {
  if (values.empty()) return "";
  const double max = *std::max_element(values.begin(), values.end());
  return absl::StrFormat(" %s_p50_s=%.3f %s_max_s=%.3f", name, Percentile(values, 50), name, max);
}

int RunScenario(const std::string& name, const std::function<Trial(Context&)>& run) {
  const int trials = absl::GetFlag(FLAGS_trials);
  std::mt19937_64 rng(absl::GetFlag(FLAGS_seed) * 1000003 + std::hash<std::string>()(name));
  std::vector<double> recovered;
  int survived = 0, lost_max = 0, ckpt_lost = 0, skipped = 0;
  std::vector<double> takeovers, served, around;
  for (int i = 0; i < trials; ++i) {
    Context c{i, &rng, absl::StrCat(absl::GetFlag(FLAGS_dir), "/muster-fault-", name, "-", ::getpid(), "-", i)};
    const Trial t = run(c);
    if (t.problem == "skipped") {
      ++skipped;
      break;
    }
    std::cerr << absl::StrFormat("muster-fault: %s trial %d: %s, recovered %.3f s, lost %d steps%s%s%s\n",
                                 name, i, t.survived ? "survived" : "FAILED: " + t.problem,
                                 t.recovered_s, t.lost_steps,
                                 t.around_s >= 0
                                     ? absl::StrFormat(", agents round the relay after %.3f s",
                                                       t.around_s)
                                     : "",
                                 t.served_s >= 0
                                     ? absl::StrFormat(", served again %.3f s after the flood",
                                                       t.served_s)
                                     : "",
                                 t.takeover_s >= 0
                                     ? absl::StrFormat(", standby serving after %.3f s%s",
                                                       t.takeover_s,
                                                       t.holder_killed
                                                           ? " (the frozen holder held the "
                                                             "state file's lock: killed)"
                                                           : "")
                                     : "");
    if (t.takeover_s >= 0) takeovers.push_back(t.takeover_s);
    if (t.served_s >= 0) served.push_back(t.served_s);
    if (t.around_s >= 0) around.push_back(t.around_s);
    ckpt_lost += t.committed_lost;
    if (!t.survived) continue;
    if (std::getenv("MUSTER_KEEP") == nullptr) std::system(("rm -rf " + c.dir).c_str());
    ++survived;
    recovered.push_back(t.recovered_s);
    lost_max = std::max(lost_max, t.lost_steps);
  }
  if (skipped > 0) {
    std::cout << "fault scenario=" << name << " skipped (see above)" << std::endl;
    return kSkipped;
  }
  std::vector<double> sorted = recovered;
  std::cout << absl::StrFormat(
                   "fault scenario=%s trials=%d survived=%d recovered_p50_s=%.3f "
                   "recovered_max_s=%.3f lost_steps_max=%d committed_ckpt_lost=%d",
                   name, trials, survived, recovered.empty() ? 0 : Percentile(recovered, 50),
                   sorted.empty() ? 0 : *std::max_element(sorted.begin(), sorted.end()), lost_max,
                   ckpt_lost)
            << Figures("takeover", takeovers) << Figures("served", served)
            << Figures("around", around)
            << std::endl;
  return survived == trials && ckpt_lost == 0 ? 0 : 1;
}

}  // namespace
}  // namespace muster

int main(int argc, char** argv) {
  muster::ListOwnFlagsInHelp();
  absl::SetProgramUsageMessage("muster-fault SCENARIO|all --trials N [--seed S]");
  muster::DashesToUnderscores(argc, argv);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  const std::string what = args.size() > 1 ? args[1] : "";
  const auto& scenarios = muster::Scenarios();
  const std::string device = absl::GetFlag(FLAGS_device);
  if (device != "cpu" && (device != "cuda" || what != "hang-compute")) {
    std::cerr << "muster-fault: --device " << device
              << ": cpu, or cuda with the scenario hang-compute\n";
    return 2;
  }
  if (absl::GetFlag(FLAGS_stopped_limit) >= 0 && what != "hang-compute") {
    std::cerr << "muster-fault: --stopped-limit applies to hang-compute only\n";
    return 2;
  }
  if (what == "all") {
    int rc = 0;
    for (const auto& [name, run] : scenarios) {
      const int r = muster::RunScenario(name, run);
      if (r != 0 && r != muster::kSkipped) rc = 1;
    }
    return rc;
  }
  auto it = scenarios.find(what);
  if (it == scenarios.end()) {
    std::cerr << "muster-fault: unknown scenario '" << what << "'; one of:";
    for (const auto& [name, run] : scenarios) std::cerr << " " << name;
    std::cerr << ", all\n";
    return 2;
  }
  return muster::RunScenario(it->first, it->second);
}
