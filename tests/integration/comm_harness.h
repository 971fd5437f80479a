// CommHarness: W members as threads against an in-process coordinator,
// each with a real CoordinatorClient (join, session, rendezvous) and a real
// communicator built through the coordinator's KV.
#ifndef MUSTER_TESTS_INTEGRATION_COMM_HARNESS_H_
#define MUSTER_TESTS_INTEGRATION_COMM_HARNESS_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "coordinator/server.h"
#include "trainer/client/coordinator_store.h"
#include "trainer/comm/factory.h"

namespace muster {

// Node of each rank, e.g. {0,0,1,1} for 2x2 or {0,0,0,1} for 3+1.
using NodeSplit = std::vector<int>;

struct RankContext {
  int index = 0;  // thread index (not necessarily the rank)
  WorldInfo world;
  std::unique_ptr<CoordinatorClient> client;
  std::unique_ptr<Store> store;
  std::unique_ptr<Communicator> comm;
};

class CommHarness {
 public:
  explicit CommHarness(NodeSplit split, std::string job = "test");
  ~CommHarness();

  // Joins every member, forms the world and builds every communicator with
  // `options` (clients and communicators on RealClock, whatever
  // options.clock says), then runs `body` on one thread per member and
  // joins them.
  // Returns the first error of setup (bodies report through gtest).
  absl::Status Run(const CommOptions& options,
                   const std::function<void(RankContext&)>& body);

  CoordinatorServer* server() { return server_.get(); }
  int size() const { return static_cast<int>(split_.size()); }

 private:
  NodeSplit split_;
  std::string job_;
  std::unique_ptr<CoordinatorServer> server_;
};

// Deterministic test data: exact in float16/bfloat16 sums for up to 8 ranks.
float TestValue(int rank, size_t i);

}  // namespace muster

#endif  // MUSTER_TESTS_INTEGRATION_COMM_HARNESS_H_
