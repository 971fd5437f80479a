// NetLab: trainer nodes as hosts in their own network namespaces, joined by a
// Linux bridge in this namespace (which holds the coordinator), so that faults
// can be put on one node's link: `tc netem` delay and loss, or a cut.
//
// Needs root and iproute2; ok() is false (error() says why) where namespaces
// cannot be made. Everything it made is removed by the destructor.
// Not thread-safe.
#ifndef MUSTER_TESTS_FAULT_NET_LAB_H_
#define MUSTER_TESTS_FAULT_NET_LAB_H_

#include <string>
#include <vector>

namespace muster {

class NetLab {
 public:
  explicit NetLab(int nodes);
  ~NetLab();
  NetLab(const NetLab&) = delete;
  NetLab& operator=(const NetLab&) = delete;

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  const std::vector<std::string>& namespaces() const { return namespaces_; }
  const std::vector<std::string>& addresses() const { return addresses_; }
  const std::string& bridge_address() const { return bridge_address_; }

  // Takes node `i`'s link down (a partition).
  void Cut(int i);
  // Puts `netem` ("delay 20ms loss 1%") on node `i`'s interface.
  void Slow(int i, const std::string& netem);
  // Link up, no netem.
  void Restore(int i);

 private:
  bool Sh(const std::string& command);

  std::string tag_, bridge_, bridge_address_, error_;
  std::vector<std::string> namespaces_, addresses_, veths_;
};

}  // namespace muster

#endif  // MUSTER_TESTS_FAULT_NET_LAB_H_
