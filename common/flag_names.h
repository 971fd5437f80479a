// Command-line spelling: muster's flags are documented with dashes
// (--state-dir) while Abseil's flag names use underscores (state_dir).
#ifndef MUSTER_COMMON_FLAG_NAMES_H_
#define MUSTER_COMMON_FLAG_NAMES_H_

#include <vector>

namespace muster {

// Rewrites, in place, every argument of the form --a-b[=value] before the
// first bare "--" into --a_b[=value]. Values are left alone.
void DashesToUnderscores(int argc, char** argv);

// --help and --helpshort list the program's own flags: every flag defined
// outside Abseil, grouped by the file that defines it, with its default.
// (Abseil's default looks only in a file named after the program, and ours
// live in main.cc.) Call before absl::ParseCommandLine.
void ListOwnFlagsInHelp();

// absl::ParseCommandLine, except that a flag it refuses (unknown, or a
// value that does not parse) ends the program with exit code 2, the usage
// error of deploy/README.md's exit codes, which muster-agent does not
// restart: Abseil prints the error and exits 1, as for any failure. With
// --help, --version or their kin on the command line, Abseil's exit stays.
std::vector<char*> ParseFlags(int argc, char** argv);

}  // namespace muster

#endif  // MUSTER_COMMON_FLAG_NAMES_H_
