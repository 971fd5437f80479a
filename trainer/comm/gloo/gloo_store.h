// GlooStore: Gloo's rendezvous store interface over a muster Store, so Gloo
// bootstraps through the coordinator's KV. Gloo's interface has no status
// results: failures are thrown as gloo::IoException and caught by the
// communicator that called into Gloo. Thread-safe.
#ifndef MUSTER_TRAINER_COMM_GLOO_GLOO_STORE_H_
#define MUSTER_TRAINER_COMM_GLOO_GLOO_STORE_H_

#include <gloo/rendezvous/store.h>

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/clock.h"
#include "trainer/comm/store.h"

namespace muster {

class GlooStore : public gloo::rendezvous::Store {
 public:
  // Waits end at `deadline`, a time of `clock`'s Now(), at the latest.
  // `clock`: required, not owned, must outlive this.
  GlooStore(muster::Store* store, absl::Time deadline, Clock* clock)
      : store_(store), deadline_(deadline), clock_(clock) {}

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  muster::Store* const store_;
  const absl::Time deadline_;
  Clock* const clock_;
};

}  // namespace muster

#endif  // MUSTER_TRAINER_COMM_GLOO_GLOO_STORE_H_
