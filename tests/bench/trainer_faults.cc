#include "tests/bench/trainer_faults.h"

#include <sys/ptrace.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <regex>
#include <utility>

#include "absl/strings/str_cat.h"

namespace muster {
namespace {

// `command`'s standard output ("" if it could not run).
std::string Output(const std::string& command) {
  std::string out;
  FILE* f = ::popen(command.c_str(), "r");
  if (f == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  ::pclose(f);
  return out;
}

}  // namespace

std::vector<TrainerLink> TrainerLinks(const std::set<pid_t>& pids) {
  static const std::regex line(R"(^\s*\d+\s+\d+\s+(\S+):(\d+)\s+(\S+):(\d+)\s.*pid=(\d+),)");
  std::map<std::string, pid_t> owner;
  std::vector<std::pair<TrainerLink, pid_t>> all;
  const std::string text = Output("ss -tnpH state established 2>/dev/null");
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::smatch m;
    const std::string l = text.substr(start, end - start);
    start = end + 1;
    if (!std::regex_search(l, m, line)) continue;
    const pid_t pid = std::stoi(m[5]);
    if (pids.count(pid) == 0) continue;
    TrainerLink link{m[1].str() + ":" + m[2].str(), m[3].str() + ":" + m[4].str()};
    owner[link.local] = pid;
    all.push_back({link, pid});
  }
  std::vector<TrainerLink> links;
  for (const auto& [link, pid] : all) {
    auto it = owner.find(link.peer);
    if (it != owner.end() && it->second != pid) links.push_back(link);
  }
  return links;
}

bool CutLink(const TrainerLink& link) {
  const size_t lc = link.local.rfind(':'), pc = link.peer.rfind(':');
  const std::string kill = absl::StrCat(
      "ss -K src ", link.local.substr(0, lc), " sport = :", link.local.substr(lc + 1), " dst ",
      link.peer.substr(0, pc), " dport = :", link.peer.substr(pc + 1), " >/dev/null 2>&1");
  return std::system(kill.c_str()) == 0;
}

std::string FreezeMainThread(pid_t pid) {
  if (::ptrace(PTRACE_SEIZE, pid, nullptr, nullptr) != 0) {
    return absl::StrCat("cannot trace ", pid, ": ", std::strerror(errno));
  }
  int status = 0;
  if (::ptrace(PTRACE_INTERRUPT, pid, nullptr, nullptr) != 0 ||
      ::waitpid(pid, &status, __WALL) != pid) {
    return absl::StrCat("cannot stop thread ", pid, ": ", std::strerror(errno));
  }
  return "";
}

bool FrozenEnded(pid_t pid) {
  int status = 0;
  const pid_t r = ::waitpid(pid, &status, __WALL | WNOHANG);
  return r < 0 || (r == pid && (WIFEXITED(status) || WIFSIGNALED(status)));
}

void Thaw(pid_t pid) { ::ptrace(PTRACE_DETACH, pid, nullptr, 0); }

}  // namespace muster
