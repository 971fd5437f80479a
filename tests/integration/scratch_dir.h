// A test's scratch folder under ::testing::TempDir(): its logs, checkpoints
// and state dirs. Header-only.
#ifndef MUSTER_TESTS_INTEGRATION_SCRATCH_DIR_H_
#define MUSTER_TESTS_INTEGRATION_SCRATCH_DIR_H_

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace muster {

// Removes `dir` when the running test has passed so far; keeps it when the
// test failed, for its logs. Call it from TearDown after every process that
// writes there has ended. A passing suite left gigabytes of checkpoints in
// /tmp without it.
inline void RemoveScratchUnlessFailed(const std::string& dir) {
  if (dir.empty() || ::testing::Test::HasFailure()) return;
  std::error_code ignored;  // a leftover fails no test
  std::filesystem::remove_all(dir, ignored);
}

}  // namespace muster

#endif  // MUSTER_TESTS_INTEGRATION_SCRATCH_DIR_H_
