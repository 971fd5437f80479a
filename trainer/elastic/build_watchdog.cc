#include "trainer/elastic/build_watchdog.h"

#include <cstdlib>

#include "common/logging.h"

namespace muster {

BuildWatchdog::BuildWatchdog(absl::Time deadline, std::function<bool()> superseded,
                             absl::Duration superseded_grace, Clock* clock)
    : thread_(&BuildWatchdog::Watch, this, deadline, std::move(superseded), superseded_grace,
              clock) {}

BuildWatchdog::~BuildWatchdog() {
  {
    MutexLock lock(&mu_);
    done_ = true;
  }
  cv_.NotifyAll();
  thread_.join();
}

void BuildWatchdog::Watch(absl::Time deadline, std::function<bool()> superseded,
                          absl::Duration grace, Clock* clock) {
  absl::Time superseded_at = absl::InfiniteFuture();
  MutexLock lock(&mu_);
  while (!done_) {
    cv_.WaitFor(&mu_, absl::Milliseconds(100));
    if (done_) return;
    const absl::Time now = clock->Now();
    if (superseded_at == absl::InfiniteFuture() && superseded()) superseded_at = now;
    if (now > deadline || now > superseded_at + grace) {
      MUSTER_LOG(ERROR) << "building the communicator hangs ("
                        << (now > deadline ? "past its deadline" : "a newer world exists")
                        << "); exiting so that this trainer is restarted";
      std::_Exit(kExitCode);
    }
  }
}

}  // namespace muster
