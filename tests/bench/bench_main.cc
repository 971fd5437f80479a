// muster-bench WHAT [flags]: benchmarks that print one line of figures.
//
//   muster-bench coordinator --members N --seconds S
//   muster-bench checkpoint --state-mb 800 [--dir D] [--device cuda]
//   muster-bench train --model mlp|cnn --world W --nodes M --steps N
//                      [--gradient-compression none|bf16|fp16] [--compare-sharding]
//   muster-bench recovery --world 4 --nodes 2 [--spares 1 [--spare_node]] --trials N
//                         [--device cuda] [--job_steps N] [--trainer_flags F,F]
//   muster-bench ettr --mtbf S --minutes M --world 4 --nodes 2 --spares 1
//                     [--false-alarms --eval-every N]
//   muster-bench allreduce --world W --nodes M --backend gloo|shm|hier|nccl
//                          --sizes 4K,1M,... [--device cuda]
//                          [--gradient-compression none|bf16|fp16]
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/flag.h"
#include "common/flag_names.h"

ABSL_FLAG(int, state_mb, 800, "checkpoint: MB of training state");
ABSL_FLAG(std::string, dir, "", "checkpoint: directory to write to (default under /var/tmp)");

namespace muster {
int RunCoordinatorBench();
int RunAllreduceBench();
int RunCommWorker();
int RunTrainBench();
int RunRecoveryBench();
int RunEttrBench();
int RunCheckpointBench();
}  // namespace muster

int main(int argc, char** argv) {
  muster::ListOwnFlagsInHelp();
  absl::SetProgramUsageMessage(
      "muster-bench WHAT [flags]: one line of figures per case. WHAT is one of\n"
      "  coordinator --members N [--per-node K] --seconds S [--regroup [--regroups R]] [--channels C] [--state-sync-delay D]\n"
      "  allreduce --world W --nodes M --backend gloo|shm|hier|nccl --sizes 4K,1M [--device cuda]\n"
      "            [--gradient-compression none|bf16|fp16]\n"
      "  train --model mlp|cnn|resnet18 --world W --nodes M --steps N [--gradient-compression bf16]\n"
      "        [--compare-buffers | --compare-backward-calls [--backward-calls N] |\n"
      "         --compare-sharding] [--trainer-flags F,F]\n"
      "  recovery --world 4 --nodes 2 [--spares 1 [--spare-node]] --trials N [--device cuda]\n"
      "  ettr --mtbf S --minutes M --world 4 --nodes 2 --spares 1 [--false-alarms --eval-every N]\n"
      "  checkpoint --state-mb N [--dir D] [--device cuda]");
  muster::DashesToUnderscores(argc, argv);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  const std::string what = args.size() > 1 ? args[1] : "";
  if (what == "coordinator") return muster::RunCoordinatorBench();
  if (what == "allreduce") return muster::RunAllreduceBench();
  if (what == "comm-worker") return muster::RunCommWorker();
  if (what == "train") return muster::RunTrainBench();
  if (what == "recovery") return muster::RunRecoveryBench();
  if (what == "ettr") return muster::RunEttrBench();
#ifdef MUSTER_BENCH_TORCH
  if (what == "checkpoint") return muster::RunCheckpointBench();
#endif
  std::cerr << "muster-bench: unknown benchmark '" << what << "' (coordinator, allreduce, train, recovery, ettr, checkpoint)\n";
  return 2;
}
