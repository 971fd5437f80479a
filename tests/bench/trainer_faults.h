// Faults only the trainers see, shared by muster-fault and muster-bench
// ettr: a TCP connection between two trainers destroyed, and a trainer's
// training thread frozen while its other threads live. Both need root (or
// CAP_NET_ADMIN and CAP_SYS_PTRACE). Not thread-safe: a frozen thread must
// be watched (WatchFrozen) from the thread that froze it.
#ifndef MUSTER_TESTS_BENCH_TRAINER_FAULTS_H_
#define MUSTER_TESTS_BENCH_TRAINER_FAULTS_H_

#include <sys/types.h>

#include <set>
#include <string>
#include <vector>

namespace muster {

// An established TCP connection between two of `pids`, as `ss -tnpH` shows
// it from one end: local and peer "addr:port".
struct TrainerLink {
  std::string local, peer;
};
std::vector<TrainerLink> TrainerLinks(const std::set<pid_t>& pids);
// Destroys `link` with `ss -K` (both ends get an error). False if ss failed.
bool CutLink(const TrainerLink& link);

// Freezes the main thread of process `pid` (its training thread) with
// ptrace (PTRACE_SEIZE + PTRACE_INTERRUPT); its other threads go on. "" on
// success, else why not.
std::string FreezeMainThread(pid_t pid);
// For a frozen process: true once it has ended (the tracer hears of its
// end first and must collect it before its parent can). Never blocks.
bool FrozenEnded(pid_t pid);
// Lets a frozen process go on (it must still be frozen).
void Thaw(pid_t pid);

}  // namespace muster

#endif  // MUSTER_TESTS_BENCH_TRAINER_FAULTS_H_
