#include "coordinator/generation_state.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "coordinator/rendezvous.h"

namespace muster {
namespace {

absl::Status Refused(const char* transition, GenerationPhase phase) {
  return absl::FailedPreconditionError(
      absl::StrCat(transition, " in phase ", GenerationPhaseName(phase)));
}

bool Live(GenerationPhase phase) {
  return phase == GenerationPhase::kForming || phase == GenerationPhase::kRunning ||
         phase == GenerationPhase::kRecovering || phase == GenerationPhase::kFinished;
}

}  // namespace

const char* GenerationPhaseName(GenerationPhase phase) {
  switch (phase) {
    case GenerationPhase::kNoWorld: return "no_world";
    case GenerationPhase::kForming: return "forming";
    case GenerationPhase::kRunning: return "running";
    case GenerationPhase::kRecovering: return "recovering";
    case GenerationPhase::kFinished: return "finished";
    case GenerationPhase::kShuttingDown: return "shutting_down";
  }
  return "unknown";
}

const char* JobStateName(JobState state) {
  switch (state) {
    case JobState::kWaiting: return "waiting";
    case JobState::kRunning: return "running";
    case JobState::kRecovering: return "recovering";
    case JobState::kFinished: return "finished";
    case JobState::kShuttingDown: return "shutting_down";
  }
  return "unknown";
}

// ---------------------------------------------------------------- transitions

absl::Status GenerationState::Loaded(World stored, absl::Time recover_deadline) {
  if (phase_ != GenerationPhase::kNoWorld || generation_ != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Loaded at generation ", generation_, " in phase ", GenerationPhaseName(phase_),
        "; it comes before any other transition"));
  }
  generation_ = stored.generation;
  if (stored.generation == 0 || stored.members.empty()) return absl::OkStatus();
  world_ = std::make_shared<World>(std::move(stored));
  if (world_->paused) return absl::OkStatus();  // kNoWorld, the paused world kept
  recover_deadline_ = recover_deadline;
  phase_ = GenerationPhase::kRecovering;
  return absl::OkStatus();
}

absl::Status GenerationState::Adopted(uint64_t generation) {
  if (generation <= generation_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "generation ", generation, " is not beyond the current generation ", generation_));
  }
  if (phase_ == GenerationPhase::kFinished || phase_ == GenerationPhase::kShuttingDown) {
    return Refused("Adopted", phase_);
  }
  if (world_live()) {
    return absl::InvalidArgumentError(absl::StrCat("after_generation ", generation,
                                                   " is newer than the current generation ",
                                                   generation_));
  }
  if (generation > kMaxAdoptedGeneration) {
    return absl::InvalidArgumentError(absl::StrCat("after_generation ", generation,
                                                   " is beyond any generation (at most ",
                                                   kMaxAdoptedGeneration, ")"));
  }
  generation_ = generation;
  return absl::OkStatus();
}

absl::Status GenerationState::Formed(World next) {
  if (phase_ != GenerationPhase::kNoWorld && phase_ != GenerationPhase::kForming &&
      phase_ != GenerationPhase::kRunning) {
    return Refused("Formed", phase_);
  }
  if (next.members.empty() || next.generation != generation_ + 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a world of ", next.size(), " members at generation ", next.generation,
        " cannot follow generation ", generation_, " (it needs members and the next number)"));
  }
  generation_ = next.generation;
  world_ = std::make_shared<World>(std::move(next));
  arrived_.assign(world_->size(), std::nullopt);
  arrivals_ = 0;
  phase_ = GenerationPhase::kForming;
  return absl::OkStatus();
}

absl::StatusOr<bool> GenerationState::Arrived(const std::string& id, int64_t step) {
  if (phase_ != GenerationPhase::kForming) return Refused("Arrived", phase_);
  const int rank = world_->RankOf(id);
  if (rank < 0) {
    return absl::NotFoundError(
        absl::StrCat("member ", id, " is not part of generation ", generation_));
  }
  return ArrivedAt(static_cast<uint32_t>(rank), step);
}

absl::StatusOr<bool> GenerationState::ArrivedAt(uint32_t rank, int64_t step) {
  if (phase_ != GenerationPhase::kForming) return Refused("Arrived", phase_);
  if (rank >= arrived_.size()) {
    return absl::OutOfRangeError(absl::StrCat("generation ", generation_, " has no rank ", rank,
                                              " (", world_->size(), " members)"));
  }
  if (!arrived_[rank].has_value()) ++arrivals_;
  arrived_[rank] = step;
  if (arrivals_ < world_->size()) return false;
  World* world = MutableWorld();
  for (size_t i = 0; i < world->members.size(); ++i) world->members[i].step = *arrived_[i];
  ChooseStateSource(world);
  ClearArrivals();
  phase_ = GenerationPhase::kRunning;
  return true;
}

absl::Status GenerationState::Paused() {
  if (phase_ != GenerationPhase::kForming && phase_ != GenerationPhase::kRunning) {
    return Refused("Paused", phase_);
  }
  ClearArrivals();
  phase_ = GenerationPhase::kNoWorld;
  return absl::OkStatus();
}

absl::Status GenerationState::Stopped() {
  if (phase_ != GenerationPhase::kForming && phase_ != GenerationPhase::kRunning &&
      phase_ != GenerationPhase::kRecovering) {
    return Refused("Stopped", phase_);
  }
  ClearArrivals();
  auto forgotten = std::make_shared<World>();
  forgotten->generation = generation_;
  world_ = std::move(forgotten);
  phase_ = GenerationPhase::kNoWorld;
  return absl::OkStatus();
}

absl::Status GenerationState::Recovered() {
  if (phase_ != GenerationPhase::kRecovering) return Refused("Recovered", phase_);
  phase_ = GenerationPhase::kRunning;
  return absl::OkStatus();
}

absl::Status GenerationState::Finished() {
  if (!Live(phase_)) return Refused("Finished", phase_);
  ClearArrivals();
  phase_ = GenerationPhase::kFinished;
  return absl::OkStatus();
}

bool GenerationState::ShuttingDown() {
  if (phase_ == GenerationPhase::kShuttingDown) return false;
  before_shutdown_ = phase_;
  ClearArrivals();
  phase_ = GenerationPhase::kShuttingDown;
  return true;
}

// ---------------------------------------------------------------- queries

JobState GenerationState::job_state() const {
  switch (phase_) {
    case GenerationPhase::kNoWorld: return JobState::kWaiting;
    case GenerationPhase::kForming:
    case GenerationPhase::kRunning: return JobState::kRunning;
    case GenerationPhase::kRecovering: return JobState::kRecovering;
    case GenerationPhase::kFinished: return JobState::kFinished;
    case GenerationPhase::kShuttingDown: return JobState::kShuttingDown;
  }
  return JobState::kWaiting;
}

bool GenerationState::world_live() const {
  return Live(phase_ == GenerationPhase::kShuttingDown ? before_shutdown_ : phase_);
}

bool GenerationState::complete() const {
  return phase_ == GenerationPhase::kRunning || phase_ == GenerationPhase::kRecovering;
}

bool GenerationState::RecoveryExpired(absl::Time now) const {
  return phase_ == GenerationPhase::kRecovering && now >= recover_deadline_;
}

absl::Status GenerationState::CheckGeneration(uint64_t generation) const {
  const bool live = world_live();
  if (generation < generation_ || (generation == generation_ && !live)) {
    return absl::AbortedError(absl::StrCat("generation ", generation,
                                           " is over; the current generation is ",
                                           generation_, live ? "" : " (paused)"));
  }
  if (generation > generation_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "generation ", generation, " does not exist; the current one is ", generation_));
  }
  return absl::OkStatus();
}

bool GenerationState::has_arrived(const std::string& id) const {
  const int rank = world_->RankOf(id);
  return rank >= 0 && has_arrived_at(static_cast<uint32_t>(rank));
}

// ---------------------------------------------------------------- private

World* GenerationState::MutableWorld() {
  // One holder: no one else can be reading it.
  if (world_.use_count() > 1) world_ = std::make_shared<World>(*world_);
  return world_.get();
}

void GenerationState::ClearArrivals() {
  arrived_.clear();
  arrivals_ = 0;
}

}  // namespace muster
