// muster-bench WHAT [flags]: benchmarks that print one line of figures.
//
//   muster-bench coordinator --members N --seconds S
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "common/flag_names.h"

namespace muster {
int RunCoordinatorBench();
}  // namespace muster

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("muster-bench coordinator --members N --seconds S");
  muster::DashesToUnderscores(argc, argv);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  const std::string what = args.size() > 1 ? args[1] : "";
  if (what == "coordinator") return muster::RunCoordinatorBench();
  std::cerr << "muster-bench: unknown benchmark '" << what << "' (coordinator)\n";
  return 2;
}
