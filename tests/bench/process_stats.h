// Child processes for benchmarks, and their CPU and memory from /proc.
#ifndef MUSTER_TESTS_BENCH_PROCESS_STATS_H_
#define MUSTER_TESTS_BENCH_PROCESS_STATS_H_

#include <sys/types.h>

#include <string>
#include <vector>

namespace muster {

// Starts `argv` with stdout/stderr appended to `log`; returns its pid.
pid_t SpawnProcess(const std::vector<std::string>& argv, const std::string& log);
// SIGTERM, then SIGKILL after `grace_ms`; reaps it.
void StopProcess(pid_t pid, int grace_ms = 2000);
// User + system CPU seconds the process has used.
double ProcessCpuSeconds(pid_t pid);
// Resident set size in MiB.
double ProcessRssMb(pid_t pid);
// The directory holding this executable.
std::string SelfDir();
// A free TCP port on 127.0.0.1.
int FreeLoopbackPort();
// Percentile p (0..100) of `v` (sorted in place); 0 when empty.
double Percentile(std::vector<double>& v, double p);

}  // namespace muster

#endif  // MUSTER_TESTS_BENCH_PROCESS_STATS_H_
