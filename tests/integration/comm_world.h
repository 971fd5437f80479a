// RunCommWorld: ranks as threads over a real communicator (CommHarness: an
// in-process coordinator, real clients, the coordinator's KV), for tests
// whose translation units hold LibTorch and must not include gRPC or Gloo
// headers.
#ifndef MUSTER_TESTS_INTEGRATION_COMM_WORLD_H_
#define MUSTER_TESTS_INTEGRATION_COMM_WORLD_H_

#include <functional>
#include <string>

#include <vector>

#include "absl/status/status.h"
#include "muster/backend.h"
#include "trainer/comm/communicator.h"

namespace muster {

// Runs body(rank, comm) on `world` ranks of one node with `backend` ("shm"
// or "gloo" over 127.0.0.1). Returns the first setup error; bodies report
// through gtest.
absl::Status RunCommWorld(int world, const std::string& backend,
                          const std::function<void(int rank, Communicator* comm)>& body);

// The same over several nodes: member i joins from node `node_of[i]`
// (e.g. {0, 0, 1, 1}: two nodes of two; the coordinator assigns the
// ranks), with `backend` ("hier", "gloo") and gradients carried across
// nodes as `compression` says.
absl::Status RunCommWorld(const std::vector<int>& node_of, const std::string& backend,
                          GradientCompression compression,
                          const std::function<void(int rank, Communicator* comm)>& body);

}  // namespace muster

#endif  // MUSTER_TESTS_INTEGRATION_COMM_WORLD_H_
