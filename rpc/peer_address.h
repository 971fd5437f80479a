// The address a gRPC call arrives from, as a host that peers can dial: what
// a member that is not told its own address gives its peers (the
// coordinator sees every member's connection; JoinResponse.observed_host).
#ifndef MUSTER_RPC_PEER_ADDRESS_H_
#define MUSTER_RPC_PEER_ADDRESS_H_

#include <grpcpp/grpcpp.h>

#include <string>

#include "absl/strings/string_view.h"

namespace muster {

// The host of `peer`, as grpc::ServerContext::peer() writes it:
//   "ipv4:10.1.2.3:41000"        -> "10.1.2.3"
//   "ipv6:[fd00::7]:41000"       -> "fd00::7" (brackets off; also when
//                                   percent-encoded, "%5B...%5D")
//   "ipv6:[::ffff:10.1.2.3]:4"   -> "10.1.2.3" (IPv4 through a dual-stack listener)
//   "unix:/run/x.sock", "unix-abstract:x"
//                                -> "127.0.0.1" (a Unix socket's caller is on this host)
// and "" for anything else (unknown: the caller keeps its own default).
// Pure; thread-safe.
std::string PeerHost(absl::string_view peer);

// The metadata entry in which a relay (muster-relay) names the host its own
// caller's connection came from, since the coordinator sees only the relay.
// It is taken from any call that passes the job token: it lets a caller
// claim no more than an explicit JoinRequest.state_address already does
// (docs/relay.md).
inline constexpr char kForwardedHostMetadata[] = "muster-forwarded-host";

// The host a call came from: the numeric host named in kForwardedHostMetadata
// when a relay set it, else PeerHost(context.peer()).
std::string CallerHost(const grpc::ServerContextBase& context);

// "host:port" that gRPC and Gloo can dial: an IPv6 host in brackets.
std::string JoinHostPort(absl::string_view host, absl::string_view port);

}  // namespace muster

#endif  // MUSTER_RPC_PEER_ADDRESS_H_
