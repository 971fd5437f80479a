#include "trainer/elastic/sharded_optimizers.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "trainer/comm/values.h"
#include "trainer/elastic/state_sync.h"

namespace muster {

ShardedOptimizers::ShardedOptimizers(std::vector<torch::optim::Optimizer*> optimizers, int copies)
    : optimizers_(std::move(optimizers)), copies_(copies) {}

absl::Status ShardedOptimizers::Check(const std::vector<torch::optim::Optimizer*>& optimizers) {
  return OptimizerShards::Check(optimizers);
}

absl::Status ShardedOptimizers::Gather(Communicator* comm, uint64_t generation, int node,
                                       absl::Time deadline, int64_t failed_step,
                                       uint64_t failed_generation, int64_t step) {
  const bool holds = shards_ != nullptr;
  const bool whole = !holds && whole_.has_value();
  MUSTER_ASSIGN_OR_RETURN(
      const ShardWorld agreed,
      AgreeOnShards(comm, node, holds ? generation_ : whole ? whole_of_ : 0,
                    holds ? shards_->rank() : whole ? kHoldsWholeState : -1,
                    holds ? shards_->layout().world() : whole ? whole_->world() : 0, deadline,
                    failed_step, failed_generation, step));
  // This world's, for Shard (after Release too, where the gather failed).
  node_of_rank_ = agreed.node_of_rank;
  gathered_for_ = VersionOf(generation);
  const bool counts = holds && agreed.layout_rank[comm->rank()] >= 0;
  if (holds && !counts) {
    // Of an older layout (received as a joiner's), or of fewer steps than
    // another holder's (AgreeOnShards): this rank's new shards come from
    // the holders.
    MUSTER_LOG(INFO) << "the optimizer state this rank holds is older than the world's (of "
                     << "generation " << generation_ << " at step " << step
                     << "): dropped; this rank receives its shards as a joiner does";
    Release();
  }
  MUSTER_ASSIGN_OR_RETURN(const bool loaded,
                          LoadPending(comm, agreed.generation == 0, deadline));
  if (loaded) return absl::OkStatus();
  if (WholeOnlyToSalvage(agreed, comm->size())) {
    return absl::ResourceExhaustedError(
        "entering this world would make the optimizer state whole on every rank, to bring the "
        "failed step to ranks outside it that no rank in it keeps the shards of: the step is "
        "dropped and the world entered again");
  }
  if (Straight(agreed, comm->size())) {
    MUSTER_ASSIGN_OR_RETURN(std::unique_ptr<OptimizerShards> moved,
                            OptimizerShards::Redistribute(
                                counts ? shards_.get() : nullptr,
                                whole && agreed.whole_source == comm->rank() ? &*whole_ : nullptr,
                                optimizers_, agreed, copies_, comm, deadline));
    shards_ = std::move(moved);
    generation_ = gathered_for_;
    ++times_sharded_;
    whole_.reset();
    MUSTER_LOG(INFO) << "optimizer state moved straight to the shards of a world of "
                     << comm->size() << ": " << shards_->StateElements()
                     << " elements kept on this rank";
    return absl::OkStatus();
  }
  std::optional<ShardLayout> layout;
  if (counts) layout = shards_->layout();
  if (whole && agreed.whole_source == comm->rank()) {
    MUSTER_RETURN_IF_ERROR(
        OptimizerShards::SendWhole(optimizers_, *whole_, agreed.alive, comm, deadline));
  } else if (counts) {
    MUSTER_RETURN_IF_ERROR(shards_->Unshard(agreed.alive, comm, deadline, agreed.whole_source));
  } else {
    MUSTER_RETURN_IF_ERROR(OptimizerShards::ReceiveUnsharded(optimizers_, comm, deadline));
  }
  shards_.reset();
  // Whole as of that layout: a source of every range if the world breaks
  // again before a step, and another rank's regather had not completed.
  if (agreed.generation != 0 && (counts || (whole && whole_of_ == agreed.generation))) {
    if (counts) whole_ = std::move(layout);
    whole_of_ = agreed.generation;
  } else {
    whole_.reset();
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> ShardedOptimizers::LoadPending(Communicator* comm, bool fresh,
                                                    absl::Time deadline) {
  if (fresh && !KeepsWhole(comm->size())) {
    // Whether every rank restored the same step (a rank with nothing
    // pending says a value no step has).
    const absl::Status same = CheckSameDigest(
        pending_ ? static_cast<uint64_t>(pending_->step) : ~uint64_t{0}, comm, deadline);
    if (!same.ok() && !absl::IsDataLoss(same)) return same;
    if (same.ok() && pending_) {
      const PendingLoad load = *std::move(pending_);
      pending_.reset();
      absl::StatusOr<std::unique_ptr<OptimizerShards>> shards = OptimizerShards::Load(
          optimizers_, load.names, comm->rank(), node_of_rank_, copies_, load.fs, load.files);
      if (!shards.ok()) {
        return absl::Status(shards.status().code(),
                            absl::StrCat("the optimizer state of the checkpoint of step ",
                                         load.step, ": ", shards.status().message()));
      }
      shards_ = *std::move(shards);
      generation_ = gathered_for_;
      ++times_sharded_;
      whole_.reset();
      MUSTER_LOG(INFO) << "optimizer state of the checkpoint of step " << load.step
                       << " read into the shards of a world of " << comm->size() << ": "
                       << shards_->StateElements() << " elements kept on this rank";
      return true;
    }
  }
  if (!pending_) return false;
  const std::function<absl::Status()> whole = std::move(pending_->whole);
  pending_.reset();
  if (fresh) MUSTER_RETURN_IF_ERROR(whole());
  return false;
}

bool ShardedOptimizers::Straight(const ShardWorld& agreed, int world) const {
  if (agreed.generation == 0 || KeepsWhole(world)) return false;
  // The whole source's state is as of the boundary its regather began at:
  // it sends only where no rank is in a step.
  if (agreed.whole_source >= 0) return agreed.one_step;
  return agreed.one_step || SteppersKeepEveryShard(agreed);
}

bool ShardedOptimizers::WholeOnlyToSalvage(const ShardWorld& agreed, int world) const {
  if (agreed.generation == 0 || KeepsWhole(world) || agreed.one_step) return false;
  // Ranks outside the one failed step, holding nothing or the state it
  // began from: without it the world would go straight.
  return agreed.outside_step.size() == agreed.node_of_rank.size() && !Straight(agreed, world);
}

bool ShardedOptimizers::SteppersKeepEveryShard(const ShardWorld& agreed) const {
  if (agreed.outside_step.size() != agreed.node_of_rank.size()) return false;
  // Who keeps which shard does not depend on the groups' sizes.
  const absl::StatusOr<ShardLayout> layout =
      ShardLayout::Make({int64_t{0}}, agreed.node_of_rank, copies_);
  if (!layout.ok()) return false;
  for (int s = 0; s < layout->world(); ++s) {
    bool stepped = false;
    for (int holder : layout->Holders(s)) stepped = stepped || !agreed.outside_step[holder];
    if (!stepped) return false;
  }
  return true;
}

absl::Status ShardedOptimizers::CatchUp(Communicator* comm, bool stepped, absl::Time deadline) {
  if (shards_ == nullptr) return absl::OkStatus();
  std::vector<int64_t> steppers(static_cast<size_t>(comm->size()), 0);
  steppers[static_cast<size_t>(comm->rank())] = stepped ? 1 : 0;
  MUSTER_RETURN_IF_ERROR(AllReduceValues(comm, steppers.data(), steppers.size(),
                                         DataType::kInt64, ReduceOp::kSum, deadline));
  // The same layout, its ranks outside the step counted as gone: each of
  // their shards comes from a keeper that stepped it.
  ShardWorld agreed;
  agreed.node_of_rank = node_of_rank_;
  agreed.generation = generation_;
  for (int r = 0; r < comm->size(); ++r) {
    agreed.alive.push_back(steppers[static_cast<size_t>(r)] > 0);
    agreed.layout_rank.push_back(agreed.alive.back() ? r : -1);
  }
  if (!stepped) Release();  // its shards as they were before the step
  MUSTER_ASSIGN_OR_RETURN(
      std::unique_ptr<OptimizerShards> moved,
      OptimizerShards::Redistribute(shards_.get(), /*whole=*/nullptr, optimizers_, agreed, copies_,
                                    comm, deadline));
  shards_ = std::move(moved);
  ++times_sharded_;
  if (!stepped) {
    MUSTER_LOG(INFO) << "optimizer state of the salvaged step taken into this rank's shards: "
                     << shards_->StateElements() << " elements kept on this rank";
  }
  return absl::OkStatus();
}

absl::Status ShardedOptimizers::HandOver(Communicator* comm, bool leaves, absl::Time deadline) {
  if (shards_ == nullptr) return absl::OkStatus();
  std::vector<int64_t> leaving(static_cast<size_t>(comm->size()), 0);
  leaving[static_cast<size_t>(comm->rank())] = leaves ? 1 : 0;
  MUSTER_RETURN_IF_ERROR(AllReduceValues(comm, leaving.data(), leaving.size(), DataType::kInt64,
                                         ReduceOp::kSum, deadline));
  std::vector<bool> leaves_by_rank;
  for (int64_t l : leaving) leaves_by_rank.push_back(l > 0);
  MUSTER_ASSIGN_OR_RETURN(std::unique_ptr<OptimizerShards> moved,
                          OptimizerShards::HandOver(shards_.get(), optimizers_, leaves_by_rank,
                                                    copies_, comm, deadline));
  shards_ = std::move(moved);
  whole_.reset();
  if (shards_ == nullptr) return absl::OkStatus();  // a leaver: the groups are as after Release
  generation_ = generation_ | 1;
  ++times_sharded_;
  MUSTER_LOG(INFO) << "optimizer state handed over to the shards of the "
                   << shards_->layout().world() << " ranks that stay: "
                   << shards_->StateElements() << " elements kept on this rank";
  return absl::OkStatus();
}

absl::Status ShardedOptimizers::Shard(Communicator* comm) {
  if (shards_ != nullptr) return absl::FailedPreconditionError("the state is sharded already");
  if (static_cast<int>(node_of_rank_.size()) != comm->size()) {
    return absl::FailedPreconditionError("shard before the world's Gather");
  }
  if (KeepsWhole(comm->size())) return absl::OkStatus();
  MUSTER_ASSIGN_OR_RETURN(shards_,
                          OptimizerShards::Make(optimizers_, comm->rank(), node_of_rank_, copies_));
  generation_ = gathered_for_;
  ++times_sharded_;
  whole_.reset();
  return absl::OkStatus();
}

void ShardedOptimizers::TakeGradients() {
  whole_.reset();  // a step follows: the whole state moves on from its layout
  if (shards_ == nullptr) return;
  for (int g = 0; g < shards_->groups(); ++g) {
    if (static_cast<size_t>(g) < gradient_vectors_.size() &&
        gradient_vectors_[static_cast<size_t>(g)].defined()) {
      shards_->UseGradientVector(g, gradient_vectors_[static_cast<size_t>(g)]);
    }
    shards_->ShareGradients(g);
  }
}

void ShardedOptimizers::TakeScattered(const ShardedBucket& b, int64_t offset,
                                      const torch::Tensor& part) {
  if (shards_ == nullptr) return;
  const int64_t end = offset + part.numel();
  for (int shard : shards_->layout().KeptBy(shards_->rank())) {
    // Segment s of a bucket is shard s's part: what of it lies in `part`.
    const auto at = static_cast<int64_t>(SegmentOffset(b.counts, shard));
    const int64_t lo = std::max(at, offset),
                  hi = std::min(at + static_cast<int64_t>(b.counts[static_cast<size_t>(shard)]), end);
    if (hi <= lo) continue;
    shards_->SetKeptGradient(b.group, shard,
                             ElementRange{b.range.begin + lo, b.range.begin + hi},
                             part.narrow(0, lo - offset, hi - lo));
  }
}

double ShardedOptimizers::OwnGradientSquares() const {
  return shards_ == nullptr ? 0 : shards_->KeptGradientSquares(shards_->rank());
}

void ShardedOptimizers::ScaleKeptGradients(double factor) {
  if (shards_ != nullptr) shards_->ScaleKeptGradients(factor);
}

absl::Status ShardedOptimizers::AtBoundary(Communicator* comm, absl::Time deadline) {
  if (shards_ == nullptr) return absl::OkStatus();
  MUSTER_RETURN_IF_ERROR(shards_->GatherParameters(comm, deadline));
  shards_->ResetParameterGradients();
  return absl::OkStatus();
}

absl::Status ShardedOptimizers::BetweenPasses(Communicator* comm, absl::Time deadline) {
  if (shards_ == nullptr) return absl::OkStatus();
  return shards_->GatherStepped(comm, deadline);
}

absl::Status ShardedOptimizers::Whole(Communicator* comm, absl::Time deadline) {
  if (shards_ == nullptr) return absl::OkStatus();
  const ShardLayout layout = shards_->layout();
  MUSTER_RETURN_IF_ERROR(
      shards_->Unshard(std::vector<bool>(shards_->layout().world(), true), comm, deadline));
  shards_.reset();
  whole_ = layout;
  whole_of_ = generation_;
  return absl::OkStatus();
}

absl::Status ShardedOptimizers::WithWholeState(Communicator* comm,
                                               const std::function<absl::Status()>& path,
                                               absl::Time deadline) {
  if (shards_ == nullptr) return path();
  MUSTER_RETURN_IF_ERROR(Whole(comm, deadline));
  const absl::Status s = path();
  MUSTER_RETURN_IF_ERROR(Shard(comm));
  return s;
}

absl::Status ShardedOptimizers::Reshard(Communicator* comm) {
  if (shards_ != nullptr) return absl::OkStatus();
  MUSTER_RETURN_IF_ERROR(Shard(comm));
  if (shards_ != nullptr) shards_->ResetParameterGradients();  // none where KeepsWhole
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ShardedOptimizers::StateElements() const {
  if (shards_ != nullptr) return shards_->StateElements();
  return OptimizerShards::WholeStateElements(optimizers_);
}

void ShardedOptimizers::Release() {
  whole_.reset();
  if (shards_ == nullptr) return;
  shards_->Release();
  shards_.reset();
}

}  // namespace muster
