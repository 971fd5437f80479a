// Engine: the elastic engine behind include/muster/muster.h, one per
// trainer: a facade over the parts it composes and owns.
//   Schedule         the counters every rank holds alike, over the sampler
//   ElasticWorld     the membership: worlds, regroups, the coordinator
//   Replica          the tensors: gradient syncs, buffers, state transfer
//   WorldChanges     moves both from world to world, salvages a failed step
//   CatalogCheckpointer, ProgressReporter, StateServer
// and runs the step's lifecycle (step_lifecycle.h) over them:
//
//   Start ─> Begin: connect, resume, WorldChanges::EnterFirst
//   loop:  ShouldStop ─> [boundary: catch-up, buffers, state check,
//                         decision (stop, leave, regroup), checkpoint]
//                     ─> next batch
//          BeforeBackward ─> (user's backward) ─> AfterBackward: the
//          pass's reduction; a failure regroups (WorldChanges::Regroup)
//          and the step is salvaged or dropped
//   Finish: leave, or the stop's outcome
//
// The engine says when a world changes (a failed collective, a decision
// at a boundary); how, reads top to bottom in trainer/elastic/
// world_changes.cc. Included by engine.cc only (Distributed::Start makes
// it); muster-train is a client of the facade like any user.
//
// Thread-safety: the training thread's, except RequestStop and
// RequestLeave (any thread, signal handlers too).
#ifndef MUSTER_TRAINER_LIB_ENGINE_H_
#define MUSTER_TRAINER_LIB_ENGINE_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "muster/muster.h"
#include "trainer/checkpoint/training_state.h"
#include "trainer/elastic/catalog_checkpointer.h"
#include "trainer/elastic/elastic_world.h"
#include "trainer/elastic/progress_reporter.h"
#include "trainer/elastic/replica.h"
#include "trainer/elastic/state_server.h"
#include "trainer/elastic/state_sync.h"
#include "trainer/elastic/step_policy.h"
#include "trainer/elastic/world_changes.h"
#include "trainer/lib/learning_rates.h"
#include "trainer/lib/schedule.h"
#include "trainer/lib/signals.h"
#include "trainer/lib/step_lifecycle.h"
#include "trainer/lib/step_timeline.h"

namespace muster {

// The step in flight and the boundary after it.
struct StepInFlight {
  SampledBatch batch;
  ControlWords sent;
  bool reduces = true;  // the last BeforeBackward had sync = true
  // With several passes: the world the step began in, and the ranks of it
  // whose shares a salvaged pass lost.
  uint64_t generation = 0;
  int world_size = 0;
  std::vector<int> lost;
  StepDecision decision = StepDecision::kContinue;
  // Some rank's clock said a checkpoint by time was due as a pass began.
  bool checkpoint_due = false;
  int64_t state_checked_at = -1;  // the step of the last CheckStateAgrees

  // The step takes `taken` (this rank's batch) in `world`.
  void Begin(SampledBatch taken, const WorldInfo& world) {
    batch = std::move(taken);
    generation = world.generation;
    world_size = world.world_size;
    lost.clear();
    checkpoint_due = false;
  }
};

class Engine final : public Distributed, private WorldChanges::Trainer {
 public:
  // `clock`: every part's; `scaler`: State::grad_scaler (may be null);
  // neither owned.
  Engine(const Options& o, TrainingState state, Clock* clock, GradScaler* scaler = nullptr);
  ~Engine() override;

  // Connects, resumes and enters the first world (Distributed::Start).
  absl::Status Begin();

  bool ShouldStop() override;
  const std::vector<int64_t>& Batch() const override { return step_.batch.indices; }
  std::vector<int64_t> UpcomingBatch(int ahead) override;
  void BeforeBackward(bool sync) override { BeforeBackwardFor({}, sync); }
  void BeforeBackwardFor(const std::vector<std::string>& modules, bool sync) override;
  absl::Status AfterBackward() override;
  absl::StatusOr<std::vector<double>> AllReduceSum(std::vector<double> values) override;
  std::vector<double> learning_rates() const override {
    return lr_ ? lr_->current() : std::vector<double>();
  }
  void RecordLoss(double loss) override { reporter_->RecordLoss(loss); }
  void LogScalars(const std::map<std::string, double>& values) override {
    reporter_->Scalars(counters().step, values);
  }
  absl::StatusOr<Outcome> Finish() override;
  void RequestStop() override { requests_.RequestStop(); }
  void RequestLeave() override { requests_.RequestLeave(); }
  void RequestFinish() override { requests_.RequestFinish(); }
  absl::Status status() const override { return life_.status(); }
  Progress progress() const override {
    return schedule_.ProgressIn(world_ ? &world_->world() : nullptr);
  }
  bool finished() const override {
    return life_.ended() && life_.outcome() == StepOutcome::kFinished;
  }
  int regroups() const override { return world_ ? world_->regroups() : 0; }
  int steps_salvaged() const override { return changes_ ? changes_->salvaged() : 0; }
  int steps_dropped() const override { return changes_ ? changes_->dropped() : 0; }
  int checkpoints_committed() const override {
    return checkpointer_ ? checkpointer_->committed() : 0;
  }
  int64_t resumed_from_step() const override { return resumed_.step; }
  bool resumed_from_live_state() const override { return resumed_.live; }
  uint64_t StateDigest() const override {
    return muster::StateDigest(replica_.state(), counters().ToWords());
  }
  double comm_overlap_pct() const override { return replica_.overlap_pct(); }
  StepTimeline step_timeline() const override { return timeline_.Medians(); }
  int64_t optimizer_state_elements() const override {
    return replica_.optimizer_state_elements();
  }
  double last_gradient_norm() const override { return replica_.last_gradient_norm(); }
  MemoryAccount memory_account() const override { return replica_.memory(); }

 private:
  absl::Status Connect();
  absl::Status ResumeFromCheckpoint();
  // A world was entered: said by the reporter, its buffers settled and
  // LibTorch's threads shared out among the node's trainers of it.
  void WorldEntered();
  // `broken`: the world broke under this rank (a collective failed), which
  // the rendezvous reports; false at an agreed step boundary.
  absl::Status Regroup(const std::string& why, bool broken);
  // The regroup found no world for this trainer: it left or stopped.
  absl::Status EndWithoutWorld();
  // This step's all-reduce (or broadcast) failed with `failure`: regroup,
  // then the step is salvaged (OK) or dropped (ABORTED).
  absl::Status RegroupAfterFailedStep(const absl::Status& failure);
  absl::Status AtBoundary();
  // The boundary's collectives in order (the sharded gather, a catch-up,
  // the buffers, the periodic state check); none after one that regrouped.
  absl::Status BoundaryCollectives();
  // `world_changed`: a regroup during this boundary (CatalogCheckpointer::
  // deferred).
  absl::Status AfterDecision(bool world_changed);
  absl::Status Stop();
  absl::Status FinishEarly();
  absl::Status GiveBackAtEnd();
  // After a sharded checkpoint to stop: the optimizers whole again, with
  // no regroup (the job stops).
  void GiveBackOptimizers();
  void SayStopped(const std::string& how) const;
  // A line for people, through Options::output, unless quiet.
  void Say(const std::string& line) const {
    if (!options_.quiet) options_.output(line);
  }
  // The step ends (Schedule::EndStep) at once after its one pass, or at its
  // boundary after several.
  void EndStep();
  // A collective at the boundary failed with `s` (OK: it did not): the
  // regroup's state transfer makes every rank's state the source's.
  absl::Status RegroupUnlessOk(const absl::Status& s);
  // Collective: sharded optimizer state whole on every rank (nothing
  // without), regrouping where a peer failed; then check life_.ended().
  absl::Status WholeState();
  // Whether every rank holds the same state (`when`: for the message), at
  // most once per step; DATA_LOSS naming the ranks and the first tensor
  // that differ ends the run. `whole`: sharded optimizer state is made
  // whole first and stays so (a checkpoint follows), else it is compared
  // sharded (OptimizerState::CheckAgrees).
  absl::Status CheckStateAgrees(const std::string& when, bool whole);
  CheckpointMeta CommittedStepMeta() const {
    return schedule_.Meta(world_->world(), step_.batch.epoch);
  }
  TrainingProgress* training_progress() const { return world_->training_progress(); }
  const TrainingCounters& counters() const { return schedule_.counters(); }

  // WorldChanges::Trainer: where a salvaged step touches the step in flight.
  void BeforeSalvagedStep() override { lr_->Apply(progress()); }
  absl::Status StepSalvaged(const SalvagedStep& step) override;
  absl::Status StateLost(const absl::Status& lost) override;

  const Options options_;
  Clock* const clock_;
  Schedule schedule_;  // the counters every rank holds alike, the sampler
  StopRequests requests_;  // any thread
  // The training thread's from here on.
  std::unique_ptr<StateServer> state_server_;
  std::unique_ptr<ElasticWorld> world_;
  Replica replica_;
  std::optional<WorldChanges> changes_;  // from Begin, over world_ and replica_
  std::unique_ptr<CatalogCheckpointer> checkpointer_;
  std::unique_ptr<ProgressReporter> reporter_;
  StepInFlight step_;
  StepLifecycle life_;  // where the step stands (step_lifecycle.h)
  StepClock timeline_;  // where the steps' time goes (step_timeline())
  std::optional<LearningRates> lr_;  // set by Begin
  struct {
    int64_t step = -1;
    bool live = false;  // step is a live peer's, not a checkpoint's
  } resumed_;
  // A sum between steps failed and the world regrouped: not every member
  // of the new world is in the program's evaluation (a replacement, or a
  // rank whose sum had completed, is in the loop), so no sum is taken
  // until the next ShouldStop, where every rank meets again.
  bool sum_regrouped_ = false;
};

}  // namespace muster

#endif  // MUSTER_TRAINER_LIB_ENGINE_H_
