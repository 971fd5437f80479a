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

// Resolves `configured` (Options::address / muster-train --address), or
// this host's name `host_name` when it is empty. `single_host`: every rank
// of the communicator runs on this host (one node), where loopback serves
// when the name does not resolve. Errors: INVALID_ARGUMENT naming the name
// and the flag to set, when it does not resolve and peers are elsewhere.
absl::StatusOr<GlooAddress> ResolveGlooAddress(const std::string& configured,
                                               const std::string& host_name, bool single_host);

// What to add to the error of a Gloo connect that failed (`error`, Gloo's
// message) when a loopback address is the likely cause, "" otherwise: this
// rank's own (`own` carries the loopback warning), or a peer's (`error`
// names an address in 127.0.0.0/8 or ::1 while this rank's is not one). A
// loopback address with peers on one host is legitimate (nodes that share a
// machine), so it is explained on failure rather than refused up front.
std::string LoopbackHint(const std::string& error, const GlooAddress& own);

}  // namespace muster

#endif  // MUSTER_TRAINER_COMM_GLOO_GLOO_ADDRESS_H_
