// A test's scratch folder under ::testing::TempDir(): its logs, checkpoints
// and state dirs. Header-only.
#ifndef MUSTER_TESTS_INTEGRATION_SCRATCH_DIR_H_
#define MUSTER_TESTS_INTEGRATION_SCRATCH_DIR_H_

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

namespace muster {

// Removes `dir` when the running test has passed so far; keeps it when the
// test failed, for its logs, or when MUSTER_KEEP is set (as muster-fault
// and the benches keep their trial folders). Call it from TearDown after every process that
// writes there has ended. A passing suite left gigabytes of checkpoints in
// /tmp without it.
inline void RemoveScratchUnlessFailed(const std::string& dir) {
  if (dir.empty() || ::testing::Test::HasFailure() || std::getenv("MUSTER_KEEP") != nullptr) {
    return;
  }
  std::error_code ignored;  // a leftover fails no test
  std::filesystem::remove_all(dir, ignored);
}

}  // namespace muster

#endif  // MUSTER_TESTS_INTEGRATION_SCRATCH_DIR_H_
