// The engine (engine.h) at a step boundary: the boundary's collectives,
// what its decision sets off (a checkpoint, the state published), the
// state check, and the stop.
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

absl::Status Engine::EndWithoutWorld() {
  // Told to stop (not to leave) while waiting for a world, as when the
  // time-limit warning comes in a paused job: there is no world to
  // checkpoint in, so this is a stop that resumes from the newest committed
  // checkpoint (exit 75, requeued), not a departure.
  if (!requests_.stop() || requests_.leave()) {
    MUSTER_RETURN_IF_ERROR(life_.End(StepOutcome::kLeft));
    Say(absl::StrCat("muster: left the job after step ", counters().step));
    return absl::OkStatus();
  }
  const bool saved = checkpointer_ && checkpointer_->newest_committed() == counters().step;
  MUSTER_RETURN_IF_ERROR(
      life_.End(saved ? StepOutcome::kStopped : StepOutcome::kStoppedWithoutCheckpoint));
  SayStopped("stopped while waiting for a world after step ");
  return absl::OkStatus();
}

absl::Status Engine::WholeState() {
  return RegroupUnlessOk(
      replica_.optimizer_state().MakeWhole(world_->comm(), changes_->LongDeadline()));
}

absl::Status Engine::CheckStateAgrees(const std::string& when, bool whole) {
  const uint64_t generation = world_->world().generation;
  // A checkpoint that follows (a world of one included) reads sharded
  // optimizer state whole; the check alone compares it sharded.
  if (whole) MUSTER_RETURN_IF_ERROR(WholeState());
  // After a regroup in it, the new world's entry made the state agree.
  if (life_.ended() || world_->world().generation != generation) return absl::OkStatus();
  if (step_.state_checked_at == counters().step || world_->comm()->size() == 1) {
    return absl::OkStatus();
  }
  absl::Status s = replica_.optimizer_state().CheckAgrees(counters().ToWords(), world_->comm(),
                                                          changes_->LongDeadline());
  if (s.ok()) step_.state_checked_at = counters().step;
  if (!absl::IsDataLoss(s)) return RegroupUnlessOk(s);
  s = absl::DataLossError(
      absl::StrCat("state check at step ", counters().step, " (", when, "): ", s.message()));
  MUSTER_LOG(ERROR) << s.message() << "; the run stops without checkpointing this step";
  return s;
}

// Some rank was told to stop, or every rank got SIGTERM (the whole job is
// preempted): every rank saw it in this step's all-reduce. Checkpoint and
// stop: kStopped once the checkpoint of this step is committed (a restart
// resumes from it), else kStoppedWithoutCheckpoint.
absl::Status Engine::Stop() {
  const int rank = world_->world().rank;
  // Every rank keeps the stop asked from here on: should a regroup come
  // before it is taken, the next step decides it again, even where the
  // one rank that was asked is the one that died.
  requests_.RequestStop();
  bool committed = false;
  // Sharded optimizer state is written where it is held, a file a rank, as
  // a scheduled checkpoint's: the stop's write is then 1/W of the state on
  // each rank rather than all of it on rank 0.
  const bool sharded = checkpointer_ && replica_.optimizer_state().sharded();
  if (checkpointer_) {
    const uint64_t generation = world_->world().generation;
    MUSTER_RETURN_IF_ERROR(CheckStateAgrees("before the checkpoint to stop", /*whole=*/!sharded));
    // A regroup in the check: the new world's ranks (a joiner among them)
    // are not all stopping at this boundary, and none of its collectives
    // runs there; the stop, still asked, is the next step's decision.
    if (!life_.ended() && world_->world().generation != generation) return absl::OkStatus();
  }
  if (checkpointer_ && !life_.ended()) {  // else the check's regroup found no world
    const absl::StatusOr<OwnShardState> own =
        sharded ? replica_.optimizer_state().OwnShard() : absl::StatusOr<OwnShardState>();
    MUSTER_ASSIGN_OR_RETURN(committed, checkpointer_->TakeToStop(world_->client(), world_->comm(),
                                                                 rank, CommittedStepMeta(),
                                                                 changes_->LongDeadline(),
                                                                 sharded ? &own : nullptr));
  }
  if (sharded && !life_.ended()) GiveBackOptimizers();
  // Every rank stops at this step: the coordinator forgets the world once
  // all have said so, and a restart of it (a requeue) waits for none.
  world_->Leave(Departure::kStopping, counters().step).IgnoreError();
  MUSTER_RETURN_IF_ERROR(
      life_.End(committed ? StepOutcome::kStopped : StepOutcome::kStoppedWithoutCheckpoint));
  if (rank == 0) SayStopped("stopping at step ");
  return absl::OkStatus();
}

// Some rank asked to finish (RequestFinish: early stopping), and every rank
// saw it in this step's all-reduce: the job ends here as after its last
// step (the optimizers given back as there), kFinished.
absl::Status Engine::FinishEarly() {
  // Kept from here on: should a regroup come before it is taken, the next
  // step decides it again, even where the rank that asked is gone.
  requests_.RequestFinish();
  const uint64_t generation = world_->world().generation;
  MUSTER_RETURN_IF_ERROR(GiveBackAtEnd());
  if (life_.ended() || world_->world().generation != generation) return absl::OkStatus();
  if (world_->world().rank == 0) {
    Say(absl::StrCat("muster: finished at step ", counters().step, ", as the program asked"));
  }
  return life_.End(StepOutcome::kFinished);
}

// At the end of training (its last step, or a finish asked): the program
// gets its optimizers back, the whole state only where it asked
// (Options::whole_optimizer_state_at_end), which may regroup.
absl::Status Engine::GiveBackAtEnd() {
  if (options_.whole_optimizer_state_at_end) return WholeState();
  replica_.optimizer_state().Release();
  return absl::OkStatus();
}

// After the checkpoint to stop, as at the end of training: the program gets
// its optimizers back with their own parameter lists, and the whole state
// only where it asked (Options::whole_optimizer_state_at_end: a moment of
// unsharded memory). The job is stopping, so a failure starts no regroup:
// the state is dropped, the checkpoint (if it committed) holds it.
void Engine::GiveBackOptimizers() {
  if (!options_.whole_optimizer_state_at_end) {
    replica_.optimizer_state().Release();
    return;
  }
  if (absl::Status s =
          replica_.optimizer_state().MakeWhole(world_->comm(), changes_->LongDeadline());
      !s.ok()) {
    MUSTER_LOG(WARNING) << "the optimizer state could not be made whole after the checkpoint to "
                           "stop ("
                        << s.message() << "); the optimizers are given back without it";
    replica_.optimizer_state().Release();
  }
}

// The stop's last word, from one rank: what a restart resumes from.
void Engine::SayStopped(const std::string& how) const {
  if (life_.outcome() == StepOutcome::kStopped) {
    Say(absl::StrCat("muster: ", how, counters().step, " after checkpointing"));
    return;
  }
  const int64_t from = checkpointer_ ? checkpointer_->NewestInCatalog(world_->client()) : 0;
  const std::string why = checkpointer_ ? "its checkpoint did not commit"
                                        : "no checkpoint dir is set, nothing was saved";
  MUSTER_LOG(ERROR) << how << counters().step << " without a checkpoint of it (" << why
                    << "): a restart resumes from "
                    << (from > 0 ? absl::StrCat("the checkpoint of step ", from)
                                 : std::string("the start"))
                    << " and repeats " << counters().step - from << " steps";
  Say(absl::StrCat("muster: ", how, counters().step, " without a checkpoint (", why,
                   "); a restart resumes from step ", from));
}

absl::Status Engine::AtBoundary() {
  const uint64_t generation = world_->world().generation;
  // A peer that fails during the boundary's collectives leaves the
  // survivors at different points: with sharded state the gather runs
  // inside each node, so one node's ranks may have finished it and wait in
  // the buffers' all-reduce while the other node's fail in the gather; any
  // collective may complete on some ranks and fail on others; and a rank
  // whose step's reduction failed where its peers' completed enters the
  // new world behind, takes their state and does not run this boundary at
  // all. Going on from where each one was, the ranks of the new world
  // would issue different collectives (over Gloo, a message of one call
  // received by another aborts the process). So after a regroup none of
  // the boundary's collectives runs: the new world's entry made the state
  // agree, and the next boundary syncs the buffers and checks the state.
  MUSTER_RETURN_IF_ERROR(BoundaryCollectives());
  if (life_.ended()) return absl::OkStatus();
  reporter_->StepDone(progress(), lr_->current(), replica_.last_gradient_norm());
  // The world changes after this boundary. The shards go along where each
  // range keeps a holder in the next world (OptimizerState::GoesAlong), and
  // that world moves them straight to its own (ShardedOptimizers::Gather);
  // where a leaver's ranges have no other holder (one copy, or two ranks
  // leaving), they are first handed over to the ranks that stay
  // (OptimizerState::HandOver); a leaver that asked for its optimizers whole at the
  // end needs them whole here. Elsewhere the state is made whole first, so
  // that nothing goes with a rank that leaves. A stop with a checkpoint
  // writes it sharded (Stop), every rank stopping. Every rank decides
  // alike: the words are the world's.
  const int leaving = RanksLeaving(replica_.control(), world_->world().world_size);
  const bool changes =
      step_.decision == StepDecision::kRegroup || step_.decision == StepDecision::kLeave;
  const bool whole_at_end = leaving > 0 && options_.whole_optimizer_state_at_end;
  bool shards_go_along = changes && replica_.optimizer_state().GoesAlong(leaving) && !whole_at_end;
  if (changes && !shards_go_along && !whole_at_end &&
      replica_.optimizer_state().CanHandOver(leaving)) {
    MUSTER_RETURN_IF_ERROR(RegroupUnlessOk(replica_.optimizer_state().HandOver(
        world_->comm(), step_.decision == StepDecision::kLeave, changes_->LongDeadline())));
    if (life_.ended()) return absl::OkStatus();
    // A world that broke in it is another: the leave is made whole there.
    shards_go_along = world_->world().generation == generation;
  }
  if (step_.decision != StepDecision::kContinue && step_.decision != StepDecision::kFinish &&
      !(step_.decision == StepDecision::kStop && checkpointer_) && !shards_go_along) {
    MUSTER_RETURN_IF_ERROR(WholeState());
    if (life_.ended()) return absl::OkStatus();
  }
  switch (step_.decision) {
    case StepDecision::kFinish:
      MUSTER_RETURN_IF_ERROR(FinishEarly());
      if (life_.ended()) return absl::OkStatus();
      break;  // a regroup while making the state whole: the next step finishes
    case StepDecision::kStop:
      return Stop();
    case StepDecision::kLeave:
      // This trainer leaves after this step; the others regroup without it
      // (its shards, if it went without making them whole, live on in its
      // buddies).
      if (shards_go_along) replica_.optimizer_state().Release();
      world_->Leave(Departure::kLeaving, counters().step).IgnoreError();
      if (checkpointer_) checkpointer_->Wait().IgnoreError();  // logged when it failed
      Say(absl::StrCat("muster: left the job after step ", counters().step));
      return life_.End(StepOutcome::kLeft);
    case StepDecision::kRegroup:
      // Every rank stops after this same step and enters the new generation.
      MUSTER_RETURN_IF_ERROR(Regroup("a membership change at a step boundary", /*broken=*/false));
      if (life_.ended()) return absl::OkStatus();
      break;
    case StepDecision::kContinue:
      break;
  }
  return AfterDecision(world_->world().generation != generation);
}

absl::Status Engine::BoundaryCollectives() {
  const uint64_t generation = world_->world().generation;
  const auto regrouped = [&] {
    return life_.ended() || world_->world().generation != generation;
  };
  // A salvaged step that some ranks (joiners) were outside of: they take
  // it from the ranks in it, as they entered the world (WorldChanges::
  // Salvage), before the gather that they then run at their own boundary.
  if (const int source = life_.TakeCatchUp(); source >= 0) {
    MUSTER_RETURN_IF_ERROR(
        RegroupUnlessOk(changes_->CatchUp(world_->comm(), source, /*stepped=*/true)));
    if (regrouped()) return absl::OkStatus();
  }
  // Sharded optimizer state: each rank stepped its own parts.
  const bool sharded = replica_.optimizer_state().sharded();
  const absl::Time gather_start = clock_->Now();
  MUSTER_RETURN_IF_ERROR(RegroupUnlessOk(
      replica_.optimizer_state().AtBoundary(world_->comm(), changes_->StepDeadline())));
  if (sharded) timeline_.Add(StepClock::Part::kGather, clock_->Now() - gather_start);
  if (regrouped()) return absl::OkStatus();
  // After every pass of the step, before anything reads the state.
  MUSTER_RETURN_IF_ERROR(
      RegroupUnlessOk(replica_.SyncBuffers(world_->comm(), changes_->StepDeadline())));
  if (regrouped()) return absl::OkStatus();
  if (options_.check_state_every > 0 && counters().step % options_.check_state_every == 0) {
    return CheckStateAgrees(absl::StrCat("every ", options_.check_state_every, " steps"),
                            /*whole=*/false);
  }
  return absl::OkStatus();
}

// The boundary goes on in a world: a scheduled checkpoint, the state
// published for someone who pulls it (muster pull-weights).
absl::Status Engine::AfterDecision(bool world_changed) {
  // By steps, or by time as the step's control words agreed: every rank
  // checkpoints after the same step.
  const bool due = checkpointer_ && (checkpointer_->DueAtStep(counters().step) ||
                                     step_.checkpoint_due || checkpointer_->deferred());
  if (checkpointer_) checkpointer_->set_deferred(due && world_changed);
  if (due && !world_changed) {
    // Sharded optimizer state is written where it is held, a file a rank.
    const bool sharded = replica_.optimizer_state().sharded();
    const uint64_t generation = world_->world().generation;
    MUSTER_RETURN_IF_ERROR(CheckStateAgrees("before a checkpoint", /*whole=*/!sharded));
    if (life_.ended()) return absl::OkStatus();
    if (world_->world().generation != generation) {
      // A regroup in the check: as after any regroup in a boundary, none
      // of its collectives runs in the new world (a joiner would be in the
      // next step's): the checkpoint waits for the next boundary.
      checkpointer_->set_deferred(true);
      return absl::OkStatus();
    }
    // A scheduled checkpoint that fails is skipped: training goes on.
    if (sharded) {
      absl::StatusOr<bool> taken = checkpointer_->TakeSharded(
          world_->client(), world_->comm(), world_->world().rank, CommittedStepMeta(),
          replica_.optimizer_state().OwnShard(), changes_->LongDeadline());
      MUSTER_RETURN_IF_ERROR(RegroupUnlessOk(taken.status()));
      if (life_.ended()) return absl::OkStatus();
    } else if (absl::Status s = checkpointer_->Take(world_->client(), world_->world().rank,
                                                    CommittedStepMeta());
               !s.ok()) {
      MUSTER_LOG(WARNING) << s << "; skipped";
    }
  }
  replica_.PublishTo(state_server_.get(), counters().step, world_->world().generation,
                     world_->client()->member_id());
  return absl::OkStatus();
}

}  // namespace muster
