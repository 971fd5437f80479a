// Helpers for tests that run muster's binaries as processes.
#ifndef MUSTER_TESTS_INTEGRATION_SUBPROCESS_H_
#define MUSTER_TESTS_INTEGRATION_SUBPROCESS_H_

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace muster {

// The whole file ("" when missing).
inline std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
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

}  // namespace muster

#endif  // MUSTER_TESTS_INTEGRATION_SUBPROCESS_H_
