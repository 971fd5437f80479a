#include "agent/stopped_trainers.h"

#include <dirent.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"

namespace muster {
namespace {

// The state letter of /proc/.../stat: the field after the command, which
// is in parentheses and may itself hold ") ".
char StateOf(const std::string& stat_path) {
  std::ifstream in(stat_path);
  std::string line;
  if (!std::getline(in, line)) return '\0';
  const size_t close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return '\0';
  return line[close + 2];
}

}  // namespace

Stopped ReadStopped(pid_t pid) {
  const std::string task = absl::StrCat("/proc/", pid, "/task");
  DIR* dir = ::opendir(task.c_str());
  if (dir == nullptr) return Stopped::kNo;
  int threads = 0, stopped = 0;
  while (const dirent* e = ::readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    const char state = StateOf(absl::StrCat(task, "/", e->d_name, "/stat"));
    if (state == '\0' || state == 'Z' || state == 'X') continue;  // ended meanwhile
    ++threads;
    if (state == 'T' || state == 't') ++stopped;
  }
  ::closedir(dir);
  if (stopped == 0) return Stopped::kNo;
  return stopped == threads ? Stopped::kWhole : Stopped::kPartly;
}

std::vector<StoppedTrainers::Verdict> StoppedTrainers::Check(const std::vector<pid_t>& pids) {
  std::vector<Verdict> out;
  if (!enabled()) return out;
  const absl::Time now = clock_->Now();
  const std::set<pid_t> running(pids.begin(), pids.end());
  for (auto it = seen_.begin(); it != seen_.end();) {
    it = running.count(it->first) > 0 ? std::next(it) : seen_.erase(it);
  }
  for (pid_t pid : pids) {
    const Stopped how = probe_(pid);
    Seen& s = seen_[pid];
    if (how != s.how) s = Seen{how, now, false};
    if (how == Stopped::kNo || s.told || now - s.since < limit_) continue;
    s.told = true;
    out.push_back({pid, how, now - s.since});
  }
  return out;
}

}  // namespace muster
