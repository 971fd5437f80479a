// Command-line spelling: muster's flags are documented with dashes
// (--state-dir) while Abseil's flag names use underscores (state_dir).
#ifndef MUSTER_COMMON_FLAG_NAMES_H_
#define MUSTER_COMMON_FLAG_NAMES_H_

namespace muster {

// Rewrites, in place, every argument of the form --a-b[=value] before the
// first bare "--" into --a_b[=value]. Values are left alone.
void DashesToUnderscores(int argc, char** argv);

}  // namespace muster

#endif  // MUSTER_COMMON_FLAG_NAMES_H_
