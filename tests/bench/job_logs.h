// Reading what a running job leaves on disk, for muster-bench and
// muster-fault: rank 0's metrics.jsonl and a muster-agent's log.
// Pure functions over files; thread-compatible.
#ifndef MUSTER_TESTS_BENCH_JOB_LOGS_H_
#define MUSTER_TESTS_BENCH_JOB_LOGS_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace muster {

// The whole file ("" when missing).
std::string ReadWholeFile(const std::string& path);

// One logged step of rank 0 (muster-train --log-dir, --log-every 1).
struct StepRecord {
  int64_t step = 0;
  double time = 0;  // Unix seconds
  int world = 0;
  uint64_t generation = 0;
};
std::vector<StepRecord> ReadStepRecords(const std::string& metrics_jsonl);

// The pid a muster-agent's log last reported for trainer `slot` (-1: none).
pid_t LastTrainerPid(const std::string& agent_log, int slot);

}  // namespace muster

#endif  // MUSTER_TESTS_BENCH_JOB_LOGS_H_
