// Child processes for benchmarks, and their memory from /proc. Starting
// them, free ports, reading their files and their CPU time: subprocess.h.
#ifndef MUSTER_TESTS_BENCH_PROCESS_STATS_H_
#define MUSTER_TESTS_BENCH_PROCESS_STATS_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "tests/integration/subprocess.h"

namespace muster {

// SIGTERM, then SIGKILL after `grace_ms`; reaps it.
void StopProcess(pid_t pid, int grace_ms = 2000);
// Resident set size in MiB.
double ProcessRssMb(pid_t pid);
// The directory holding this executable.
std::string SelfDir();
// Percentile p (0..100) of `v` (sorted in place); 0 when empty.
double Percentile(std::vector<double>& v, double p);
// (node index, agent slot) of every member of the live world but rank 0,
// for members named "node<N>/<slot>", from `muster status --json` against
// `target` (which trainers are spares depends on who joined first).
std::vector<std::pair<int, int>> WorldMembers(const std::string& target);

}  // namespace muster

#endif  // MUSTER_TESTS_BENCH_PROCESS_STATS_H_
