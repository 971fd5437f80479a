#include "tests/bench/process_stats.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <regex>
#include <sstream>

namespace muster {

void StopProcess(pid_t pid, int grace_ms) {
  if (pid <= 0) return;
  ::kill(pid, SIGTERM);
  for (int waited = 0; waited < grace_ms; waited += 10) {
    if (::waitpid(pid, nullptr, WNOHANG) == pid) return;
    ::usleep(10'000);
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
}

double ProcessRssMb(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      std::istringstream s(line.substr(6));
      double kb = 0;
      s >> kb;
      return kb / 1024.0;
    }
  }
  return 0;
}

std::string SelfDir() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string path(buf, n);
  return path.substr(0, path.rfind('/'));
}

double Percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double rank = p / 100.0 * (v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (rank - lo);
}

std::vector<std::pair<int, int>> WorldMembers(const std::string& target) {
  int code = -1;
  const std::string json =
      RunShell(SelfDir() + "/muster --coordinator=" + target + " status --json", &code);
  std::vector<std::pair<int, int>> out;
  const std::regex name("node([0-9]+)/([0-9]+)");
  std::smatch m;
  for (const StatusMember& member : StatusMembers(json)) {
    if (member.state != "active" || member.rank <= 0) continue;
    if (std::regex_match(member.id, m, name)) out.emplace_back(std::stoi(m[1]), std::stoi(m[2]));
  }
  return out;
}

}  // namespace muster
