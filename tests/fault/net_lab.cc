#include "tests/fault/net_lab.h"

#include <unistd.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace muster {

bool NetLab::Sh(const std::string& command) {
  return std::system((command + " >/dev/null 2>&1").c_str()) == 0;
}

NetLab::NetLab(int nodes) {
  const int id = ::getpid() % 10000;
  tag_ = absl::StrCat("mf", id);
  bridge_ = tag_ + "br";
  const std::string subnet = absl::StrCat("10.77.", id % 250, ".");
  bridge_address_ = subnet + "1";
  if (::geteuid() != 0) {
    error_ = "network namespaces need root";
    return;
  }
  if (!Sh("ip link add " + bridge_ + " type bridge") ||
      !Sh("ip addr add " + bridge_address_ + "/24 dev " + bridge_) ||
      !Sh("ip link set " + bridge_ + " up")) {
    error_ = "cannot create a bridge (ip link add type bridge)";
    return;
  }
  for (int i = 0; i < nodes; ++i) {
    const std::string ns = absl::StrCat(tag_, "n", i);
    const std::string veth = absl::StrCat(tag_, "v", i);
    const std::string addr = absl::StrCat(subnet, i + 2);
    if (!Sh("ip netns add " + ns)) {
      error_ = "cannot create a network namespace (ip netns add)";
      return;
    }
    namespaces_.push_back(ns);
    if (!Sh("ip link add " + veth + " type veth peer name eth0 netns " + ns)) {
      error_ = "cannot create a veth pair";
      return;
    }
    veths_.push_back(veth);
    if (!Sh("ip link set " + veth + " master " + bridge_ + " up") ||
        !Sh("ip -n " + ns + " addr add " + addr + "/24 dev eth0") ||
        !Sh("ip -n " + ns + " link set eth0 up") || !Sh("ip -n " + ns + " link set lo up")) {
      error_ = "cannot configure " + ns;
      return;
    }
    addresses_.push_back(addr);
  }
}

NetLab::~NetLab() {
  for (const std::string& ns : namespaces_) Sh("ip netns del " + ns);
  for (const std::string& v : veths_) Sh("ip link del " + v);
  Sh("ip link del " + bridge_);
}

void NetLab::Cut(int i) { Sh("ip link set " + veths_[i] + " down"); }

void NetLab::Slow(int i, const std::string& netem) {
  Sh("ip netns exec " + namespaces_[i] + " tc qdisc replace dev eth0 root netem " + netem);
}

void NetLab::Restore(int i) {
  Sh("ip link set " + veths_[i] + " up");
  Sh("ip netns exec " + namespaces_[i] + " tc qdisc del dev eth0 root");
}

}  // namespace muster
