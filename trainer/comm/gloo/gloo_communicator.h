// Gloo over TCP: the CPU communicator across nodes. Bootstrapped through a
// Store (the coordinator's KV). Gloo's exceptions end here and become
// Statuses: an IoException (a peer closed or reset its connection) is
// ABORTED, a timeout is DEADLINE_EXCEEDED.
//
// Collectives run on a worker thread so that Abort() and deadlines return
// to the caller at once even while Gloo is blocked on a hung peer; the
// blocked transfer then ends at its own timeout (the call's deadline), and
// the sockets and the worker are released in the background.
#ifndef MUSTER_TRAINER_COMM_GLOO_GLOO_COMMUNICATOR_H_
#define MUSTER_TRAINER_COMM_GLOO_GLOO_COMMUNICATOR_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "trainer/comm/communicator.h"
#include "trainer/comm/store.h"

namespace muster {

struct GlooOptions {
  // Address other ranks reach this one at (host name or IP of the node's
  // fast network: Options::address); "" for observed_host, else this
  // host's name.
  std::string hostname;
  // This host's address as the coordinator sees it (an IP address; "" when
  // unknown): the default when `hostname` is empty.
  std::string observed_host;
  // Network interface whose address to use instead of a host name ("" for
  // none): the data network's, e.g. "ib0" (Options::interface).
  std::string iface;
  // This rank's place in the world, which a peer that cannot reach it
  // reports (-1: its rank in this group).
  int world_rank = -1;
  // How long a peer may take to answer the reachability probe
  // (reachability.h) before it counts as unreachable.
  absl::Duration probe_timeout = absl::Milliseconds(1500);
  // Every rank runs on this host (one node): loopback serves when the name
  // does not resolve (gloo_address.h).
  bool single_host = false;
  // Deadlines are times of its Now(); it also times the reachability probe.
  // Required, not owned, must outlive the communicator.
  Clock* clock = nullptr;
};

// Connects `size` ranks (full mesh) by `deadline`, a time of
// options.clock's Now(). Errors: DEADLINE_EXCEEDED (a rank did not show
// up), ABORTED/UNAVAILABLE (connection failures), INVALID_ARGUMENT.
absl::StatusOr<std::unique_ptr<Communicator>> NewGlooCommunicator(Store* store, int rank,
                                                                  int size,
                                                                  const GlooOptions& options,
                                                                  absl::Time deadline);

}  // namespace muster

#endif  // MUSTER_TRAINER_COMM_GLOO_GLOO_COMMUNICATOR_H_
