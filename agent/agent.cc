#include "agent/agent.h"

#include <dirent.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/clock.h"
#include "common/logging.h"
#include "rpc/agent_protocol.h"
#include "agent/node_session.h"
#include "agent/stopped_trainers.h"

namespace muster {
namespace {

const int kHandled[] = {SIGCHLD, SIGTERM, SIGINT, SIGUSR1, SIGHUP};

sigset_t HandledSignals() {
  sigset_t set;
  sigemptyset(&set);
  for (int s : kHandled) sigaddset(&set, s);
  return set;
}

// The environment of trainer `slot`: ours, with its identity (and the node
// session's address) set. Made before fork: the agent runs gRPC threads,
// so the child may only make async-signal-safe calls before exec.
std::vector<std::string> TrainerEnvironment(const AgentOptions& o, int slot, int restarts,
                                            const std::string& session) {
  std::map<std::string, std::string> set = o.trainer_env;
  set.insert({
      {"MUSTER_NODE_ID", o.node_id},
      {"MUSTER_LOCAL_RANK", std::to_string(slot)},
      {"MUSTER_LOCAL_WORLD_SIZE", std::to_string(o.nproc + o.spares)},
      {"MUSTER_RESTART_COUNT", std::to_string(restarts)},
      {"MUSTER_SPARE", slot >= o.nproc ? "1" : "0"},
  });
  if (!session.empty()) set[kAgentSessionEnv] = session;
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    // A session address inherited from an outer agent is not ours to pass.
    if (set.count(name) == 0 && name != kAgentSessionEnv) env.push_back(entry);
  }
  for (const auto& [name, value] : set) env.push_back(name + "=" + value);
  return env;
}

// fork + exec of one trainer; the child dies with the agent.
pid_t StartTrainer(const AgentOptions& o, int slot, int restarts, const std::string& session) {
  const std::vector<std::string> env_strings = TrainerEnvironment(o, slot, restarts, session);
  std::vector<char*> env;
  for (const std::string& e : env_strings) env.push_back(const_cast<char*>(e.c_str()));
  env.push_back(nullptr);
  std::vector<char*> argv;
  for (const std::string& a : o.command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const std::string cannot_run = "muster-agent: cannot run " + o.command[0] + "\n";
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  // Child: back to default signal handling, then die with the agent.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(127);  // the agent is already gone
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::execvpe(argv[0], argv.data(), env.data());
  [[maybe_unused]] ssize_t n = ::write(STDERR_FILENO, cannot_run.data(), cannot_run.size());
  ::_exit(kExitBadFlags);
}

// SIGKILL to every other process in our process group (what a trainer may
// have started and left behind). Only when the agent leads its group, so a
// harness that shares our group is never touched.
void KillRestOfProcessGroup() {
  const pid_t self = ::getpid();
  if (::getpgrp() != self) return;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return;
  while (dirent* e = ::readdir(proc)) {
    int pid = 0;
    if (!absl::SimpleAtoi(e->d_name, &pid) || pid == self) continue;
    if (::getpgid(pid) == self) ::kill(pid, SIGKILL);
  }
  ::closedir(proc);
}

// The agent's loop: its trainers by pid, the supervisor's decisions, and
// the deadline after which a stopping agent kills what is left.
class AgentLoop {
 public:
  AgentLoop(const AgentOptions& o, NodeSession* session, Clock* clock)
      : o_(o), sup_(o.supervisor), session_(session), clock_(clock),
        stopped_(o.stopped_limit, clock_) {}

  int Run();

 private:
  int slots() const { return o_.nproc + o_.spares; }
  void Start(int slot);
  // Sends `sig` to every running trainer (never to pid -1 or 0).
  void Forward(int sig);
  void OnSignal(int sig);
  // Collects every trainer that ended (SIGCHLD may coalesce).
  void Reap();
  // Detaches or ends the trainers held stopped past the limit.
  void ActOnStopped();

  const AgentOptions& o_;
  Supervisor sup_;
  NodeSession* const session_;  // nullptr: trainers hold their own sessions
  // Restarts and the stop grace: monotonic time.
  Clock* const clock_;
  std::map<pid_t, int> running_;  // pid -> slot
  absl::Time kill_at_ = absl::InfiniteFuture();
  StoppedTrainers stopped_;
};

void AgentLoop::Start(int slot) {
  const pid_t pid = StartTrainer(o_, slot, sup_.restarts(slot),
                                 session_ != nullptr ? session_->address() : std::string());
  sup_.Started(slot, clock_->Now());
  if (pid < 0) {
    // No process (fork failed: EAGAIN, ENOMEM): never keep -1 as a pid,
    // which kill() would read as "every process we may signal". It counts
    // as a trainer that ended at once, restarted with backoff.
    const int err = errno;
    const bool restart = sup_.Ended(slot, ProcessEnd{false, kExitForkFailed}, clock_->Now());
    MUSTER_LOG(WARNING) << "muster-agent: node " << o_.node_id << ": trainer " << slot
                        << " not started: fork: " << std::strerror(err)
                        << (restart ? "; trying again" : "; giving up");
    return;
  }
  running_[pid] = slot;
  MUSTER_LOG(INFO) << "muster-agent: node " << o_.node_id << ": trainer " << slot << " started"
                   << (sup_.restarts(slot) > 0
                           ? absl::StrCat(" (restart ", sup_.restarts(slot), ")")
                           : std::string())
                   << ", pid " << pid;
}

void AgentLoop::Forward(int sig) {
  for (const auto& [pid, slot] : running_) {
    if (pid > 0) ::kill(pid, sig);
  }
}

void AgentLoop::OnSignal(int sig) {
  if (sup_.stopping() && sig == SIGINT) {
    MUSTER_LOG(WARNING) << "muster-agent: second interrupt: killing the trainers";
    Forward(SIGKILL);
  } else if (sup_.stopping()) {
    // Already stopping (Slurm sends SIGTERM after its warning signal, for
    // instance): the trainers are checkpointing; --stop-grace bounds it.
    MUSTER_LOG(INFO) << "muster-agent: " << ::strsignal(sig) << " while stopping: ignored";
  } else {
    MUSTER_LOG(INFO) << "muster-agent: " << ::strsignal(sig)
                     << ": forwarding to the trainers; no more restarts";
    sup_.Stop();
    Forward(sig);
    kill_at_ = clock_->Now() + o_.stop_grace;
  }
}

void AgentLoop::Reap() {
  for (;;) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;
    auto it = running_.find(pid);
    if (it == running_.end()) continue;
    const int slot = it->second;
    running_.erase(it);
    ProcessEnd end{WIFSIGNALED(status),
                   WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status)};
    if (session_ != nullptr) session_->DetachProcess(pid, "trainer process " + end.Describe());
    const bool restart = sup_.Ended(slot, end, clock_->Now());
    const bool gave_up = sup_.state(slot) == Supervisor::State::kGaveUp;
    LogMessage(restart || gave_up ? LogLevel::kWarning : LogLevel::kInfo, __FILE__, __LINE__)
            .stream()
        << "muster-agent: node " << o_.node_id << ": trainer " << slot << " (pid " << pid
        << ") " << end.Describe()
        << (restart   ? absl::StrCat("; restarting in ",
                                     absl::FormatDuration(Remaining(sup_.RestartAt(slot), clock_)))
            : gave_up ? absl::StrCat("; giving up after ", sup_.restarts(slot), " restarts")
                      : std::string());
  }
}

void AgentLoop::ActOnStopped() {
  std::vector<pid_t> pids;
  for (const auto& [pid, slot] : running_) pids.push_back(pid);
  for (const StoppedTrainers::Verdict& v : stopped_.Check(pids)) {
    const int slot = running_.at(v.pid);
    const std::string held = absl::FormatDuration(absl::Trunc(v.stopped_for, absl::Milliseconds(10)));
    if (v.how == Stopped::kWhole) {
      // It may be a debugger's: leave the process be. Its place goes to the
      // others now; when it runs again it rejoins as a new incarnation.
      // Without the node's session the trainer holds its own, whose
      // heartbeat timeout decides.
      MUSTER_LOG(WARNING) << "muster-agent: node " << o_.node_id << ": trainer " << slot
                          << " (pid " << v.pid << ") stopped for " << held
                          << " (SIGSTOP or a debugger)"
                          << (session_ != nullptr
                                  ? ": detaching it; it rejoins when it runs"
                                  : "; its session's heartbeat timeout decides");
      if (session_ != nullptr) {
        session_->DetachProcess(
            v.pid, absl::StrCat("trainer process stopped for ", held, " (SIGSTOP or a debugger)"));
      }
    } else {
      MUSTER_LOG(WARNING) << "muster-agent: node " << o_.node_id << ": trainer " << slot
                          << " (pid " << v.pid << ") has a thread held stopped for " << held
                          << " while its others run: hung; ending it";
      ::kill(v.pid, SIGKILL);
    }
  }
}

int AgentLoop::Run() {
  const sigset_t handled = HandledSignals();
  for (int slot = 0; slot < slots(); ++slot) Start(slot);
  while (sup_.Active()) {
    const absl::Time now = clock_->Now();
    // Stopped trainers are looked for every 100 ms.
    const absl::Duration poll =
        stopped_.enabled() ? absl::Milliseconds(100) : absl::Seconds(1);
    const absl::Time wake = std::min({sup_.NextRestart(), kill_at_, now + poll});
    const timespec ts = absl::ToTimespec(std::max(absl::ZeroDuration(), wake - now));
    siginfo_t info;
    const int sig = ::sigtimedwait(&handled, &info, &ts);
    if (sig == SIGTERM || sig == SIGINT || sig == SIGUSR1 || sig == SIGHUP) OnSignal(sig);
    Reap();
    if (!sup_.stopping()) ActOnStopped();
    if (clock_->Now() >= kill_at_ && !running_.empty()) {
      MUSTER_LOG(WARNING) << "muster-agent: trainers still running "
                          << absl::FormatDuration(o_.stop_grace) << " after the signal; killing";
      Forward(SIGKILL);
      kill_at_ = absl::InfiniteFuture();
    }
    for (int slot = 0; slot < slots(); ++slot) {
      if (sup_.state(slot) == Supervisor::State::kPending &&
          sup_.RestartAt(slot) <= clock_->Now()) {
        Start(slot);
      }
    }
  }
  KillRestOfProcessGroup();
  const int code = sup_.ExitCode();
  LogMessage(code == 0 ? LogLevel::kInfo : LogLevel::kWarning, __FILE__, __LINE__).stream()
      << "muster-agent: node " << o_.node_id << " done, exit " << code << ": " << sup_.Summary();
  return code;
}

}  // namespace

int RunAgent(const AgentOptions& o) {
  // Our own group, so that KillRestOfProcessGroup() has a group to clean up;
  // and if whoever started us dies, we stop our trainers as if told to.
  if (::getpgrp() != ::getpid()) ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  const sigset_t handled = HandledSignals();
  ::sigprocmask(SIG_BLOCK, &handled, nullptr);
  // After the mask: the session's threads inherit it.
  // The agent's one clock, given to everything it composes.
  Clock* const clock = RealClock::Get();
  std::unique_ptr<NodeSession> session;
  if (!o.node_session.coordinator.empty()) {
    NodeSessionOptions node_session = o.node_session;
    node_session.clock = clock;
    absl::StatusOr<std::unique_ptr<NodeSession>> started = NodeSession::Start(node_session);
    if (!started.ok()) {
      MUSTER_LOG(ERROR) << "muster-agent: node " << o.node_id
                        << ": cannot open the node session: " << started.status();
      return kExitBadFlags;
    }
    session = *std::move(started);
  }
  const int code = AgentLoop(o, session.get(), clock).Run();
  session.reset();
  return code;
}

}  // namespace muster
