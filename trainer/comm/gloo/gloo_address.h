// The address a rank gives Gloo, checked before Gloo sees it: Debian's Gloo
// dereferences a failed name lookup (SIGSEGV in CreateDeviceAttr) and
// listens wherever the host name points, loopback included.
#ifndef MUSTER_TRAINER_COMM_GLOO_GLOO_ADDRESS_H_
#define MUSTER_TRAINER_COMM_GLOO_GLOO_ADDRESS_H_

#include <string>

#include "absl/status/statusor.h"

namespace muster {

struct GlooAddress {
  std::string ip;       // numeric: what Gloo binds and announces
  std::string warning;  // non-empty: log it (a loopback address with remote peers)
};

// Where a rank's address comes from, first non-empty wins.
struct GlooAddressSources {
  std::string configured;  // Options::address / muster-train --address
  std::string observed;    // this host's IP address as the coordinator sees it
  std::string host_name;   // this host's name
};

// Resolves the first source that is set. `single_host`: every rank of the
// communicator runs on this host (one node), where loopback serves when the
// name does not resolve. Errors: INVALID_ARGUMENT naming the name and the
// flag to set, when it does not resolve and peers are elsewhere. A loopback
// result with peers elsewhere is returned with a warning (nodes may share a
// host: tests, one machine split into nodes).
absl::StatusOr<GlooAddress> ResolveGlooAddress(const GlooAddressSources& sources,
                                               bool single_host);

// What to add to the error of a Gloo connect that failed (`error`, Gloo's
// message) when a loopback address is the likely cause, "" otherwise: this
// rank's own (`own` carries the loopback warning), or a peer's (`error`
// names an address in 127.0.0.0/8 or ::1 while this rank's is not one). A
// loopback address with peers on one host is legitimate (nodes that share a
// machine), so it is explained on failure rather than refused up front.
std::string LoopbackHint(const std::string& error, const GlooAddress& own);

// The first IPv4 address (else IPv6) of network interface `name` ("ib0",
// "eth1"). Errors: NOT_FOUND naming the interface and those that exist.
absl::StatusOr<std::string> InterfaceAddress(const std::string& name);

}  // namespace muster

#endif  // MUSTER_TRAINER_COMM_GLOO_GLOO_ADDRESS_H_
