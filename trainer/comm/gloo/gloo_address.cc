#include "trainer/comm/gloo/gloo_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace muster {
namespace {

bool IsLoopback(const sockaddr* a) {
  if (a->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(a);
    return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
  }
  if (a->sa_family == AF_INET6) {
    return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr);
  }
  return false;
}

}  // namespace

absl::StatusOr<GlooAddress> ResolveGlooAddress(const GlooAddressSources& sources,
                                               bool single_host) {
  const bool configured = !sources.configured.empty();
  const bool observed = !configured && !sources.observed.empty();
  const std::string name = configured ? sources.configured
                           : observed ? sources.observed
                                      : sources.host_name;
  const char* source = configured ? "the configured address"
                       : observed ? "the address the coordinator sees this host at"
                                  : "this host's name";
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = name.empty() ? EAI_NONAME : ::getaddrinfo(name.c_str(), nullptr, &hints, &found);
  if (rc != 0) {
    if (single_host) return GlooAddress{"127.0.0.1", ""};  // every peer is here
    return absl::InvalidArgumentError(absl::StrCat(
        source, " '", name, "' does not resolve (", ::gai_strerror(rc),
        "), and peers on other nodes must reach this one: set muster-train --address "
        "(Options::address) to this node's IP address on the job's network, or a name the "
        "other nodes resolve to it"));
  }
  // The first IPv4 address, else the first one.
  const addrinfo* pick = found;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      pick = a;
      break;
    }
  }
  char ip[INET6_ADDRSTRLEN] = "";
  const void* raw = pick->ai_family == AF_INET
                        ? static_cast<const void*>(
                              &reinterpret_cast<const sockaddr_in*>(pick->ai_addr)->sin_addr)
                        : static_cast<const void*>(
                              &reinterpret_cast<const sockaddr_in6*>(pick->ai_addr)->sin6_addr);
  ::inet_ntop(pick->ai_family, raw, ip, sizeof(ip));
  GlooAddress out{ip, ""};
  if (!single_host && IsLoopback(pick->ai_addr)) {
    // Nodes may share a host (tests, one machine split into nodes), so this
    // is not refused; on a cluster it is the /etc/hosts trap.
    const std::string what =
        observed ? absl::StrCat("the coordinator sees this host at the loopback address ", ip)
                 : absl::StrCat(source, " '", name, "' resolves to the loopback address ", ip);
    out.warning = absl::StrCat(
        what,
        ": peers on other hosts cannot reach this rank there; unless every node runs on this "
        "host, set muster-train --address (Options::address) to this node's IP address",
        observed ? ", or reach the coordinator at an address on the job's network" : "");
  }
  ::freeaddrinfo(found);
  return out;
}

std::string LoopbackHint(const std::string& error, const GlooAddress& own) {
  if (!own.warning.empty()) {
    return absl::StrCat("; this rank gave its peers the loopback address ", own.ip,
                        ", which peers on other hosts cannot reach: if they run elsewhere, set "
                        "muster-train --address (Options::address) to this node's IP address");
  }
  const bool own_loopback = absl::StartsWith(own.ip, "127.") || own.ip == "::1";
  const bool peer_loopback = error.find("[127.") != std::string::npos ||
                             error.find("[::1]") != std::string::npos;
  if (!peer_loopback || own_loopback) return "";
  return "; a peer gave a loopback address (its host name resolves to loopback there, as with "
         "Debian's 127.0.1.1 line in /etc/hosts): set muster-train --address (Options::address) "
         "on that node to its IP address";
}

absl::StatusOr<std::string> InterfaceAddress(const std::string& name) {
  ifaddrs* all = nullptr;
  if (::getifaddrs(&all) != 0) {
    return absl::UnavailableError(absl::StrCat("getifaddrs: ", std::strerror(errno)));
  }
  std::string v4, v6;
  std::set<std::string> names;
  for (const ifaddrs* a = all; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr) continue;
    names.insert(a->ifa_name);
    if (name != a->ifa_name) continue;
    char text[INET6_ADDRSTRLEN] = {};
    if (a->ifa_addr->sa_family == AF_INET && v4.empty()) {
      ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(a->ifa_addr)->sin_addr, text,
                  sizeof(text));
      v4 = text;
    } else if (a->ifa_addr->sa_family == AF_INET6 && v6.empty()) {
      ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(a->ifa_addr)->sin6_addr, text,
                  sizeof(text));
      v6 = text;
    }
  }
  ::freeifaddrs(all);
  if (!v4.empty()) return v4;
  if (!v6.empty()) return v6;
  return absl::NotFoundError(absl::StrCat("network interface '", name,
                                          "' has no address; interfaces here: ",
                                          absl::StrJoin(names, ", ")));
}

}  // namespace muster
