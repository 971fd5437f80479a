#include "coordinator/regroup_state.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace muster {
namespace {

absl::Status Refused(const char* transition, RegroupStage stage) {
  return absl::FailedPreconditionError(
      absl::StrCat(transition, " in regroup stage ", RegroupStageName(stage)));
}

}  // namespace

const char* RegroupStageName(RegroupStage stage) {
  switch (stage) {
    case RegroupStage::kIdle: return "idle";
    case RegroupStage::kForming: return "forming";
    case RegroupStage::kFormingByDeadline: return "forming_by_deadline";
    case RegroupStage::kCompleted: return "completed";
    case RegroupStage::kPaused: return "paused";
  }
  return "unknown";
}

void RegroupState::Formed(absl::Time now) {
  stage_ = RegroupStage::kForming;
  formed_at_ = now;
  paused_since_ = absl::InfiniteFuture();
  arrival_.Clear();
  timer_.Reset();
}

absl::Status RegroupState::ArriveWithin(absl::Duration window) {
  if (stage_ != RegroupStage::kForming) return Refused("ArriveWithin", stage_);
  stage_ = RegroupStage::kFormingByDeadline;
  arrival_.Set(formed_at_, window);
  return absl::OkStatus();
}

absl::StatusOr<absl::Duration> RegroupState::ArrivalMissed() {
  if (stage_ != RegroupStage::kFormingByDeadline) return Refused("ArrivalMissed", stage_);
  stage_ = RegroupStage::kForming;
  arrival_.Clear();
  return arrival_.window();
}

absl::Status RegroupState::ArrivalExtended(absl::Time now) {
  if (stage_ != RegroupStage::kFormingByDeadline) return Refused("ArrivalExtended", stage_);
  arrival_.Set(now, arrival_.window());
  return absl::OkStatus();
}

absl::StatusOr<RegroupCompletion> RegroupState::Completed(std::shared_ptr<const World> world,
                                                          absl::Time now) {
  if (stage_ != RegroupStage::kForming && stage_ != RegroupStage::kFormingByDeadline) {
    return Refused("Completed", stage_);
  }
  if (world == nullptr) return absl::InvalidArgumentError("Completed without a world");
  stage_ = RegroupStage::kCompleted;
  arrival_.Clear();
  // Told once for all: the change from the world its members hold.
  delta_base_ = std::move(completed_);
  delta_.reset();
  if (delta_base_ != nullptr) {
    if (std::optional<WorldDelta> d = MakeWorldDelta(*delta_base_, *world)) {
      delta_ = std::make_shared<const WorldDelta>(std::move(*d));
    }
  }
  completed_ = world;
  RegroupCompletion done;
  done.took = now - formed_at_;
  std::vector<RendezvousWaiter> taken = waiters_.TakeAnsweredBy(*world);
  done.answers.reserve(taken.size());
  for (RendezvousWaiter& w : taken) {
    done.answers.emplace_back(
        std::move(w.done),
        ResultFor(w.member, world, static_cast<uint32_t>(w.rank), w.takes_delta));
  }
  return done;
}

void RegroupState::Paused(absl::Time now) {
  stage_ = RegroupStage::kPaused;
  paused_since_ = now;
  arrival_.Clear();
}

RendezvousResult RegroupState::ResultFor(const MemberKey& key,
                                         std::shared_ptr<const World> world, uint32_t rank,
                                         bool takes_delta) const {
  RendezvousResult result{std::move(world), rank, nullptr};
  if (!takes_delta || delta_ == nullptr || result.world != completed_) return result;
  const std::optional<uint32_t> base_rank = BaseRank(*delta_, rank);
  if (base_rank.has_value() && *base_rank < delta_base_->members.size() &&
      delta_base_->members[*base_rank].member == key) {
    result.delta = delta_;
  }
  return result;
}

}  // namespace muster
