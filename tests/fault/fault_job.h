// FaultJob: one real training job on this machine for muster-fault — a
// coordinator (SQLite state dir, restartable on the same port), one
// muster-agent per node with its trainers, all on loopback or, with network
// namespaces, as hosts on a bridge — and what a scenario needs to hurt it
// and to judge the outcome.
//
// Node 0's trainer 0 is rank 0 (node names sort first); it logs every step to
// metrics.jsonl with its time, world size and generation, so scenarios hurt
// other trainers when they want figures. Not thread-safe.
#ifndef MUSTER_TESTS_FAULT_FAULT_JOB_H_
#define MUSTER_TESTS_FAULT_FAULT_JOB_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "tests/integration/subprocess.h"

namespace muster {

struct FaultJobOptions {
  int nodes = 2;
  int per_node = 2;
  int64_t steps = 600;
  int min_members = 2;
  int checkpoint_every = 40;
  std::string checkpoint_dir;            // default <dir>/ckpt
  std::vector<std::string> netns;        // per node: run its agent in this namespace
  std::vector<std::string> addresses;    // per node: --address of its trainers
  std::string coordinator_host = "127.0.0.1";
  // Where the coordinator and the standby run: a network namespace each
  // ("": this one), the standby at `standby_host` ("": coordinator_host).
  std::string coordinator_netns, standby_netns, standby_host;
  // Non-empty: a muster-relay at this address, in `relay_netns`, carries
  // the agents' and trainers' calls; they list it first and the
  // coordinator after it (docs/relay.md).
  std::string relay_host, relay_netns;
  std::vector<std::string> extra_train_flags;
  std::vector<std::string> extra_coordinator_flags;  // after the defaults: they win
  std::vector<std::string> extra_agent_flags;        // likewise, muster-agent's
  int spares = 0;  // muster-agent --spares on node 0 (the world is then exactly nodes x per_node)
  // A second coordinator on the same state dir (a standby, docs/failover.md);
  // every client then finds the coordinator through the address file.
  bool standby = false;
  // > 0: the coordinator runs under `prlimit --nofile=N:N`.
  int coordinator_nofile = 0;
  // Non-empty: the job token, written to <dir>/token (0600) and given to
  // every process of the job, and the CLI, through MUSTER_TOKEN_FILE (set in
  // this process while the job lives).
  std::string token;
};


struct CheckpointCheck {
  int committed = 0;
  std::vector<int64_t> bad_steps;  // committed checkpoints that do not verify
};

class FaultJob {
 public:
  FaultJob(std::string dir, FaultJobOptions options);
  ~FaultJob();  // kills whatever is left

  void StartCoordinator();
  void KillCoordinator();  // SIGKILL
  pid_t coordinator() const { return coordinator_; }
  // With options.standby: the standby's pid and address, and the address
  // file's content ("" before the first coordinator wrote it).
  pid_t standby() const { return standby_; }
  const std::string& standby_target() const { return standby_target_; }
  std::string AddressFileText() const;
  // Waits for coordinator process `pid` (the first or the standby) to
  // exit: its exit code (128 + signal; -1 when it did not exit in time).
  int WaitCoordinator(pid_t pid, absl::Duration timeout);
  void StartAgent(int node);
  void StartAll();

  const std::string& dir() const { return dir_; }
  const std::string& checkpoint_dir() const { return options_.checkpoint_dir; }
  pid_t agent(int node) const { return agents_[node]; }
  // The pid the node's agent last reported for `slot` (-1 if none yet).
  pid_t TrainerPid(int node, int slot) const;
  const std::string& target() const { return target_; }
  // Rank 0's steps so far.
  std::vector<StepRecord> Steps() const;
  int64_t LastStep() const;
  // Waits until rank 0 has completed `step`. False on timeout.
  bool WaitForStep(int64_t step, absl::Duration timeout) const;
  // Waits until rank 0 has completed a step in a world of `size`.
  bool WaitForWorld(int size, absl::Duration timeout) const;
  // Waits for every started agent while the job makes progress: an agent
  // still running once rank 0 has completed no step for `stall` (checked
  // each second) is killed and counted. A slower host (Debian's LibTorch
  // trains the scenarios' MLP about four times slower than PyPI's) only
  // takes longer. Returns how many did not exit 0, not counting `allowed`
  // (nodes whose agent the scenario killed).
  int WaitAgents(absl::Duration stall, const std::vector<int>& allowed = {});
  // `muster checkpoints --verify` against the coordinator.
  CheckpointCheck VerifyCheckpoints() const;
  // The newest committed checkpoint's step and files (-1 if none).
  int64_t NewestCommitted(std::vector<std::string>* files) const;
  // True when every trainer of nodes 0..last_node (-1: all) that finished
  // wrote the same parameter checksum and at least `expected` of them did.
  bool ParamsEqual(int expected, int last_node = -1) const;
  // The steps rank 0 (node 0, slot 0) dropped, from its summary.
  int DroppedSteps() const;
  // Waits for node `n`'s agent; its exit code (128 + signal if killed).
  int WaitAgent(int n);
  // Everything the job logged: coordinator and agents (with their trainers).
  std::string Logs() const;
  // Runs the muster CLI with `args`; returns its exit code, output in `out`.
  int Cli(const std::string& args, std::string* out) const;

 private:
  std::string dir_;
  FaultJobOptions options_;
  std::string target_;
  // What clients are given: target_, or file:<address file>.
  std::string client_target_;
  std::string standby_target_;
  pid_t coordinator_ = -1;
  pid_t standby_ = -1;
  pid_t relay_ = -1;
  int relay_port_ = 0;  // with options.relay_host
  // What agents and trainers are given: the relay first, where there is one.
  std::string member_target_;
  std::vector<pid_t> agents_;
  std::vector<bool> agent_done_;
};

// How long rank 0's training stalled around `fault_time`: the longest wait
// for a step completion after it (from the fault, or from the previous step
// if that came later). 0 if no step completed after the fault.
double StallAfter(const std::vector<StepRecord>& steps, double fault_time);
// Steps done twice or dropped because of the fault: `dropped` (the steps
// rank 0 dropped: the one in flight at a failure, unless it was salvaged)
// plus completed steps the job went back over.
int LostSteps(const std::vector<StepRecord>& steps, double fault_time, int dropped);

// Now, as Unix seconds (the clock of metrics.jsonl).
double UnixNow();

}  // namespace muster

#endif  // MUSTER_TESTS_FAULT_FAULT_JOB_H_
