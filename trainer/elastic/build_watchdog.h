// BuildWatchdog: ends the process if building a communicator hangs.
//
// Gloo's connect can block past its own timeout when a peer vanishes in the
// middle of it, and nothing wakes it. A trainer stuck there would hold up
// its whole world, so it gives up as a process instead (crash-only): its
// agent restarts it and it takes a live peer's state.
//
// Construct it before the build and destroy it after; meanwhile a thread
// checks every 100 ms. If the build outlives `deadline`, or
// `superseded_grace` (ElasticWorld: 10 s) past the first moment
// `superseded()` returned true (a newer world exists), it logs
// why and calls std::_Exit(kExitCode). `superseded` runs on that thread.
// Time is `clock`'s monotonic Now(), and `deadline` must be a time of that
// same clock (a FakeClock in tests: no test sleeps through a deadline); a
// wall clock step moves neither. The checks still come every 100 ms of real
// time.
#ifndef MUSTER_TRAINER_ELASTIC_BUILD_WATCHDOG_H_
#define MUSTER_TRAINER_ELASTIC_BUILD_WATCHDOG_H_

#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/mutex.h"

namespace muster {

class BuildWatchdog {
 public:
  static constexpr int kExitCode = 70;  // sysexits.h EX_SOFTWARE

  // `clock`: required, not owned, must outlive this.
  BuildWatchdog(absl::Time deadline, std::function<bool()> superseded,
                absl::Duration superseded_grace, Clock* clock);
  ~BuildWatchdog();
  BuildWatchdog(const BuildWatchdog&) = delete;
  BuildWatchdog& operator=(const BuildWatchdog&) = delete;

 private:
  void Watch(absl::Time deadline, std::function<bool()> superseded, absl::Duration grace,
             Clock* clock);

  // The destructor sets done_ under mu_ and wakes cv_, so that the watching
  // thread, which waits on cv_ under mu_, cannot miss it.
  Mutex mu_;
  CondVar cv_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace muster

#endif  // MUSTER_TRAINER_ELASTIC_BUILD_WATCHDOG_H_
