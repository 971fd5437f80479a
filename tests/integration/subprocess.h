// Helpers for tests and benchmarks that run muster's binaries as processes
// and read what they leave behind (logs, summaries, rank 0's metrics).
// Header-only; thread-compatible.
#ifndef MUSTER_TESTS_INTEGRATION_SUBPROCESS_H_
#define MUSTER_TESTS_INTEGRATION_SUBPROCESS_H_

#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace muster {

// A TCP port on 127.0.0.1 that was free a moment ago.
inline int FreeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// A TCP connection to 127.0.0.1:`port`; -1 when it cannot be made.
inline int ConnectLoopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    return fd;
  }
  if (fd >= 0) ::close(fd);
  return -1;
}

// Raises this process's soft limit on open files to at least `n`; false
// when the hard limit is below it.
inline bool AllowOpenFiles(rlim_t n) {
  rlimit nofile{};
  if (::getrlimit(RLIMIT_NOFILE, &nofile) != 0 || nofile.rlim_max < n) return false;
  nofile.rlim_cur = std::max(nofile.rlim_cur, n);
  return ::setrlimit(RLIMIT_NOFILE, &nofile) == 0;
}

// One HTTP/1.0 exchange on 127.0.0.1:`port`: sends `request`, returns all
// that comes back until the server closes ("" when nothing could be sent).
inline std::string HttpExchange(int port, const std::string& request) {
  const int fd = ConnectLoopback(port);
  if (fd < 0) return "";
  std::string answer;
  if (::send(fd, request.data(), request.size(), 0) == static_cast<ssize_t>(request.size())) {
    char buf[1 << 16];
    for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;) answer.append(buf, n);
  }
  ::close(fd);
  return answer;
}

// The whole file ("" when missing).
inline std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// How many times `text` occurs in `s` (a log line, a header on a screen).
inline int Occurrences(const std::string& s, const std::string& text) {
  int n = 0;
  for (size_t at = s.find(text); at != std::string::npos; at = s.find(text, at + 1)) ++n;
  return n;
}

// User + system CPU seconds the process has used: its CPU-time clock (to the
// nanosecond, threads that ended included), or /proc's ticks where that
// clock cannot be read.
inline double ProcessCpuSeconds(pid_t pid) {
  clockid_t clock;
  timespec ts;
  if (::clock_getcpuclockid(pid, &clock) == 0 && ::clock_gettime(clock, &ts) == 0) {
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
  }
  const std::string content = ReadText("/proc/" + std::to_string(pid) + "/stat");
  // Fields after the command name (which may hold spaces) start after ')'.
  const size_t close = content.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(content.substr(close + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i >= 14) ticks += std::stod(field);  // utime, stime
  }
  return ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// Starts `argv` with stdout and stderr appended to `log`.
inline pid_t SpawnLogged(const std::vector<std::string>& argv, const std::string& log) {
  pid_t pid = ::fork();
  if (pid == 0) {
    FILE* f = std::freopen(log.c_str(), "a", stdout);
    (void)f;
    ::dup2(1, 2);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  return pid;
}

// Waits for `pid`: its exit code, or 128 + the signal that ended it.
inline int WaitExit(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Ends the processes it holds when it goes out of scope: each that is still
// a running child of this process is killed (SIGKILL) and reaped, so a test
// that returns early on a failed ASSERT leaves no coordinator or trainer
// behind. One already waited for is skipped (waitpid no longer names it).
class KillOnExit {
 public:
  KillOnExit() = default;
  KillOnExit(const KillOnExit&) = delete;
  KillOnExit& operator=(const KillOnExit&) = delete;
  ~KillOnExit() {
    for (pid_t pid : pids_) {
      if (::waitpid(pid, nullptr, WNOHANG) != 0) continue;  // ended, or not ours
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
  pid_t Add(pid_t pid) {
    pids_.push_back(pid);
    return pid;
  }
  const std::vector<pid_t>& Add(const std::vector<pid_t>& pids) {
    pids_.insert(pids_.end(), pids.begin(), pids.end());
    return pids;
  }

 private:
  std::vector<pid_t> pids_;
};

// Runs `command` with sh, stderr into stdout: its output, and its exit code
// in `*code` (-1 if it did not exit).
inline std::string RunShell(const std::string& command, int* code) {
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int status = ::pclose(p);
  *code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

// The number after "name": in a JSON text (muster-train --summary-json), as
// written; "" when absent.
inline std::string JsonNumber(const std::string& json, const std::string& name) {
  std::smatch m;
  if (std::regex_search(json, m, std::regex("\"" + name + "\": ([-0-9.eE]+)"))) return m[1];
  return "";
}

// One member of `muster status --json`: its id, state ("active", "spare",
// ...), rank in the live world (-1: none) and last heartbeat's step.
struct StatusMember {
  std::string id, state;
  int rank = -1;
  int64_t step = 0;
};

inline std::vector<StatusMember> StatusMembers(const std::string& status_json) {
  std::vector<StatusMember> out;
  const std::regex member(
      R"re("member_id": "([^"]+)"[^}]*\}[^}]*"state": "([a-z]+)",\s*"rank": (-?[0-9]+))re"
      R"re((?:,\s*"step": "(-?[0-9]+)")?)re");
  for (auto it = std::sregex_iterator(status_json.begin(), status_json.end(), member);
       it != std::sregex_iterator(); ++it) {
    const std::string step = (*it)[4];
    out.push_back({(*it)[1], (*it)[2], std::stoi((*it)[3]), step.empty() ? 0 : std::stoll(step)});
  }
  return out;
}

// The pid a muster-agent's log last reported for trainer `slot` (-1: none).
inline pid_t LastTrainerPid(const std::string& agent_log, int slot) {
  const std::string log = ReadText(agent_log);
  const std::regex re("trainer " + std::to_string(slot) + " started[^\\n]*pid ([0-9]+)");
  pid_t pid = -1;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), re); it != std::sregex_iterator();
       ++it) {
    pid = std::stoi((*it)[1]);
  }
  return pid;
}

// The highest "step N/" a log printed (-1: none): a rank that joined late
// starts at the world's step, so a particular line may never appear.
inline int LatestLoggedStep(const std::string& log) {
  const std::regex re("\\bstep ([0-9]+)/");
  int latest = -1;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), re); it != std::sregex_iterator();
       ++it) {
    latest = std::max(latest, std::stoi((*it)[1]));
  }
  return latest;
}

// One logged step of rank 0 (muster-train --log-dir, --log-every 1).
struct StepRecord {
  int64_t step = 0;
  double time = 0;  // Unix seconds
  int world = 0;
  uint64_t generation = 0;
};

inline std::vector<StepRecord> ReadStepRecords(const std::string& metrics_jsonl) {
  std::vector<StepRecord> out;
  std::istringstream in(ReadText(metrics_jsonl));
  std::string line;
  const std::regex re(
      R"re("step": ([0-9]+), "time": ([0-9.]+).*"generation": ([0-9]+).*"world_size": ([0-9]+))re");
  std::smatch m;
  while (std::getline(in, line)) {
    if (std::regex_search(line, m, re)) {
      out.push_back({std::stoll(m[1]), std::stod(m[2]), std::stoi(m[4]),
                     static_cast<uint64_t>(std::stoull(m[3]))});
    }
  }
  return out;
}

}  // namespace muster

#endif  // MUSTER_TESTS_INTEGRATION_SUBPROCESS_H_
