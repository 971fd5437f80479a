// WorldChanges: how one trainer goes from one world to the next, and the
// deadlines its collectives wait under. It owns
//   * the regroup: after the world broke under this rank (a collective
//     failed: the rendezvous reports it, BrokenWorld) or at a step boundary
//     every rank agreed on; and the entry into the first world;
//   * entering a world: the learning rates' world size and the state
//     transfer from the member the coordinator names as furthest ahead;
//   * the failed step: the step whose all-reduce failed, kept from the
//     failure until the next world salvages it (step_salvage.h: the
//     survivors reduce the gradients they still hold, the lost shares'
//     examples go back to the sampler) or EndFailedStep ends it (dropped,
//     taken without this rank, or this member left); and the count of
//     steps salvaged and dropped;
//   * the catch-up: after a salvaged step that some ranks of the new world
//     did not take (joiners), every rank takes the state of the first rank
//     that did;
//   * the collective deadline (collective_deadline.h) measured on the
//     injected clock: the deadline of a step's collectives, which follows
//     the job, and the long one of a world change's waits.
//
// It decides and sequences, and moves the parts it is given directly: the
// membership (WorldChanges::Membership, which ElasticWorld is), this rank's
// tensors (WorldChanges::Tensors, which Replica is: the gradient syncs, the
// buffers and the state transfer) and, for the three moments a salvaged
// step touches the step in flight, the trainer (WorldChanges::Trainer,
// which the engine is). The engine composes these parts and owns them. The
// training counters and the sampler are the engine's too (its Schedule):
// WorldChanges updates the counters in place when a change moves them (a
// state transfer, a salvaged step). The
// interfaces keep it and its unit tests free of LibTorch and gRPC.
//
// A failed step, on every rank of the world that follows:
//
//   KeepFailedStep ─> Regroup(broken) ─> Membership::Regroup, and for each
//                                        world tried: Enter
//                                          │ Tensors::EnterWorld, TakeState,
//                                          │ AgreeOnSalvage
//         ┌────────────────────────────────┼────────────────────────────┐
//   nothing salvaged               this rank was in it          it was not (a joiner)
//         │                                │ Tensors::ResyncGradients   │ ResyncGradients
//         v                                v Trainer::BeforeSalvagedStep v StepSalvaged (!in_step)
//   EndFailedStep (the engine)       advance the counters,        catch up from the
//                                    Trainer::StepSalvaged:       first rank in it
//                                    salvaged()+1
//
// Not thread-safe: the training thread's, like the trainer it serves.
#ifndef MUSTER_TRAINER_ELASTIC_WORLD_CHANGES_H_
#define MUSTER_TRAINER_ELASTIC_WORLD_CHANGES_H_

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "trainer/comm/communicator.h"
#include "trainer/comm/world_info.h"
#include "trainer/data/sampler.h"
#include "trainer/elastic/collective_deadline.h"
#include "trainer/elastic/step_policy.h"
#include "trainer/elastic/step_salvage.h"
#include "trainer/elastic/training_counters.h"

namespace muster {

struct BrokenWorld;  // trainer/client/coordinator_client.h

struct WorldChangesOptions {
  // Salvage a failed step (Options::salvage); else every failed step is
  // dropped.
  bool salvage = true;
  // The learning rates follow the world size (ElasticLr::kScale): the LR
  // world size becomes each new world's.
  bool scale_lr = false;
  int batch_per_rank = 1;
  // Steps may hold several synchronised passes (State::modules): a pass is
  // salvaged only when every rank of the new world holds its gradient, and
  // a salvaged pass leaves the step's end (the counters' step and sampler
  // position) to the trainer.
  bool several_passes = false;
  CollectiveDeadlineOptions deadline;
  // Deadlines are times of clock->Now(); required, not owned, must outlive
  // this.
  Clock* clock = nullptr;
  // This rank's control words (CurrentControl): asked to stop or to leave
  // (a signal, RequestStop, RequestLeave) or to finish (RequestFinish), and
  // the step after which it stops (Options::stop_after_step; 0: none).
  std::function<bool()> stop_asked = [] { return false; };
  std::function<bool()> leave_asked = [] { return false; };
  std::function<bool()> finish_asked = [] { return false; };
  int64_t stop_after_step = 0;
};

// What this rank does about a salvaged step it took (StepSalvaged).
// Which step failed under a rank (Tensors::EnterWorld): its number and the
// generation of the world it failed in.
struct FailedStepMark {
  int64_t step = 0;
  uint64_t generation = 0;
};

struct SalvagedStep {
  // Whether this rank took the step. A rank outside it (a joiner, a spare)
  // takes the step from a rank in it: its boundary is due, deciding
  // `next`, and the fields below are not set.
  bool in_step = true;
  // The decision at the step's boundary (from the re-reduced control words).
  StepDecision next = StepDecision::kContinue;
  // Whether this rank's gradient was reduced: when not, its examples of the
  // step did not count.
  bool contributed = false;
  // The rank every rank takes the state from at the step's boundary, when
  // some ranks of the new world did not take the step; -1 when all did.
  int catch_up_from = -1;
  // With several passes: the ranks of the step's world whose shares were
  // lost; their examples go back to the sampler when the step ends.
  std::vector<int> lost;
};

class WorldChanges {
 public:
  // Called for each world entered, after its communicator is built (the
  // same type as ElasticWorld::EnterFn).
  using EnterFn = std::function<absl::Status(Communicator* comm, const WorldInfo& world)>;
  // Control words averaged over a world (GradientSync::control()).
  using ControlAverages = ControlArray;

  // The membership a WorldChanges moves between worlds (ElasticWorld).
  class Membership {
   public:
    virtual ~Membership() = default;
    // Waits for the first world and enters it, calling `enter`. OK also
    // when there is no world for this member.
    virtual absl::Status EnterFirst(int64_t step, const EnterFn& enter) = 0;
    // Leaves the current world and enters the next, calling `enter` for
    // each world tried; `broken`: the report that the world broke under
    // this rank, null at an agreed step boundary. OK also when there is no
    // next world for this member.
    virtual absl::Status Regroup(const std::string& why, int64_t step, const EnterFn& enter,
                                 const BrokenWorld* broken) = 0;
    // Whether the coordinator told this member to leave (a drain).
    virtual bool told_to_leave() const = 0;
    // Whether a generation newer than the current world's was announced.
    virtual bool newer_world_known() const = 0;
    // `counters` become what this member's heartbeats report.
    virtual void ReportCounters(const TrainingCounters& counters) = 0;
  };

  // This rank's tensors (Replica).
  class Tensors {
   public:
    virtual ~Tensors() = default;
    // Every rank of a new world `world`, first, before the state transfer:
    // sharded optimizer state moves to this world's shards, or becomes
    // whole on every rank, from the ranks that hold it
    // (ShardedOptimizers::Gather); nothing without. `step`: the steps this
    // rank has taken; `failed`: the step that failed under this rank, if
    // one did. Errors: the communicator's; NOT_FOUND when a shard has no
    // living holder; RESOURCE_EXHAUSTED where the state would be made whole
    // only to salvage `failed` (enter again with none).
    virtual absl::Status EnterWorld(Communicator* comm, const WorldInfo& world, int64_t step,
                                    const std::optional<FailedStepMark>& failed,
                                    absl::Time deadline) = 0;
    // The state transfer (state_sync.h): every rank of `comm` ends with
    // `source`'s state and `*counters`; `in_step`: a step failed under
    // this rank, whose graphs may still hold its buffers. Errors: the
    // communicator's, DATA_LOSS; `*counters` is then unchanged.
    virtual absl::Status TakeState(int source, Communicator* comm, bool in_step,
                                   TrainingCounters* counters, absl::Time deadline) = 0;
    // Before TakeState's catch-up after a salvaged step that some ranks
    // were outside of (`stepped` false on those): sharded optimizer state
    // of the step moves to its keepers outside it (ShardedOptimizers::
    // CatchUp); nothing where the state is whole. Errors: the
    // communicator's.
    virtual absl::Status CatchUpShards(Communicator* comm, bool stepped, absl::Time deadline) = 0;
    // Gradients are reduced over `comm` from now on; null while regrouping.
    virtual void UseCommunicator(Communicator* comm) = 0;
    // The failed step's gradients reduced again over `comm` (zeros unless
    // `contribute`), averaged over `contributors`, with `words`
    // (GradientSync::Resync). Returns the control words averaged over the
    // world. Errors: the communicator's.
    virtual absl::StatusOr<ControlAverages> ResyncGradients(Communicator* comm, bool contribute,
                                                            int contributors,
                                                            const ControlWords& words,
                                                            absl::Time deadline) = 0;
  };

  // The step in flight, where a salvaged step touches it (the engine).
  // Called on the training thread, from inside a WorldChanges call.
  class Trainer {
   public:
    virtual ~Trainer() = default;
    // This rank is about to take the salvaged step in the new world; the
    // counters are still those before it (its learning rates are set).
    virtual void BeforeSalvagedStep() = 0;
    // This rank took the salvaged step; the counters are past it. Or,
    // with !step.in_step, it takes the step from a rank in it, before the
    // catch-up. Errors: FAILED_PRECONDITION where the step's lifecycle
    // refuses it.
    virtual absl::Status StepSalvaged(const SalvagedStep& step) = 0;
    // Every rank of a new world whose state in memory is incomplete
    // (`lost`, Tensors::EnterWorld's NOT_FOUND: a part of the sharded
    // optimizer state went with its ranks): the state and the counters
    // from the newest committed checkpoint, as a restart would take them,
    // its sharded optimizer state left for the world's entry, which is
    // then made again (Tensors::EnterWorld); the failed step, if any, is
    // then dropped. Errors: `lost` when there is no checkpoint to take
    // them from.
    virtual absl::Status StateLost(const absl::Status& lost) = 0;
  };

  // `world`, `tensors`, `trainer`, `counters` and `sampler` are not owned
  // and must outlive this; `options.clock` is required.
  WorldChanges(WorldChangesOptions options, Membership* world, Tensors* tensors,
               Trainer* trainer, TrainingCounters* counters, DistributedSampler* sampler);
  WorldChanges(const WorldChanges&) = delete;
  WorldChanges& operator=(const WorldChanges&) = delete;

  // Waits for the first world and enters it (as the top of this file says:
  // the state transfer, then the salvage of what can be). OK also when
  // there is no world for this member (the membership says so). Errors:
  // Membership::EnterFirst's.
  absl::Status EnterFirst();

  // The step after the counters failed in `world` (its all-reduce or a
  // broadcast of it): kept for the next world to salvage, unless not
  // `salvageable` (a step of several passes that a world change already
  // came into). Replaces a step kept before.
  void KeepFailedStep(const WorldInfo& world, bool salvageable = true);
  // Whether a failed step is kept: from KeepFailedStep until a world
  // salvages it (this rank takes it) or EndFailedStep.
  bool has_failed_step() const { return failed_step_.has_value(); }
  // The regroup after the kept step did not salvage it: it is no longer
  // kept. Returns the ABORTED error the step's call ends with, which says
  // why, after `what` ("step 7") and `failure` (its collective's error):
  // this member left the job (`left`; the step is not counted); the world
  // took the step without this rank (the counters are past it: the state
  // transfer brought its result, nothing is lost); else it was dropped in
  // generation `generation`, counted in dropped().
  absl::Status EndFailedStep(const std::string& what, const absl::Status& failure, bool left,
                             uint64_t generation);

  // Leaves the current world and enters the next: gradients leave the
  // communicator, the step in progress is not timed, and `broken` (the
  // world broke under this rank: `why` says how) is reported with the
  // rendezvous, with the step's collective timeout as the time the next
  // world's members have to arrive. Each world tried is entered as
  // EnterFirst's is. OK also when there is no next world for this member
  // (the membership says so).
  // Errors: Membership::Regroup's, which include those of entering.
  absl::Status Regroup(const std::string& why, bool broken);

  // After a salvaged step that some ranks did not take (`stepped`: this
  // rank took it): every rank of `comm` takes the state and counters of
  // `source`, sharded optimizer state from its keepers in the step.
  // Errors: CatchUpShards' and TakeState's.
  absl::Status CatchUp(Communicator* comm, int source, bool stepped);

  // This rank's control words now (step_policy.h): what it was asked, and
  // what the membership heard.
  ControlWords CurrentControl() const;

  // The deadlines, times of the clock's Now(). A step's collectives:
  absl::Duration step_timeout() const { return deadline_.Current(); }
  absl::Time StepDeadline() const { return options_.clock->Now() + deadline_.Current(); }
  // The long waits: a communicator's build, a state transfer, a
  // checkpoint's agreement, an all-reduce between steps.
  absl::Duration long_timeout() const { return deadline_.Long(); }
  absl::Time LongDeadline() const { return options_.clock->Now() + deadline_.Long(); }
  // A step committed now: timed from the previous commit, unless a world
  // change came between (collective_deadline.h).
  void StepCommitted();

  // Failed steps salvaged (this rank took them in a regrouped world) and
  // dropped.
  int salvaged() const { return salvaged_; }
  int dropped() const { return dropped_; }

 private:
  // The step whose all-reduce failed: the counters it was taken at and the
  // world it was taken in.
  struct FailedStep {
    int64_t step = 0;
    SamplerPosition position;
    int pass = 0;
    uint64_t generation = 0;
    int world_size = 0;
    int rank = 0;
    bool salvageable = true;
  };

  EnterFn EnterEachWorld();
  // Every rank of a new world: take the state of the member furthest ahead,
  // then salvage what can be.
  absl::Status Enter(Communicator* comm, const WorldInfo& world);
  absl::Status Salvage(Communicator* comm, const WorldInfo& world);
  // This rank was in the failed step that `plan` salvages: it takes it.
  absl::Status TakeSalvagedStep(const WorldInfo& world, const SalvagePlan& plan,
                                SalvagedStep step);

  // Constant after construction.
  const WorldChangesOptions options_;
  Membership* const world_;
  Tensors* const tensors_;
  Trainer* const trainer_;
  TrainingCounters* const counters_;
  DistributedSampler* const sampler_;
  // The training thread's.
  CollectiveDeadline deadline_;
  absl::Time last_commit_;
  std::optional<FailedStep> failed_step_;
  int salvaged_ = 0;
  int dropped_ = 0;
};

}  // namespace muster

#endif  // MUSTER_TRAINER_ELASTIC_WORLD_CHANGES_H_
