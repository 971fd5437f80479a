// Actions: callbacks collected while a lock is held and run after it is
// released, so that completions (which may re-enter the coordinator or write
// to a stream) never run under the coordinator's mutex. They run inside one
// WriteBatch (common/write_batch.h): what they write to a node stream is
// sent as one message.
//
// Decision: the one way the coordinator takes its lock for a decision. It
// locks for the scope and, at its end, releases the lock and only then runs
// the actions collected under it. That order is the guard's, not two lines'
// at every call site: no action (and no wait for durability) can run under
// the lock.
//
// Not thread-safe; one per call.
#ifndef MUSTER_COORDINATOR_ACTIONS_H_
#define MUSTER_COORDINATOR_ACTIONS_H_

#include <functional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/write_batch.h"

namespace muster {

class Actions {
 public:
  Actions() = default;
  // `gate` runs after the lock is released and before the first action,
  // when there are actions: the coordinator waits there until its
  // decisions are durable (see persister.h). When it returns false (they
  // could not be made durable) the actions are dropped: nothing that was
  // not written is announced. Calls they would have answered end with the
  // coordinator, which stops serving then (Coordinator::AwaitDurable).
  explicit Actions(std::function<bool()> gate) : gate_(std::move(gate)) {}
  Actions(const Actions&) = delete;
  Actions& operator=(const Actions&) = delete;
  ~Actions() { Run(); }

  void Add(std::function<void()> fn) { fns_.push_back(std::move(fn)); }
  // Runs and forgets every action, in the order they were added.
  void Run() {
    if (fns_.empty()) return;
    if (gate_ && !gate_()) {
      fns_.clear();
      return;
    }
    std::vector<std::function<void()>> fns;
    fns.swap(fns_);
    // What the actions write to one node stream leaves as one message.
    WriteBatch batch;
    for (auto& fn : fns) fn();
  }

 private:
  std::function<bool()> gate_;
  std::vector<std::function<void()>> fns_;
};

class ABSL_SCOPED_LOCKABLE Decision {
 public:
  // Locks `mu`; the actions are gated as Actions(gate) (nullptr: not gated).
  Decision(absl::Mutex* mu, std::function<bool()> gate) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu)
      : actions_(std::move(gate)), mu_(mu) {
    mu_->Lock();
  }
  Decision(const Decision&) = delete;
  Decision& operator=(const Decision&) = delete;
  // Unlocks, then runs the actions.
  ~Decision() ABSL_UNLOCK_FUNCTION() {
    mu_->Unlock();
    actions_.Run();
  }

  // What runs once the lock is released.
  Actions& actions() { return actions_; }

 private:
  Actions actions_;
  absl::Mutex* const mu_;
};

}  // namespace muster

#endif  // MUSTER_COORDINATOR_ACTIONS_H_
