// An in-process coordinator for tests whose translation units also include
// LibTorch (whose bundled protobuf headers clash with the system's): this
// header carries no gRPC.
#ifndef MUSTER_TESTS_INTEGRATION_COORDINATOR_FIXTURE_H_
#define MUSTER_TESTS_INTEGRATION_COORDINATOR_FIXTURE_H_

#include <memory>
#include <string>

namespace muster {

class InProcessCoordinator {
 public:
  // min = max = world (min = `min_members` where above 0); no last call;
  // plain text, no token. `state_dir` empty: state in memory; otherwise
  // restartable on that dir.
  static std::unique_ptr<InProcessCoordinator> Start(int world, int keep_last = 3,
                                                     const std::string& state_dir = "",
                                                     int min_members = 0);
  ~InProcessCoordinator();
  int port() const;
  // The coordinator's /metrics text as of now (its counters taken afresh).
  std::string MetricsText();

 private:
  struct Impl;
  explicit InProcessCoordinator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace muster

#endif  // MUSTER_TESTS_INTEGRATION_COORDINATOR_FIXTURE_H_
