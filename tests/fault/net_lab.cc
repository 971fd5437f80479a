#include "tests/fault/net_lab.h"

#include <unistd.h>

#include <cstdio>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "tests/bench/process_stats.h"

namespace muster {

std::vector<std::string> InNetns(const std::string& netns) {
  if (netns.empty()) return {};
  return {"/usr/sbin/ip", "netns", "exec", netns};
}

bool NetLab::Lab(const std::string& args, std::string* out) {
  const std::string command = absl::StrCat(tool_, " ", args, " 2>&1");
  FILE* p = ::popen(command.c_str(), "r");
  if (p == nullptr) {
    error_ = "cannot run " + tool_;
    return false;
  }
  std::string text;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) text.append(buf, n);
  const int status = ::pclose(p);
  if (out != nullptr) *out = text;
  if (status != 0) {
    error_ = absl::StrCat("muster-lab ", args, ": ", absl::StripTrailingAsciiWhitespace(text));
    return false;
  }
  return true;
}

NetLab::NetLab(const NetLabOptions& options) {
  tool_ = SelfDir() + "/muster-lab";
  name_ = absl::StrCat("f", ::getpid() % 100000);
  if (::geteuid() != 0) {
    error_ = "network namespaces need root";
    return;
  }
  if (::access(tool_.c_str(), X_OK) != 0) {
    error_ = tool_ + " is missing";
    return;
  }
  Lab("gc");  // labs of earlier owners that were killed
  error_.clear();
  std::string args = absl::StrCat("up ", name_, " --nodes ", options.nodes, " --owner ", ::getpid());
  if (!options.rate.empty()) args += " --rate " + options.rate;
  if (!options.hosts.empty()) args += " --hosts " + absl::StrJoin(options.hosts, ",");
  std::string hosts;
  if (!Lab(args, &hosts)) return;
  up_ = true;
  for (absl::string_view line : absl::StrSplit(hosts, '\n', absl::SkipEmpty())) {
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (f.size() < 2) continue;
    if (!absl::StartsWith(f[0], "node")) {
      host_addresses_[f[0]] = f[1];
      continue;
    }
    namespaces_.push_back(absl::StrCat("ml", name_, "-", f[0]));
    addresses_.push_back(f[1]);
  }
  std::string gateway;
  if (!Lab("gateway " + name_, &gateway)) return;
  bridge_address_ = std::string(absl::StripAsciiWhitespace(gateway));
  if (static_cast<int>(addresses_.size()) != options.nodes) {
    error_ = "muster-lab up listed " + std::to_string(addresses_.size()) + " hosts";
  }
}

NetLab::~NetLab() {
  if (up_) Lab("down " + name_);
}

std::string NetLab::Peers(const std::vector<int>& peers) const {
  std::vector<std::string> names;
  for (int p : peers) names.push_back(absl::StrCat("node", p));
  return absl::StrJoin(names, ",");
}

std::string NetLab::HostNamespace(const std::string& host) const {
  return host_addresses_.count(host) == 0 ? "" : absl::StrCat("ml", name_, "-", host);
}

std::string NetLab::HostAddress(const std::string& host) const {
  auto it = host_addresses_.find(host);
  return it == host_addresses_.end() ? "" : it->second;
}

bool NetLab::Cut(const std::string& host) {
  return Lab(absl::StrCat("fault ", name_, " ", host, " cut"));
}

bool NetLab::Heal(const std::string& host) { return Lab(absl::StrCat("heal ", name_, " ", host)); }

bool NetLab::Verify(const std::string& host) {
  return Lab(absl::StrCat("verify ", name_, " ", host));
}

bool NetLab::Cut(int node) { return Cut(absl::StrCat("node", node)); }

bool NetLab::Isolate(int node, const std::vector<int>& peers) {
  return Lab(absl::StrCat("fault ", name_, " node", node, " isolate ", Peers(peers)));
}

bool NetLab::DropTo(int node, const std::vector<int>& peers) {
  return Lab(absl::StrCat("fault ", name_, " node", node, " drop-to ", Peers(peers)));
}

bool NetLab::IsolateFromGateway(int node) {
  return Lab(absl::StrCat("fault ", name_, " node", node, " isolate gateway"));
}

bool NetLab::Loss(int node, double percent) {
  return Lab(absl::StrCat("fault ", name_, " node", node, " loss ", percent));
}

bool NetLab::Heal(int node) { return Heal(absl::StrCat("node", node)); }

bool NetLab::Verify(int node) { return Verify(absl::StrCat("node", node)); }

}  // namespace muster
