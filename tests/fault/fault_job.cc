#include "tests/fault/fault_job.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "tests/bench/process_stats.h"
#include "tests/fault/net_lab.h"

namespace muster {
double UnixNow() { return absl::ToUnixMicros(absl::Now()) / 1e6; }

FaultJob::FaultJob(std::string dir, FaultJobOptions options)
    : dir_(std::move(dir)), options_(std::move(options)) {
  std::system(("rm -rf " + dir_ + " && mkdir -p " + dir_).c_str());
  if (options_.checkpoint_dir.empty()) options_.checkpoint_dir = dir_ + "/ckpt";
  target_ = absl::StrCat(options_.coordinator_host, ":", FreeLoopbackPort());
  client_target_ = options_.standby ? "file:" + dir_ + "/coordinator.address" : target_;
  if (options_.standby) {
    const std::string& host =
        options_.standby_host.empty() ? options_.coordinator_host : options_.standby_host;
    standby_target_ = absl::StrCat(host, ":", FreeLoopbackPort());
  }
  member_target_ = client_target_;
  if (!options_.relay_host.empty()) {
    relay_port_ = FreeLoopbackPort();
    member_target_ = absl::StrCat(options_.relay_host, ":", relay_port_, ",", client_target_);
  }
  agents_.assign(options_.nodes, -1);
  agent_done_.assign(options_.nodes, false);
  if (!options_.token.empty()) {
    const std::string path = dir_ + "/token";
    std::ofstream(path) << options_.token << "\n";
    ::chmod(path.c_str(), 0600);
    ::setenv("MUSTER_TOKEN_FILE", path.c_str(), /*overwrite=*/1);
  }
}

FaultJob::~FaultJob() {
  for (size_t n = 0; n < agents_.size(); ++n) {
    if (agents_[n] > 0 && !agent_done_[n]) {
      ::kill(agents_[n], SIGKILL);
      ::waitpid(agents_[n], nullptr, 0);
    }
  }
  if (relay_ > 0) StopProcess(relay_);
  if (coordinator_ > 0) StopProcess(coordinator_);
  if (standby_ > 0) StopProcess(standby_);
  if (!options_.token.empty()) ::unsetenv("MUSTER_TOKEN_FILE");
}

int FaultJob::WaitCoordinator(pid_t pid, absl::Duration timeout) {
  int status = 0;
  pid_t got = 0;
  const absl::Time end = absl::Now() + timeout;
  while ((got = ::waitpid(pid, &status, WNOHANG)) == 0 && absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  if (got != pid) return -1;
  if (pid == coordinator_) coordinator_ = -1;
  if (pid == standby_) standby_ = -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string FaultJob::AddressFileText() const {
  return ReadText(dir_ + "/coordinator.address");
}

void FaultJob::StartCoordinator() {
  auto spawn = [this](const std::string& target, const std::string& netns,
                      const std::string& log) {
    const std::string port = target.substr(target.rfind(':') + 1);
    const std::string listen =
        options_.coordinator_host == "127.0.0.1" ? target : "0.0.0.0:" + port;
    std::vector<std::string> argv = InNetns(netns);
    if (options_.coordinator_nofile > 0) {
      argv.insert(argv.end(), {"/usr/bin/prlimit", absl::StrCat("--nofile=",
                                                                 options_.coordinator_nofile, ":",
                                                                 options_.coordinator_nofile)});
    }
    argv.insert(argv.end(), {
        SelfDir() + "/muster-coordinator", "--listen=" + listen, "--no-auth",
        "--state-dir=" + dir_ + "/state", absl::StrCat("--min-members=", options_.min_members),
        absl::StrCat("--max-members=",
                     options_.nodes * options_.per_node + (options_.spares > 0 ? 0 : 2)),
        "--last-call=200ms", "--heartbeat-interval=200ms", "--heartbeat-timeout=2s",
        "--reattach-grace=10s", "--keep-last=0"});
    if (options_.standby) {
      argv.insert(argv.end(), {"--advertise=" + target,
                               "--address-file=" + dir_ + "/coordinator.address",
                               "--lease-timeout=2s"});
    }
    argv.insert(argv.end(), options_.extra_coordinator_flags.begin(),
                options_.extra_coordinator_flags.end());
    return SpawnLogged(argv, dir_ + "/" + log);
  };
  coordinator_ = spawn(target_, options_.coordinator_netns, "coordinator.log");
  if (options_.standby && standby_ <= 0) {
    standby_ = spawn(standby_target_, options_.standby_netns, "standby.log");
  }
  if (!options_.relay_host.empty() && relay_ <= 0) {
    std::vector<std::string> argv = InNetns(options_.relay_netns);
    argv.insert(argv.end(), {SelfDir() + "/muster-relay", absl::StrCat("--listen=0.0.0.0:", relay_port_),
                             "--coordinator=" + client_target_});
    relay_ = SpawnLogged(argv, dir_ + "/relay.log");
  }
  // Ready when the CLI gets an answer.
  const absl::Time end = absl::Now() + absl::Seconds(20);
  std::string out;
  while (absl::Now() < end && Cli("status", &out) != 0) absl::SleepFor(absl::Milliseconds(50));
}

void FaultJob::KillCoordinator() {
  if (coordinator_ <= 0) return;
  ::kill(coordinator_, SIGKILL);
  ::waitpid(coordinator_, nullptr, 0);
  coordinator_ = -1;
}

void FaultJob::StartAgent(int n) {
  std::vector<std::string> argv =
      InNetns(n < static_cast<int>(options_.netns.size()) ? options_.netns[n] : "");
  const std::vector<std::string> agent = {
      SelfDir() + "/muster-agent", absl::StrCat("--nproc-per-node=", options_.per_node),
      absl::StrCat("--spares=", n == 0 ? options_.spares : 0),
      absl::StrCat("--node-id=node", n), "--max-restarts=5", "--coordinator=" + member_target_};
  argv.insert(argv.end(), agent.begin(), agent.end());
  argv.insert(argv.end(), options_.extra_agent_flags.begin(), options_.extra_agent_flags.end());
  const std::vector<std::string> rest = {
      "--", SelfDir() + "/muster-train", "--coordinator=" + member_target_, "--model=mlp",
      "--batch-size=32", absl::StrCat("--steps=", options_.steps), "--log-every=1", "--quiet",
      "--threads=1", absl::StrCat("--job=mf", ::getpid(), "-", n),
      "--checkpoint-dir=" + options_.checkpoint_dir,
      absl::StrCat("--checkpoint-every=", options_.checkpoint_every),
      absl::StrCat("--summary-json=", dir_, "/{node}-{local_rank}.json")};
  argv.insert(argv.end(), rest.begin(), rest.end());
  if (n < static_cast<int>(options_.addresses.size())) {
    argv.push_back("--address=" + options_.addresses[n]);
  }
  if (n == 0) argv.push_back("--log-dir=" + dir_ + "/rank0");
  argv.insert(argv.end(), options_.extra_train_flags.begin(), options_.extra_train_flags.end());
  agents_[n] = SpawnLogged(argv, absl::StrCat(dir_, "/agent", n, ".log"));
  agent_done_[n] = false;
}

void FaultJob::StartAll() {
  StartCoordinator();
  for (int n = 0; n < options_.nodes; ++n) StartAgent(n);
}

pid_t FaultJob::TrainerPid(int node, int slot) const {
  return LastTrainerPid(absl::StrCat(dir_, "/agent", node, ".log"), slot);
}

std::vector<StepRecord> FaultJob::Steps() const {
  return ReadStepRecords(dir_ + "/rank0/metrics.jsonl");
}

int64_t FaultJob::LastStep() const {
  const auto steps = Steps();
  return steps.empty() ? 0 : steps.back().step;
}

bool FaultJob::WaitForStep(int64_t step, absl::Duration timeout) const {
  const absl::Time end = absl::Now() + timeout;
  while (absl::Now() < end) {
    if (LastStep() >= step) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return false;
}

bool FaultJob::WaitForWorld(int size, absl::Duration timeout) const {
  const absl::Time end = absl::Now() + timeout;
  while (absl::Now() < end) {
    const auto steps = Steps();
    if (!steps.empty() && steps.back().world == size) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return false;
}

int FaultJob::WaitAgents(absl::Duration stall, const std::vector<int>& allowed) {
  int failed = 0;
  int64_t step = LastStep();
  absl::Time progressed = absl::Now(), looked = absl::Now();
  auto stalled = [&] {
    if (absl::Now() - looked >= absl::Seconds(1)) {  // metrics.jsonl is read whole
      looked = absl::Now();
      if (const int64_t now = LastStep(); now != step) {
        step = now;
        progressed = looked;
      }
    }
    return absl::Now() - progressed > stall;
  };
  for (size_t n = 0; n < agents_.size(); ++n) {
    if (agents_[n] <= 0 || agent_done_[n]) continue;
    int status = 0;
    pid_t got = 0;
    while ((got = ::waitpid(agents_[n], &status, WNOHANG)) == 0 && !stalled()) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    if (got == 0) {  // timed out
      ::kill(agents_[n], SIGKILL);
      ::waitpid(agents_[n], &status, 0);
      ++failed;
    } else if ((!WIFEXITED(status) || WEXITSTATUS(status) != 0) &&
               std::find(allowed.begin(), allowed.end(), static_cast<int>(n)) == allowed.end()) {
      ++failed;
    }
    agent_done_[n] = true;
  }
  return failed;
}

int FaultJob::Cli(const std::string& args, std::string* out) const {
  int code = -1;
  *out = RunShell(
      absl::StrCat(SelfDir(), "/muster --coordinator ", client_target_, " --timeout 5s ", args),
                  &code);
  return code;
}

CheckpointCheck FaultJob::VerifyCheckpoints() const {
  CheckpointCheck c;
  std::string out;
  Cli("checkpoints --verify", &out);
  std::istringstream in(out);
  std::string line;
  std::smatch m;
  const std::regex ok("^ok +step ([0-9]+)"), bad("^BAD +step ([0-9]+)");
  std::set<int64_t> bad_steps;
  while (std::getline(in, line)) {
    if (std::regex_search(line, m, ok)) ++c.committed;
    if (std::regex_search(line, m, bad)) bad_steps.insert(std::stoll(m[1]));
  }
  c.committed += static_cast<int>(bad_steps.size());
  c.bad_steps.assign(bad_steps.begin(), bad_steps.end());
  return c;
}

int64_t FaultJob::NewestCommitted(std::vector<std::string>* files) const {
  std::string out;
  if (Cli("checkpoints --json", &out) != 0) return -1;
  // The first checkpoint listed is the newest committed one.
  std::smatch m;
  if (!std::regex_search(out, m, std::regex(R"re("step": "?([0-9]+)"?)re"))) return -1;
  const int64_t step = std::stoll(m[1]);
  files->clear();
  const std::string dir = absl::StrCat(options_.checkpoint_dir, "/step-", step, "/");
  for (const char* name : {"model.safetensors", "optimizer.safetensors", "manifest.json"}) {
    files->push_back(dir + name);
  }
  return step;
}

int FaultJob::WaitAgent(int n) {
  int status = 0;
  ::waitpid(agents_[n], &status, 0);
  agent_done_[n] = true;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

bool FaultJob::ParamsEqual(int expected, int last_node) const {
  int seen = 0;
  std::string first;
  for (int n = 0; n <= (last_node < 0 ? options_.nodes - 1 : last_node); ++n) {
    for (int s = 0; s < options_.per_node + (n == 0 ? options_.spares : 0); ++s) {
      const std::string json = ReadText(absl::StrCat(dir_, "/node", n, "-", s, ".json"));
      const std::string sum = JsonNumber(json, "parameter_checksum");
      if (sum.empty() || JsonNumber(json, "world_size") == "0") continue;  // a spare left over
      if (seen++ == 0) first = sum;
      if (sum != first) return false;
    }
  }
  return seen >= expected;
}

int FaultJob::DroppedSteps() const {
  const std::string n = JsonNumber(ReadText(dir_ + "/node0-0.json"), "steps_dropped");
  return n.empty() ? 0 : std::stoi(n);
}

std::string FaultJob::Logs() const {
  std::string all = ReadText(dir_ + "/coordinator.log") + ReadText(dir_ + "/standby.log") +
                    ReadText(dir_ + "/relay.log");
  for (int n = 0; n < options_.nodes; ++n) all += ReadText(absl::StrCat(dir_, "/agent", n, ".log"));
  return all;
}

double StallAfter(const std::vector<StepRecord>& steps, double fault_time) {
  double worst = 0, prev = fault_time;
  bool any = false;
  for (const StepRecord& r : steps) {
    if (r.time <= fault_time) {
      prev = fault_time;
      continue;
    }
    worst = std::max(worst, r.time - std::max(prev, fault_time));
    prev = r.time;
    any = true;
  }
  return any ? worst : 0;
}

int LostSteps(const std::vector<StepRecord>& steps, double fault_time, int dropped) {
  const StepRecord* last = nullptr;  // the last step before the fault
  for (const StepRecord& r : steps) {
    if (r.time <= fault_time) last = &r;
  }
  if (last == nullptr) return 0;
  int64_t last_old = 0, lowest_after = INT64_MAX;
  const StepRecord* regrouped = nullptr;  // the first step of a newer generation
  for (const StepRecord& r : steps) {
    if (r.generation == last->generation) last_old = std::max(last_old, r.step);
    if (r.time <= fault_time) continue;
    lowest_after = std::min(lowest_after, r.step);
    if (regrouped == nullptr && r.generation != last->generation) regrouped = &r;
  }
  if (regrouped != nullptr && regrouped->world < last->world) {
    // A failure: any completed step the smaller world did again.
    return static_cast<int>(std::max<int64_t>(0, last_old - regrouped->step + 1)) + dropped;
  }
  if (lowest_after == INT64_MAX) return dropped;
  return static_cast<int>(std::max<int64_t>(0, last->step - lowest_after + 1)) + dropped;
}

}  // namespace muster
