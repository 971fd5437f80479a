// muster-bench WHAT [flags]: benchmarks that print one line of figures.
//
//   muster-bench coordinator --members N --seconds S
//   muster-bench train --model mlp|cnn --world W --nodes M --steps N
//   muster-bench allreduce --world W --nodes M --backend gloo|shm|hier --sizes 4K,1M,...
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "common/flag_names.h"

namespace muster {
int RunCoordinatorBench();
int RunAllreduceBench();
int RunCommWorker();
int RunTrainBench();
}  // namespace muster

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("muster-bench coordinator --members N --seconds S");
  muster::DashesToUnderscores(argc, argv);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  const std::string what = args.size() > 1 ? args[1] : "";
  if (what == "coordinator") return muster::RunCoordinatorBench();
  if (what == "allreduce") return muster::RunAllreduceBench();
  if (what == "comm-worker") return muster::RunCommWorker();
  if (what == "train") return muster::RunTrainBench();
  std::cerr << "muster-bench: unknown benchmark '" << what << "' (coordinator, allreduce, train)\n";
  return 2;
}
