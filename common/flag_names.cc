#include "common/flag_names.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "absl/flags/parse.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"

namespace muster {
namespace {

// Set while ParseFlags parses a command line that asks for no usage text:
// an exit then is Abseil's on a flag it refused.
std::atomic<bool> refused_flag_exits_2{false};

void ExitTwoOnARefusedFlag() {
  if (refused_flag_exits_2.load()) std::_Exit(2);
}

bool AsksForUsage(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") return false;
    for (absl::string_view usage : {"--help", "--helpfull", "--helpshort", "--helppackage",
                                   "--helpon", "--helpmatch", "--version", "--only_check_args"}) {
      if (arg == usage ||
          (absl::StartsWith(arg, usage) && arg.size() > usage.size() && arg[usage.size()] == '=')) {
        return true;
      }
    }
  }
  return false;
}

}  // namespace

void DashesToUnderscores(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    char* arg = argv[i];
    if (std::strcmp(arg, "--") == 0) return;
    if (arg[0] != '-' || arg[1] != '-') continue;
    for (char* p = arg + 2; *p != '\0' && *p != '='; ++p) {
      if (*p == '-') *p = '_';
    }
  }
}

void ListOwnFlagsInHelp() {
  absl::FlagsUsageConfig config;
  config.contains_help_flags = [](absl::string_view file) {
    return !absl::StrContains(file, "absl/");
  };
  config.contains_helpshort_flags = config.contains_help_flags;
  absl::SetFlagsUsageConfig(config);
}

std::vector<char*> ParseFlags(int argc, char** argv) {
  static const bool registered = std::atexit(ExitTwoOnARefusedFlag) == 0;
  refused_flag_exits_2 = registered && !AsksForUsage(argc, argv);
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  refused_flag_exits_2 = false;
  return rest;
}

}  // namespace muster
