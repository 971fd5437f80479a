// NetLab: a muster-lab lab (deploy/lab/muster-lab, docs/lab.md) owned by
// this process: trainer nodes as hosts in network namespaces of their own
// on a bridge whose address in this namespace serves the coordinator.
// Faults go on one node: its links cut, the packets between it and some
// peers dropped (both ways or one), or a share of its packets lost.
//
// Needs root and iproute2 (nft for all but Cut); ok() is false, error()
// says why, where the lab cannot start. The destructor removes the lab;
// a lab whose owner was killed is removed by the next NetLab (muster-lab
// gc). Not thread-safe.
#ifndef MUSTER_TESTS_FAULT_NET_LAB_H_
#define MUSTER_TESTS_FAULT_NET_LAB_H_

#include <map>
#include <string>
#include <vector>

namespace muster {

// The command prefix that runs a program in network namespace `netns`
// (`ip netns exec NETNS`, which execs it: the pid is the program's own);
// none for "" (this namespace).
std::vector<std::string> InNetns(const std::string& netns);

struct NetLabOptions {
  int nodes = 2;
  std::string rate;  // each node link's rate each way ("1gbit"; "" for none)
  // Hosts besides the nodes, each a namespace of its own ("coord", "relay0").
  std::vector<std::string> hosts;
};

class NetLab {
 public:
  explicit NetLab(const NetLabOptions& options);
  explicit NetLab(int nodes) : NetLab(NetLabOptions{nodes, "", {}}) {}
  ~NetLab();
  NetLab(const NetLab&) = delete;
  NetLab& operator=(const NetLab&) = delete;

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  const std::string& name() const { return name_; }
  const std::vector<std::string>& namespaces() const { return namespaces_; }
  const std::vector<std::string>& addresses() const { return addresses_; }
  const std::string& bridge_address() const { return bridge_address_; }
  // An extra host's namespace and address ("" for a host the lab lacks).
  std::string HostNamespace(const std::string& host) const;
  std::string HostAddress(const std::string& host) const;

  // Each returns false (error() says why) when the fault could not be put
  // in place.
  bool Cut(int node);                                 // its links down
  bool Isolate(int node, const std::vector<int>& peers);  // nothing between them
  bool DropTo(int node, const std::vector<int>& peers);   // node -> peers only
  bool IsolateFromGateway(int node);                  // nothing to or from this namespace
  bool Loss(int node, double percent);                // each way
  bool Heal(int node);                                // links up, faults removed
  // Whether every fault on `node` took effect (a link down, each rule's
  // counter above 0); false with error() saying which did not.
  bool Verify(int node);
  // The same for any host of the lab, by name ("node1", "coord").
  bool Cut(const std::string& host);
  bool Heal(const std::string& host);
  bool Verify(const std::string& host);

 private:
  bool Lab(const std::string& args, std::string* out = nullptr);
  std::string Peers(const std::vector<int>& peers) const;

  std::string tool_, name_, bridge_address_, error_;
  std::vector<std::string> namespaces_, addresses_;
  std::map<std::string, std::string> host_addresses_;  // the extra hosts
  bool up_ = false;
};

}  // namespace muster

#endif  // MUSTER_TESTS_FAULT_NET_LAB_H_
