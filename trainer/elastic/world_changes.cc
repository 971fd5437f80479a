#include "trainer/elastic/world_changes.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "trainer/client/coordinator_client.h"

namespace muster {

WorldChanges::WorldChanges(WorldChangesOptions options, Membership* world, Tensors* tensors,
                           Trainer* trainer, TrainingCounters* counters,
                           DistributedSampler* sampler)
    : options_(std::move(options)),
      world_(world),
      tensors_(tensors),
      trainer_(trainer),
      counters_(counters),
      sampler_(sampler),
      deadline_(options_.deadline) {}

WorldChanges::EnterFn WorldChanges::EnterEachWorld() {
  return [this](Communicator* comm, const WorldInfo& world) { return Enter(comm, world); };
}

absl::Status WorldChanges::EnterFirst() {
  return world_->EnterFirst(counters_->step, EnterEachWorld());
}

void WorldChanges::KeepFailedStep(const WorldInfo& world, bool salvageable) {
  failed_step_ = FailedStep{counters_->step,  counters_->position, counters_->pass,
                            world.generation, world.world_size,    world.rank,
                            salvageable};
}

absl::Status WorldChanges::EndFailedStep(const std::string& what, const absl::Status& failure,
                                         bool left, uint64_t generation) {
  const bool lost = failed_step_.has_value() && failed_step_->step >= counters_->step;
  failed_step_.reset();
  if (left) return absl::AbortedError(absl::StrCat(what, " not taken: this member left the job"));
  if (!lost) {
    // A rank fenced while stopped comes back after the world took the step.
    MUSTER_LOG(INFO) << what << " was taken by the world without this rank (now at step "
                     << counters_->step << "); its gradients are discarded";
    return absl::AbortedError(absl::StrCat(what, " taken without this rank: ", failure.message()));
  }
  ++dropped_;
  MUSTER_LOG(WARNING) << what << " dropped in generation " << generation;
  return absl::AbortedError(absl::StrCat(what, " dropped: ", failure.message()));
}

absl::Status WorldChanges::Regroup(const std::string& why, bool broken) {
  tensors_->UseCommunicator(nullptr);
  deadline_.Forget();
  const BrokenWorld report = BrokenWorld::Because(why, deadline_.Current());
  return world_->Regroup(why, counters_->step, EnterEachWorld(), broken ? &report : nullptr);
}

absl::Status WorldChanges::Enter(Communicator* comm, const WorldInfo& world) {
  if (counters_->lr_world_size == 0 || options_.scale_lr) {
    counters_->lr_world_size = world.world_size;
  }
  std::optional<FailedStepMark> failed;
  if (failed_step_.has_value()) {
    failed = FailedStepMark{failed_step_->step, failed_step_->generation};
  }
  absl::Status entered =
      tensors_->EnterWorld(comm, world, counters_->step, failed, LongDeadline());
  if (absl::IsResourceExhausted(entered)) {
    // Sharded state that only a whole regather could bring the failed step
    // to the ranks outside it: the step is dropped on every rank (begun
    // again in this world) and the state moves straight to its shards.
    MUSTER_LOG(INFO) << entered.message();
    if (failed_step_.has_value()) failed_step_->salvageable = false;
    entered = tensors_->EnterWorld(comm, world, counters_->step, std::nullopt, LongDeadline());
  }
  if (absl::IsNotFound(entered)) {
    // Every rank restores the checkpoint; then enters again, where the
    // sharded part of it is read, each rank its own ranges.
    entered = trainer_->StateLost(entered);
    // The ranks were at different steps (some took the failed step) and
    // now hold the checkpoint's: the failed step is dropped, not salvaged.
    if (entered.ok() && failed_step_.has_value()) failed_step_->salvageable = false;
    if (entered.ok()) {
      entered = tensors_->EnterWorld(comm, world, counters_->step, std::nullopt, LongDeadline());
    }
  }
  MUSTER_RETURN_IF_ERROR(entered);
  // A step failed under this rank: its graphs may still hold the buffers.
  MUSTER_RETURN_IF_ERROR(tensors_->TakeState(world.state_source_rank, comm,
                                             failed_step_.has_value(), counters_,
                                             LongDeadline()));
  if (options_.scale_lr) counters_->lr_world_size = world.world_size;
  tensors_->UseCommunicator(comm);
  world_->ReportCounters(*counters_);
  return Salvage(comm, world);
}

// Every rank of a new world, after the state transfer: the survivors of a
// failed step reduce the gradients they still hold and take the step, its
// lost shares' examples returned to the sampler. Ranks outside the step
// (joiners) add zeros, then take the state after it from a rank in it.
absl::Status WorldChanges::Salvage(Communicator* comm, const WorldInfo& world) {
  const bool in_step = failed_step_.has_value();
  SalvageClaim claim;
  claim.in_step = in_step;
  if (in_step) {
    // A gradient of exactly the step (and pass) this world is at (the
    // state transfer may have moved the counters past it).
    claim.contributes = options_.salvage && failed_step_->salvageable &&
                        failed_step_->step == counters_->step &&
                        failed_step_->position == counters_->position &&
                        failed_step_->pass == counters_->pass;
    claim.generation = failed_step_->generation;
    claim.world = failed_step_->world_size;
    claim.rank = failed_step_->rank;
  }
  const absl::Time deadline = LongDeadline();
  MUSTER_ASSIGN_OR_RETURN(const SalvagePlan plan, AgreeOnSalvage(claim, comm, deadline));
  // A step of several passes goes on in user code after the salvaged pass:
  // every rank must be in that very pass (a rank outside it would wait at
  // the step's boundary while the others reduce the next pass).
  const bool salvage =
      plan.salvage() && (!options_.several_passes || plan.contributors == world.world_size);
  if (!salvage) {
    // The step is dropped where it is begun: it begins again with no pass
    // done (the passes done stay applied), on every rank alike.
    if (options_.several_passes && plan.steppers > 0) counters_->pass = 0;
    return absl::OkStatus();
  }
  const ControlWords words = CurrentControl();
  MUSTER_ASSIGN_OR_RETURN(
      const ControlAverages averages,
      tensors_->ResyncGradients(comm, claim.contributes, plan.contributors, words, deadline));
  SalvagedStep step;
  step.in_step = in_step;
  step.next = DecideAfterStep(averages, world.world_size, words, world_->told_to_leave());
  if (!in_step) {  // the step's counters and state come from a rank in it
    MUSTER_RETURN_IF_ERROR(trainer_->StepSalvaged(step));
    return CatchUp(comm, plan.first_stepper, /*stepped=*/false);
  }
  step.contributed = claim.contributes;
  if (plan.steppers < world.world_size) step.catch_up_from = plan.first_stepper;
  return TakeSalvagedStep(world, plan, step);
}

absl::Status WorldChanges::TakeSalvagedStep(const WorldInfo& world, const SalvagePlan& plan,
                                            SalvagedStep step) {
  // The step is now one of this world: its rate too (a world change may
  // scale it).
  trainer_->BeforeSalvagedStep();
  TrainingCounters& c = *counters_;
  if (options_.several_passes) {
    // One pass of the step: the step itself ends at its boundary, where
    // the lost shares' examples go back to the sampler.
    ++c.pass;
    step.lost = plan.lost;
  } else {
    const SampledBatch taken =
        sampler_->Next(c.position, plan.old_world, /*rank=*/0, options_.batch_per_rank);
    c.position =
        sampler_->Advance(c.position, taken, plan.old_world, options_.batch_per_rank, plan.lost);
    ++c.step;
  }
  world_->ReportCounters(c);
  MUSTER_RETURN_IF_ERROR(trainer_->StepSalvaged(step));
  failed_step_.reset();
  ++salvaged_;
  MUSTER_LOG(WARNING) << (options_.several_passes
                              ? absl::StrCat("pass ", c.pass, " of step ", c.step + 1)
                              : absl::StrCat("step ", c.step))
                      << " salvaged in generation " << world.generation << ": "
                      << plan.contributors << " of " << plan.old_world << " shares reduced, "
                      << plan.lost.size() << " returned to the sampler";
  return absl::OkStatus();
}

// After a salvaged step that some ranks were not in: every rank takes the
// state of a rank that took the step (its optimizer has run by now).
absl::Status WorldChanges::CatchUp(Communicator* comm, int source, bool stepped) {
  MUSTER_RETURN_IF_ERROR(tensors_->CatchUpShards(comm, stepped, LongDeadline()));
  MUSTER_RETURN_IF_ERROR(
      tensors_->TakeState(source, comm, /*in_step=*/false, counters_, LongDeadline()));
  world_->ReportCounters(*counters_);
  return absl::OkStatus();
}

ControlWords WorldChanges::CurrentControl() const {
  ControlWords w;
  w.stop = options_.stop_asked() ||
           (options_.stop_after_step > 0 && counters_->step + 1 >= options_.stop_after_step);
  w.leave = world_->told_to_leave() || options_.leave_asked();
  w.newer_world = world_->newer_world_known();
  w.finish = options_.finish_asked();
  return w;
}

void WorldChanges::StepCommitted() {
  const absl::Time now = options_.clock->Now();
  if (deadline_.TakeTiming()) deadline_.StepTook(now - last_commit_);
  last_commit_ = now;
}

}  // namespace muster
