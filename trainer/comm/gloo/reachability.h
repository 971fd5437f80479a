// ReachabilityProbe: which peers of a group this rank can open a TCP
// connection to, on the address it gives Gloo, within a short timeout.
//
// A failed collective or a Gloo connect that times out says nothing about
// whom it could not reach, so a world whose nodes lost the link between
// them (the data network's port, with the control network up) would be
// formed again with the same members, over and over. The probe gives the
// evidence: each rank listens on its Gloo address, publishes it with its
// world rank in the group's store, and connects to every peer. A peer that
// answers, with a connection or a refusal, is reachable; one that neither
// answers nor refuses within the timeout is not. A one-way loss fails the
// handshake both ways, so both sides see it. The trainer reports the
// unreachable peers' world ranks with the broken world
// (RendezvousRequest.broken.unreachable_ranks), and the coordinator leaves
// someone out (docs/elastic.md, "Peers that cannot reach each other").
//
// Thread-safety: Unreachable() from one thread at a time; the listener's
// thread accepts and closes connections until destruction.
#ifndef MUSTER_TRAINER_COMM_GLOO_REACHABILITY_H_
#define MUSTER_TRAINER_COMM_GLOO_REACHABILITY_H_

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "trainer/comm/store.h"

namespace muster {

class ReachabilityProbe {
 public:
  // Listens on `ip` (numeric, v4 or v6), publishes the address under
  // "probe/<rank>" in `store` and waits for every rank's. `world_rank`: this
  // rank's place in the world, which peers report. `deadline` is a time of
  // `clock`'s Now(), which also times Unreachable(); `clock`: required, not
  // owned, must outlive the probe. Errors: the store's; UNAVAILABLE when
  // `ip` cannot be listened on.
  static absl::StatusOr<std::unique_ptr<ReachabilityProbe>> Start(Store* store,
                                                                  const std::string& ip,
                                                                  int rank, int size,
                                                                  int world_rank,
                                                                  absl::Time deadline,
                                                                  Clock* clock);
  ~ReachabilityProbe();
  ReachabilityProbe(const ReachabilityProbe&) = delete;
  ReachabilityProbe& operator=(const ReachabilityProbe&) = delete;

  // The world ranks of the peers that did not answer within `timeout`
  // (ascending). Two connections per peer, so that one lost SYN on a lossy
  // link does not make a peer unreachable.
  std::vector<int> Unreachable(absl::Duration timeout) const;

  // "10.0.0.3:41234 (world rank 2)" for logs.
  std::string Describe(int world_rank) const;

 private:
  struct Peer {
    int world_rank = -1;
    std::string ip;
    int port = 0;
  };
  ReachabilityProbe(int listen_fd, int stop_fd_read, int stop_fd_write, int rank,
                    Clock* clock);
  void Accept();

  const int listen_fd_;
  const int stop_read_, stop_write_;  // a pipe that ends Accept()
  const int rank_;
  Clock* const clock_;
  std::vector<Peer> peers_;  // by group rank; this rank's own entry included
  std::thread acceptor_;
};

}  // namespace muster

#endif  // MUSTER_TRAINER_COMM_GLOO_REACHABILITY_H_
