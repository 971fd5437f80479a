// The options of a program the in-process tests run as threads. Header-only.
#ifndef MUSTER_TESTS_INTEGRATION_QUIET_OPTIONS_H_
#define MUSTER_TESTS_INTEGRATION_QUIET_OPTIONS_H_

#include <string>

#include "muster/options.h"

namespace muster {

// Against the in-process coordinator on `port`, as job `job`: 64 examples,
// 8 per rank, no signal handlers (ranks are threads), no output, no state
// service.
inline Options QuietOptions(int port, const std::string& job) {
  Options o;
  o.coordinator = "127.0.0.1:" + std::to_string(port);
  o.job = job;
  o.dataset_size = 64;
  o.batch_per_rank = 8;
  o.handle_signals = false;
  o.quiet = true;
  o.state_listen = "";
  return o;
}

}  // namespace muster

#endif  // MUSTER_TESTS_INTEGRATION_QUIET_OPTIONS_H_
