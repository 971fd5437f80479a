#include "tests/bench/job_logs.h"

#include <fstream>
#include <regex>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace muster {

std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<StepRecord> ReadStepRecords(const std::string& metrics_jsonl) {
  std::vector<StepRecord> out;
  std::istringstream in(ReadWholeFile(metrics_jsonl));
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

pid_t LastTrainerPid(const std::string& agent_log, int slot) {
  const std::string log = ReadWholeFile(agent_log);
  const std::regex re(absl::StrCat("trainer ", slot, " started[^\\n]*pid ([0-9]+)"));
  pid_t pid = -1;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), re); it != std::sregex_iterator();
       ++it) {
    pid = std::stoi((*it)[1]);
  }
  return pid;
}

}  // namespace muster
