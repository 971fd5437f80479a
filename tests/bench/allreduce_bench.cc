// muster-bench allreduce: W worker processes (M nodes of W/M ranks, all on
// this machine's loopback) against a real coordinator process. Prints one
// line per size:
//   allreduce backend=B device=D world=W nodes=M bytes=N compression=C wire=T
//   median_s=T algbw_GBps=X busbw_GBps=Y
// with busbw = algbw * 2(W-1)/W and medians over repeats. The buffers are
// float32 gradients (Communicator::AllReduceGradients); with
// --gradient-compression bf16|fp16 they cross nodes as `wire` (float32 on
// one node), and bytes, algbw and busbw still count the float32 bytes, the
// ones a trainer hands over, so the figures compare with uncompressed runs.
// --collective allgather or reducescatter times AllGather or
// ReduceScatterGradients (compressed as the all-reduce) over even segments
// instead (lines begin with its name, busbw = algbw *
// (W-1)/W).
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/bench/process_stats.h"
#include "tests/fault/net_lab.h"

ABSL_FLAG(int, world, 2, "ranks");
ABSL_FLAG(std::string, lab_rate, "",
          "run each node in a muster-lab host whose link is shaped to this rate each way "
          "(1gbit, 10gbit; docs/lab.md; needs root); \"\": every rank on loopback");

ABSL_DECLARE_FLAG(std::string, backend);
ABSL_DECLARE_FLAG(std::string, sizes);
ABSL_DECLARE_FLAG(int, nodes);
ABSL_DECLARE_FLAG(std::string, device);
ABSL_DECLARE_FLAG(std::string, gradient_compression);
ABSL_DECLARE_FLAG(std::string, collective);

namespace muster {

int RunAllreduceBench() {
  const int world = absl::GetFlag(FLAGS_world);
  const int nodes = absl::GetFlag(FLAGS_nodes);
  if (world < 1 || nodes < 1 || world % nodes != 0) {
    std::cerr << "muster-bench allreduce: --world must be a positive multiple of --nodes\n";
    return 2;
  }
  const std::string dir = "/tmp/muster-bench-allreduce-" + std::to_string(::getpid());
  std::system(("mkdir -p " + dir).c_str());
  const std::string token_file = dir + "/token";
  std::ofstream(token_file) << "bench-token";
  std::system(("chmod 600 " + token_file).c_str());
  // In a lab each node is a network namespace whose link has the given
  // rate; the coordinator listens on the bridge's address here.
  const std::string rate = absl::GetFlag(FLAGS_lab_rate);
  std::unique_ptr<NetLab> lab;  // removed when it goes out of scope
  if (!rate.empty()) {
    lab = std::make_unique<NetLab>(NetLabOptions{nodes, rate, {}});
    if (!lab->ok()) {
      std::cerr << "muster-bench allreduce: the lab did not start: " << lab->error() << "\n";
      return 1;
    }
  }
  const std::string host = lab != nullptr ? lab->bridge_address() : "127.0.0.1";
  const std::string target = host + ":" + std::to_string(FreeLoopbackPort());
  const pid_t coordinator = SpawnLogged(
      {SelfDir() + "/muster-coordinator", "--listen=" + target, "--token-file=" + token_file,
       absl::StrCat("--min-members=", world), absl::StrCat("--max-members=", world),
       "--last-call=0s"},
      dir + "/coordinator.log");
  std::vector<pid_t> workers;
  const int per_node = world / nodes;
  for (int i = 0; i < world; ++i) {
    std::vector<std::string> argv = InNetns(lab != nullptr ? lab->namespaces()[i / per_node] : "");
    const std::vector<std::string> worker = {
        SelfDir() + "/muster-bench", "comm-worker", "--coordinator=" + target,
        "--token-file=" + token_file, absl::StrCat("--member=rank", i),
        absl::StrCat("--node=node", i / per_node), absl::StrCat("--local-rank=", i % per_node),
        "--backend=" + absl::GetFlag(FLAGS_backend), "--sizes=" + absl::GetFlag(FLAGS_sizes),
        "--device=" + absl::GetFlag(FLAGS_device),
        "--gradient-compression=" + absl::GetFlag(FLAGS_gradient_compression),
        "--collective=" + absl::GetFlag(FLAGS_collective), absl::StrCat("--nodes=", nodes),
        absl::StrCat("--job=bench", ::getpid()),
        "--report=" + dir + "/report"};
    argv.insert(argv.end(), worker.begin(), worker.end());
    // Rank 0's stdout is ours; the others log to files.
    const pid_t pid = ::fork();
    if (pid == 0) {
      if (i != 0) {
        FILE* f = std::freopen((dir + "/worker" + std::to_string(i) + ".log").c_str(), "w", stdout);
        (void)f;
      }
      std::vector<char*> args;
      for (auto& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    workers.push_back(pid);
  }
  int failures = 0;
  for (pid_t p : workers) {
    int status = 0;
    ::waitpid(p, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failures;
  }
  StopProcess(coordinator);
  if (failures > 0) {
    std::cerr << "muster-bench allreduce: " << failures << " workers failed; see " << dir << "\n";
    return 1;
  }
  std::system(("rm -rf " + dir).c_str());
  return 0;
}

}  // namespace muster
