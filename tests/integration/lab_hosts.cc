#include "tests/integration/lab_hosts.h"

#include <iostream>

namespace muster {

LabHosts::LabHosts(const std::string& who, int nodes, const std::vector<std::string>& hosts)
    : lab_(std::make_unique<NetLab>(NetLabOptions{nodes, "", hosts})) {
  if (!lab_->ok()) {
    std::cerr << who << ": hosts share loopback: " << lab_->error() << "\n";
    lab_.reset();
  }
}

LabHosts::~LabHosts() = default;

std::string LabHosts::Gateway() const {
  return lab_ != nullptr ? lab_->bridge_address() : "127.0.0.1";
}

int LabHosts::NodeIndex(const std::string& node) {
  if (lab_ == nullptr) return -1;
  auto it = nodes_.find(node);
  if (it != nodes_.end()) return it->second;
  const int next = static_cast<int>(nodes_.size());
  const int index = next < static_cast<int>(lab_->namespaces().size()) ? next : -1;
  nodes_[node] = index;
  return index;
}

namespace {

std::vector<std::string> Prefixed(std::vector<std::string> prefix,
                                  const std::vector<std::string>& argv) {
  prefix.insert(prefix.end(), argv.begin(), argv.end());
  return prefix;
}

}  // namespace

std::vector<std::string> LabHosts::OnNode(const std::string& node,
                                          const std::vector<std::string>& argv) {
  const int index = NodeIndex(node);
  return Prefixed(index < 0 ? std::vector<std::string>{} : InNetns(lab_->namespaces()[index]),
                  argv);
}

std::vector<std::string> LabHosts::OnHost(const std::string& host,
                                          const std::vector<std::string>& argv) const {
  return Prefixed(lab_ != nullptr ? InNetns(lab_->HostNamespace(host)) : std::vector<std::string>{},
                  argv);
}

std::string LabHosts::Address(const std::string& host) const {
  return lab_ != nullptr ? lab_->HostAddress(host) : "127.0.0.1";
}

}  // namespace muster
