#include "rpc/peer_address.h"

#include <arpa/inet.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"

namespace muster {
namespace {

// `text` when it is a numeric address of `family`, else "".
std::string Numeric(int family, const std::string& text) {
  unsigned char buf[sizeof(in6_addr)];
  return ::inet_pton(family, text.c_str(), buf) == 1 ? text : std::string();
}

}  // namespace

std::string PeerHost(absl::string_view peer) {
  if (absl::StartsWith(peer, "unix:") || absl::StartsWith(peer, "unix-abstract:")) {
    return "127.0.0.1";
  }
  if (absl::ConsumePrefix(&peer, "ipv4:")) {
    const size_t colon = peer.rfind(':');
    if (colon == absl::string_view::npos) return "";
    return Numeric(AF_INET, std::string(peer.substr(0, colon)));
  }
  if (!absl::ConsumePrefix(&peer, "ipv6:")) return "";
  const std::string decoded =
      absl::StrReplaceAll(peer, {{"%5B", "["}, {"%5b", "["}, {"%5D", "]"}, {"%5d", "]"},
                                 {"%25", "%"}});
  absl::string_view rest = decoded;
  if (!absl::ConsumePrefix(&rest, "[")) return "";
  const size_t close = rest.find(']');
  if (close == absl::string_view::npos) return "";
  std::string host(rest.substr(0, close));
  const size_t zone = host.find('%');  // fe80::1%eth0: the zone is local to this host
  if (zone != std::string::npos) host.resize(zone);
  constexpr absl::string_view kMapped = "::ffff:";
  if (absl::StartsWithIgnoreCase(host, kMapped)) {
    const std::string v4 = Numeric(AF_INET, host.substr(kMapped.size()));
    if (!v4.empty()) return v4;
  }
  return Numeric(AF_INET6, host);
}

std::string CallerHost(const grpc::ServerContextBase& context) {
  const auto& md = context.client_metadata();
  if (auto it = md.find(kForwardedHostMetadata); it != md.end()) {
    const std::string host(it->second.data(), it->second.size());
    // Only a numeric address: the value is copied into the world's
    // addresses, which peers dial.
    if (!Numeric(AF_INET, host).empty() || !Numeric(AF_INET6, host).empty()) return host;
  }
  return PeerHost(context.peer());
}

std::string JoinHostPort(absl::string_view host, absl::string_view port) {
  if (host.find(':') != absl::string_view::npos) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

}  // namespace muster
