// ElasticWorld: this trainer's place in the job — its coordinator client and
// session, the current world (generation, rank, size) and that world's
// store and communicator — and the moves between worlds: join, enter,
// regroup after a failure or at an agreed step boundary, rejoin after being
// fenced, leave.
//
// Lifecycle (one instance per trainer process or rank thread):
//
//   Connect ──> EnterFirst ──> [training: comm()] ──> Leave
//                   │               │    ^
//                   │     failure / │    │ entered
//                   │     boundary  v    │
//                   └──────────> Regroup ┘ ──(drained, job over)──> left()
//
// Entering a world builds its communicator and then calls the `enter`
// function given to EnterFirst/Regroup (the state transfer); a world that
// moves on while it is entered (another join, a peer that died) is
// followed to the next one.
//
// Thread-safety: every method except the session callback belongs to the
// training thread. The session thread aborts the live communicator (under
// mu_) when the coordinator announces a failure of this world.
#ifndef MUSTER_TRAINER_ELASTIC_ELASTIC_WORLD_H_
#define MUSTER_TRAINER_ELASTIC_ELASTIC_WORLD_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "trainer/client/coordinator_client.h"
#include "trainer/comm/factory.h"
#include "trainer/elastic/world_changes.h"

namespace muster {

struct ElasticWorldOptions {
  ClientOptions client;
  CommOptions comm;
  absl::Duration join_timeout = absl::Seconds(120);
  absl::Duration rendezvous_timeout = absl::Seconds(600);
  absl::Duration build_timeout = absl::Seconds(120);
  // While waiting for a place in a job that runs (a spare: the world is
  // full), the rendezvous is renewed every `spare_poll` for as long as the
  // job runs, and `interrupted` (a stop or leave signal) ends the wait.
  absl::Duration spare_poll = absl::Seconds(2);
  std::function<bool()> interrupted;
  // Runs before a fenced member rejoins as a new incarnation (the client
  // is replaced); may be empty.
  std::function<void()> before_rejoin;
  // Deadlines are on its Now(); required, not owned. The deadlines it sets
  // go to the client and the communicators, so client.clock and comm.clock
  // must be this clock.
  Clock* clock = nullptr;
  // What every trainer of the job must hold alike (JobSettings: lines of
  // "name=value"): each world's state source (the member furthest ahead)
  // publishes its own, and a rank whose settings differ leaves the job and
  // fails to enter with INVALID_ARGUMENT naming the first that differs,
  // before any collective of that world. Empty: not checked.
  std::string settings;
};

class ElasticWorld : public WorldChanges::Membership {
 public:
  // Called after a world's communicator is built: make the state identical
  // (every rank calls it with the same world). Errors abort the entry.
  using EnterFn = WorldChanges::EnterFn;

  // Creates the client, joins and starts the session. Errors:
  // INVALID_ARGUMENT (no clock, or client.clock or comm.clock another one),
  // the client's (INVALID_ARGUMENT for bad TLS files, UNAVAILABLE, ...).
  static absl::StatusOr<std::unique_ptr<ElasticWorld>> Connect(ElasticWorldOptions options);
  ~ElasticWorld() override;
  ElasticWorld(const ElasticWorld&) = delete;
  ElasticWorld& operator=(const ElasticWorld&) = delete;

  // Waits for the first world and enters it. `step`: what this member holds
  // (the coordinator names the member furthest ahead as the state source).
  // A member the running job has no place for yet waits as a spare until a
  // place frees up (a failure, a departure). When the job finishes or drains
  // this member first, or `interrupted` says so, left() becomes true and OK
  // is returned. Errors: DEADLINE_EXCEEDED when no world formed at all in
  // the rendezvous timeout, and those of entering.
  absl::Status EnterFirst(int64_t step, const EnterFn& enter) override;
  // Leaves the current world (its communicator is dropped) and enters the
  // next one; after a drain or the end of the job there is none: left()
  // becomes true and OK is returned. `broken` (null at an agreed step
  // boundary): the world broke under this member; the rendezvous reports it
  // so that the coordinator regroups even when it noticed nothing itself (a
  // broken link, a hung peer, a notice from a coordinator that was fenced).
  // A world that then fails to start is reported the same way. A fenced
  // member rejoins as a new incarnation (ElasticWorldOptions::before_rejoin
  // runs first).
  absl::Status Regroup(const std::string& why, int64_t step, const EnterFn& enter,
                       const BrokenWorld* broken) override;
  // Leaves the job, saying why (Departure).
  absl::Status Leave(Departure departure, int64_t step);
  // Drops the communicator; session notices no longer abort anything.
  void Detach();

  CoordinatorClient* client() const { return client_.get(); }
  // The training thread's progress, which this member's heartbeats report
  // (training_progress.h); the same across rejoins.
  TrainingProgress* training_progress() { return &progress_; }
  Communicator* comm() const { return comm_.get(); }
  const WorldInfo& world() const { return world_; }
  bool left() const { return left_; }
  // The coordinator told this member to leave (a drain).
  bool told_to_leave() const override { return told_to_leave_.load(); }
  // A newer generation than the current one was announced.
  bool newer_world_known() const override {
    return client_->latest_generation() > world_.generation;
  }
  // The step and sampler offset that heartbeats report.
  void ReportCounters(const TrainingCounters& c) override {
    client_->SetStep(c.step, c.position.offset);
  }
  int regroups() const { return regroups_; }

 private:
  explicit ElasticWorld(ElasticWorldOptions options)
      : options_(std::move(options)), progress_(options_.clock) {}
  absl::Status Join(uint64_t incarnation);
  void OnNotice(const SessionNotice& notice);
  // Builds world_'s communicator and calls `enter`; `step` is what this
  // member holds (for a Leave when its settings are not the world's).
  absl::Status Enter(const EnterFn& enter, int64_t step);
  // Before any collective of world_: the state source publishes its
  // settings in the world's store, the others compare theirs
  // (ElasticWorldOptions::settings).
  absl::Status AgreeOnSettings(absl::Time deadline);
  absl::StatusOr<WorldInfo> NextWorld(int64_t step, const BrokenWorld* broken);
  absl::StatusOr<WorldInfo> FirstWorld(int64_t step);
  // Rendezvous in slices of spare_poll, so that `interrupted` ends the wait
  // (CANCELLED) within one. Past the rendezvous timeout DEADLINE_EXCEEDED,
  // unless `as_spare` and the job has a world: a spare waits while it runs.
  absl::StatusOr<WorldInfo> AwaitWorld(uint64_t after, int64_t step, bool as_spare,
                                       const BrokenWorld* broken = nullptr);
  void NoPlace(const std::string& why, int64_t step);

  // Constant after construction.
  const ElasticWorldOptions options_;
  // Marked by the training thread, read by every client's session thread:
  // declared before client_, so it outlives each.
  TrainingProgress progress_;
  // Training thread only.
  std::unique_ptr<CoordinatorClient> client_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Communicator> comm_;
  // Between worlds: what the last one's communicator left for the next.
  KeptNodeCommunicator kept_;
  WorldInfo world_;
  bool left_ = false;
  int regroups_ = 0;
  std::atomic<bool> told_to_leave_{false};
  // Guarded by mu_: what the session thread may abort.
  Mutex mu_;
  Communicator* live_comm_ ABSL_GUARDED_BY(mu_) = nullptr;
  uint64_t live_generation_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace muster

#endif  // MUSTER_TRAINER_ELASTIC_ELASTIC_WORLD_H_
