// The engine (engine.h): the facade's calls, starting and resuming, the
// step's lifecycle and its failure (the boundary and the stop:
// engine_boundary.cc). muster-train is a client of these files like any
// user.
#include "trainer/lib/engine.h"

#include <torch/torch.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/lines.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "muster/signals.h"
#include "trainer/comm/values.h"
#include "trainer/lib/launch_options.h"
#include "trainer/lib/state_from.h"

namespace muster {
Engine::Engine(const Options& o, TrainingState state, Clock* clock, GradScaler* scaler)
    : options_(o),
      clock_(clock),
      schedule_(o),
      requests_(o.stop_requested, o.leave_requested, o.handle_signals),
      replica_(std::move(state), ReplicaOptionsFrom(o, clock, scaler)),
      timeline_(clock) {}

Engine::~Engine() {
  replica_.Close();  // nothing reduces over the communicator it detaches
  if (world_) world_->Detach();
}

absl::Status Engine::Begin() {
  if (options_.handle_signals) InstallSignalHandlers();
  MUSTER_ASSIGN_OR_RETURN(lr_, LearningRates::For(options_, replica_.state()));
  MUSTER_RETURN_IF_ERROR(replica_.optimizer_state().Check());
  MUSTER_RETURN_IF_ERROR(Connect());
  MUSTER_RETURN_IF_ERROR(replica_.SyncFor({}).status());
  MUSTER_RETURN_IF_ERROR(ResumeFromCheckpoint());
  MUSTER_RETURN_IF_ERROR(changes_->EnterFirst());
  if (counters().step != std::max<int64_t>(resumed_.step, 0)) {  // a live peer was ahead
    MUSTER_LOG(INFO) << "took the live state of step " << counters().step << " from rank "
                     << world_->world().state_source_rank
                     << (resumed_.step < 0 ? "" : " (the checkpoint restored was of step ")
                     << (resumed_.step < 0 ? "" : absl::StrCat(resumed_.step, ")"));
    resumed_ = {counters().step, true};
  }
  if (world_->left()) {  // drained before it began, or a spare the job ended without
    MUSTER_RETURN_IF_ERROR(life_.End(StepOutcome::kLeft));
  } else {
    // A world that begins at step 0 would write its checkpoints over the
    // finished ones of the directory that Resume could not load: refused.
    if (checkpointer_ && options_.resume && counters().step == 0) {
      MUSTER_RETURN_IF_ERROR(checkpointer_->RefuseCheckpointsNotOffered());
    }
    if (life_.state() == StepState::kStarting) {  // else a salvaged step's boundary is due
      MUSTER_RETURN_IF_ERROR(life_.Ready());
    }
  }
  MUSTER_ASSIGN_OR_RETURN(reporter_, ProgressReporter::Create(ProgressOptionsFrom(options_, clock_),
                                                              world_->world().rank));
  if (life_.ended()) return absl::OkStatus();
  WorldEntered();
  if (resumed_.step > 0 && !resumed_.live && world_->world().rank == 0) {
    Say(absl::StrCat("muster: resumed from the checkpoint of step ", resumed_.step));
  }
  training_progress()->Mark();
  return absl::OkStatus();
}

// The state service, the membership, and the world changes over it.
absl::Status Engine::Connect() {
  MUSTER_ASSIGN_OR_RETURN(ClientOptions client, ClientOptionsFrom(options_, clock_));
  MUSTER_ASSIGN_OR_RETURN(state_server_, StartStateService(options_, &client, clock_));
  WorldChangesOptions co = WorldChangesOptionsFrom(options_, replica_.several_passes(), clock_);
  co.stop_asked = [this] { return requests_.stop(); };
  co.leave_asked = [this] { return requests_.leave(); };
  co.finish_asked = [this] { return requests_.finish(); };
  ElasticWorldOptions wo = ElasticWorldOptionsFrom(options_, std::move(client), clock_);
  wo.interrupted = [this] { return requests_.stop() || requests_.leave(); };
  wo.before_rejoin = [this] {  // a scheduled checkpoint that failed was logged
    if (checkpointer_) checkpointer_->Wait().IgnoreError();
  };
  MUSTER_ASSIGN_OR_RETURN(world_, ElasticWorld::Connect(std::move(wo)));
  WorldChanges::Trainer* const trainer = this;
  changes_.emplace(std::move(co), world_.get(), &replica_, trainer, schedule_.mutable_counters(),
                   schedule_.sampler());
  return absl::OkStatus();
}

// A fresh start resumes from the newest committed checkpoint that verifies
// (locally: the state transfer on entering the world makes all ranks agree).
absl::Status Engine::ResumeFromCheckpoint() {
  if (options_.checkpoint_dir.empty()) return absl::OkStatus();
  checkpointer_ = std::make_unique<CatalogCheckpointer>(CheckpointOptionsFrom(options_, clock_),
                                                        replica_.state());
  if (!options_.resume) return absl::OkStatus();
  // Sharded optimizer state is read at the first world's entry, each rank
  // its own ranges, never whole on any rank.
  std::vector<ShardFileRef> shard_files;
  absl::StatusOr<CheckpointMeta> meta = checkpointer_->Resume(
      world_->client(), replica_.optimizer_state().sharding() ? &shard_files : nullptr);
  if (absl::IsNotFound(meta.status())) return absl::OkStatus();
  MUSTER_RETURN_IF_ERROR(meta.status());
  if (!shard_files.empty()) {
    replica_.optimizer_state().LoadAtEntry(meta->step, std::move(shard_files), checkpointer_->fs());
  }
  MUSTER_RETURN_IF_ERROR(schedule_.Restore(*meta));
  resumed_.step = meta->step;
  return absl::OkStatus();
}

absl::Status Engine::StepSalvaged(const SalvagedStep& step) {
  step_.decision = step.next;
  if (!step.in_step) return life_.StepTaken();  // taken by others: its boundary is due
  if (!step.contributed) step_.batch.indices.clear();  // this rank's examples did not count
  step_.lost.insert(step_.lost.end(), step.lost.begin(), step.lost.end());
  MUSTER_RETURN_IF_ERROR(life_.Salvaged());
  if (step.catch_up_from >= 0) life_.CatchUpFrom(step.catch_up_from);
  return absl::OkStatus();
}

// With one copy of each part of the sharded optimizer state, the parts of
// a dead rank are gone: every rank takes the newest committed checkpoint,
// as a restart would, and the job goes on from it in this world. Its
// sharded optimizer state is read as the world is entered again, each rank
// its own ranges (never whole on any rank).
absl::Status Engine::StateLost(const absl::Status& lost) {
  if (!checkpointer_) {
    return absl::NotFoundError(
        absl::StrCat(lost.message(), ", and no checkpoint_dir is set to take it from"));
  }
  checkpointer_->Wait().IgnoreError();  // its copies may still read the state; logged
  replica_.optimizer_state().Release();
  std::vector<ShardFileRef> shard_files;
  absl::StatusOr<CheckpointMeta> meta = checkpointer_->Resume(
      world_->client(), replica_.optimizer_state().sharding() ? &shard_files : nullptr);
  if (!meta.ok()) {
    return absl::NotFoundError(absl::StrCat(lost.message(), ", and ", meta.status().message()));
  }
  if (!shard_files.empty()) {
    replica_.optimizer_state().LoadAtEntry(meta->step, std::move(shard_files), checkpointer_->fs());
  }
  const int64_t was = counters().step;
  MUSTER_RETURN_IF_ERROR(schedule_.Restore(*meta));
  schedule_.mutable_counters()->pass = 0;
  MUSTER_LOG(WARNING) << lost.message() << ": restored the checkpoint of step " << meta->step
                      << " (this rank was at step " << was << ")";
  return absl::OkStatus();
}

absl::Status Engine::Regroup(const std::string& why, bool broken) {
  MUSTER_RETURN_IF_ERROR(changes_->Regroup(why, broken));
  if (world_->left()) return EndWithoutWorld();
  WorldEntered();
  return absl::OkStatus();
}

void Engine::WorldEntered() {
  // The state transfer of entering a world made every rank's buffers equal.
  replica_.SettleBuffers();
  reporter_->WorldEntered(progress(), world_->comm()->name(), world_->world().node_count);
  ShareIntraOpThreads(options_, world_->world().local_world_size());
}

void Engine::EndStep() {
  schedule_.EndStep(step_.batch, step_.world_size, step_.lost);
  step_.lost.clear();
  world_->ReportCounters(counters());
  changes_->StepCommitted();
}

bool Engine::ShouldStop() {
  StepClock::Scope timed(&timeline_, StepClock::Call::kShouldStop);
  sum_regrouped_ = false;
  if (life_.over()) return true;
  // The boundary's work (a regroup, a checkpoint's copy, a catch-up).
  TrainingProgress::Busy busy(training_progress());
  // A regroup at the boundary may salvage a step: its boundary follows.
  while (life_.state() == StepState::kBoundaryDue) {
    if (counters().pass > 0) EndStep();  // a step of several passes
    if (absl::Status s = life_.BeginBoundary(); !s.ok()) life_.Break(s);
    if (absl::Status s = AtBoundary(); !s.ok()) life_.Break(s);
    if (life_.over()) return true;
    if (life_.state() == StepState::kAtBoundary) life_.Break(life_.Settle());
  }
  if (schedule_.Done()) {
    // A regroup here that restored a checkpoint (StateLost) has work left.
    life_.Break(GiveBackAtEnd());
    if (life_.over()) return true;
  }
  if (schedule_.Done()) {
    life_.Break(life_.End(StepOutcome::kFinished));
    return true;
  }
  if (absl::Status s = life_.Prepare(); !s.ok()) {
    life_.Break(absl::FailedPreconditionError(
        absl::StrCat("ShouldStop before AfterBackward ended the step (", s.message(), ")")));
    return true;
  }
  step_.Begin(schedule_.Next(world_->world()), world_->world());
  lr_->Apply(progress());
  timed.StepBegins();
  return false;
}

void Engine::BeforeBackwardFor(const std::vector<std::string>& modules, bool sync) {
  StepClock::Scope timed(&timeline_, StepClock::Call::kBeforeBackward);
  const bool next_pass = replica_.several_passes() && life_.state() == StepState::kBoundaryDue;
  const bool first = next_pass || life_.state() == StepState::kPrepared;
  if (absl::Status s = next_pass ? life_.NextPass() : life_.Backward(); !s.ok()) {
    life_.Break(absl::FailedPreconditionError(
        absl::StrCat("BeforeBackward outside a step ShouldStop prepared (", s.message(), ")")));
    return;
  }
  // Sharded optimizer state, a step of several passes: the parameters the
  // earlier passes' optimizers stepped are gathered before this pass's
  // forward reads them (a failure is the pass's, as its reduction's).
  if (next_pass) replica_.GatherBetweenPasses(world_->comm(), changes_->StepDeadline());
  // Sharded optimizer state is made as the step's first backward begins:
  // every rank of the world is then in this step, whatever regrouped
  // between steps (an AllReduceSum) left whole.
  if (absl::Status s =
          first ? replica_.optimizer_state().ForStep(world_->comm()) : absl::OkStatus();
      !s.ok()) {
    life_.Break(s);
    return;
  }
  // After Reshard: with reduce_scatter_gradients the sync follows the shards.
  absl::StatusOr<GradientSync*> chosen = replica_.SyncFor(modules);
  if (!chosen.ok()) {
    life_.Break(chosen.status());
    return;
  }
  step_.reduces = sync;
  if (first || sync) {
    step_.sent = changes_->CurrentControl();
    step_.sent.checkpoint_due =
        checkpointer_ && (checkpointer_->DueByTime() || checkpointer_->deferred());
  }
  replica_.BeginPass(*chosen, sync, step_.sent, changes_->step_timeout());
}

absl::Status Engine::AfterBackward() {
  StepClock::Scope timed(&timeline_, StepClock::Call::kAfterBackward);
  if (!life_.status().ok()) return life_.status();
  TrainingProgress* const progress = training_progress();
  progress->Mark();
  if (life_.state() != StepState::kInBackward) {
    return absl::FailedPreconditionError("AfterBackward without BeforeBackward in this step");
  }
  if (!step_.reduces) {
    // Nothing was reduced: an optimizer step now would apply each rank's
    // own gradients, and the ranks would part ways.
    absl::Status s = absl::FailedPreconditionError(
        "AfterBackward after BeforeBackward(/*sync=*/false): a no-sync backward only "
        "accumulates; the step's last backward needs BeforeBackward() (sync), and "
        "AfterBackward closes that one");
    life_.Break(s);
    return s;
  }
  // The optimizer update that follows must not change what a checkpoint's
  // copies still read (on the GPU they run beside training).
  if (checkpointer_) checkpointer_->BeforeUpdate();
  absl::Status s = replica_.FinishPass(changes_->StepDeadline(), [progress] { progress->Mark(); });
  TrainingProgress::Busy busy(progress);  // a regroup
  if (!s.ok()) return RegroupAfterFailedStep(s);
  timeline_.Add(StepClock::Part::kReduce, replica_.last_reduce_time());
  replica_.AccountMemory(checkpointer_ ? checkpointer_->staged_bytes() : 0,
                         state_server_ ? state_server_->held_bytes() : 0);
  world_->client()->SetMemory(replica_.memory());  // the heartbeats carry it to /metrics
  step_.decision = DecideAfterStep(replica_.control(), world_->world().world_size, step_.sent,
                                   world_->told_to_leave());
  step_.checkpoint_due = step_.checkpoint_due || CheckpointDueOnAnyRank(replica_.control());
  if (replica_.several_passes()) {
    ++schedule_.mutable_counters()->pass;  // the step ends at its boundary
  } else {
    EndStep();
  }
  return life_.Reduced();
}

// A peer failed or hung: regroup with the others, keeping this rank's
// gradients for the new world to salvage the step (WorldChanges).
absl::Status Engine::RegroupAfterFailedStep(const absl::Status& failure) {
  const bool several = replica_.several_passes();
  const int64_t failed = counters().step + 1;
  const std::string what = several
                               ? absl::StrCat("pass ", counters().pass + 1, " of step ", failed)
                               : absl::StrCat("step ", failed);
  MUSTER_LOG(WARNING) << what << " failed: " << failure;
  MUSTER_RETURN_IF_ERROR(life_.Fail());
  // A step of several passes is salvaged in the world it began in only; a
  // pass whose SyncBatchNorm statistics held the world's examples, never.
  changes_->KeepFailedStep(world_->world(),
                           (!several || world_->world().generation == step_.generation) &&
                               !replica_.pass_summed_statistics());
  if (absl::Status r = Regroup(std::string(failure.message()), /*broken=*/true); !r.ok()) {
    life_.Break(r);
    return r;
  }
  if (life_.state() == StepState::kBoundaryDue) return absl::OkStatus();  // salvaged
  if (life_.state() == StepState::kFailed) MUSTER_RETURN_IF_ERROR(life_.Dropped());
  replica_.DropGradients();
  // Left or stopped (no world for this member), taken without it, or lost.
  return changes_->EndFailedStep(what, failure, /*left=*/life_.ended(),
                                 world_->world().generation);
}

absl::Status Engine::RegroupUnlessOk(const absl::Status& s) {
  return s.ok() ? s : Regroup(std::string(s.message()), /*broken=*/true);
}

std::vector<int64_t> Engine::UpcomingBatch(int ahead) {
  // From ShouldStop preparing a step until its AfterBackward: a step of one
  // pass has advanced the schedule past it then (EndStep), and the shares
  // ahead would be counted from the next step.
  const StepState s = life_.state();
  if (!world_ || (s != StepState::kPrepared && s != StepState::kInBackward) || ahead < 1) {
    return {};
  }
  return schedule_.Upcoming(world_->world(), step_.batch, ahead);
}

absl::StatusOr<std::vector<double>> Engine::AllReduceSum(std::vector<double> values) {
  if (!life_.status().ok()) return life_.status();
  if (life_.ended() && life_.outcome() != StepOutcome::kFinished) {
    return absl::FailedPreconditionError("this member is no longer in a world");
  }
  static constexpr char kSkip[] =
      "the new world's members are not all in this evaluation (a replacement begins in the "
      "training loop): skip it, and sum again after the next ShouldStop";
  if (sum_regrouped_) {
    return absl::FailedPreconditionError(absl::StrCat("a sum since this step failed: ", kSkip));
  }
  TrainingProgress::Busy busy(training_progress());
  // Between steps (an evaluation): ranks may arrive far apart after work
  // of their own, so the long deadline, not the step's.
  absl::Status s = AllReduceValues(world_->comm(), values.data(), values.size(),
                                   DataType::kFloat64, ReduceOp::kSum,
                                   changes_->LongDeadline());
  if (s.ok()) return values;
  absl::Status r = RegroupUnlessOk(s);
  life_.Break(r);
  if (!r.ok()) return r;
  sum_regrouped_ = true;
  return absl::AbortedError(
      absl::StrCat("all-reduce failed, regrouped: ", s.message(), "; ", kSkip));
}

absl::StatusOr<Distributed::Outcome> Engine::Finish() {
  std::optional<TrainingProgress::Busy> busy;
  if (world_) busy.emplace(training_progress());
  if (checkpointer_) checkpointer_->Wait().IgnoreError();  // logged when it failed
  if (!life_.status().ok()) return life_.status();
  if (!life_.ended()) {  // the loop ended before ShouldStop said so: leave
    world_->Leave(Departure::kLeaving, counters().step).IgnoreError();
    MUSTER_RETURN_IF_ERROR(life_.End(StepOutcome::kLeft));
  } else if (life_.outcome() == StepOutcome::kFinished) {
    world_->Leave(Departure::kFinished, counters().step).IgnoreError();
  }
  world_->Detach();
  return static_cast<Outcome>(life_.outcome());
}

// The composition root of the library: the real clock and, unless the
// program gave a sink, standard output.
absl::StatusOr<std::unique_ptr<Distributed>> Distributed::Start(const Options& options,
                                                                State state) {
  MUSTER_RETURN_IF_ERROR(options.Validate());
  MUSTER_ASSIGN_OR_RETURN(TrainingState ts, TrainingStateFrom(state));
  if (!options.lr_schedule && !options.group_lr_schedule) {
    MUSTER_RETURN_IF_ERROR(CarryLearningRates(&ts));
  }
  Options composed = options;
  if (!composed.output) composed.output = StandardOutput();
  auto engine = std::make_unique<Engine>(std::move(composed), std::move(ts), RealClock::Get(),
                                         state.grad_scaler);
  MUSTER_RETURN_IF_ERROR(engine->Begin());
  return std::unique_ptr<Distributed>(std::move(engine));
}

}  // namespace muster
