// One process's wall clock stepped by libfaketime (Debian's faketime), the
// monotonic clock left alone, as NTP's step or a VM's resume moves it.
#ifndef MUSTER_TESTS_INTEGRATION_FAKE_TIME_H_
#define MUSTER_TESTS_INTEGRATION_FAKE_TIME_H_

#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace muster {

inline constexpr char kFakeTime[] = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

inline bool HaveFakeTime() { return ::access(kFakeTime, R_OK) == 0; }

// `argv` (and the processes it starts) with its wall clock offset by what
// `offset_file` holds ("+0", "-60s"), read again every second. libfaketime
// cannot move the kernel's own clock, so a step forward also stands for a
// real step back to the waits that the kernel times on the wall clock:
// their deadlines then lie a minute ahead of it.
inline std::vector<std::string> Stepped(const std::string& offset_file,
                                        std::vector<std::string> argv) {
  std::ofstream(offset_file) << "+0\n";
  std::vector<std::string> out = {"/usr/bin/env", absl::StrCat("LD_PRELOAD=", kFakeTime),
                                  "FAKETIME_TIMESTAMP_FILE=" + offset_file,
                                  "FAKETIME_CACHE_DURATION=1", "DONT_FAKE_MONOTONIC=1"};
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

// Steps the clock of the processes started with `offset_file`, and waits
// until they have read the step.
inline void Step(const std::string& offset_file, const std::string& offset) {
  std::ofstream(offset_file) << offset << "\n";
  absl::SleepFor(absl::Milliseconds(1500));
}

}  // namespace muster

#endif  // MUSTER_TESTS_INTEGRATION_FAKE_TIME_H_
