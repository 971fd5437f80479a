// LabHosts: the hosts of a process test (trainer nodes, a coordinator, its
// standby) as hosts of a muster-lab lab (docs/lab.md), each a network
// namespace with its own address on a bridge, as on a cluster; on loopback
// where the lab cannot start (no root, no iproute2), which it says once on
// stderr.
//
// Nodes are given the lab's nodes in the order they are first asked for
// (node ids as the test names them: "a", "n0"); past the lab's count, a
// node runs in this namespace, which reaches the lab through the bridge.
// The destructor removes the lab and ends what still runs inside it.
//
// Not thread-safe: the test's thread.
#ifndef MUSTER_TESTS_INTEGRATION_LAB_HOSTS_H_
#define MUSTER_TESTS_INTEGRATION_LAB_HOSTS_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tests/fault/net_lab.h"

namespace muster {

class LabHosts {
 public:
  // `who` names the test in the loopback line; `hosts` are extra hosts
  // ("coord", "standby").
  LabHosts(const std::string& who, int nodes, const std::vector<std::string>& hosts = {});
  ~LabHosts();
  LabHosts(const LabHosts&) = delete;
  LabHosts& operator=(const LabHosts&) = delete;

  bool in_lab() const { return lab_ != nullptr; }
  // Null on loopback.
  NetLab* lab() const { return lab_.get(); }
  // Where a process of this namespace listens for the lab's hosts: the
  // bridge's address, or 127.0.0.1.
  std::string Gateway() const;
  // `argv` run on node `node`: inside its namespace in the lab, as it is
  // on loopback.
  std::vector<std::string> OnNode(const std::string& node, const std::vector<std::string>& argv);
  // The lab's node index of `node`, -1 when it runs in this namespace.
  int NodeIndex(const std::string& node);
  // `argv` run on the extra host `host`, and that host's address (as it
  // is, and 127.0.0.1, on loopback).
  std::vector<std::string> OnHost(const std::string& host,
                                  const std::vector<std::string>& argv) const;
  std::string Address(const std::string& host) const;

 private:
  std::unique_ptr<NetLab> lab_;
  std::map<std::string, int> nodes_;  // node id -> lab node
};

}  // namespace muster

#endif  // MUSTER_TESTS_INTEGRATION_LAB_HOSTS_H_
