#include "trainer/elastic/sharded_optimizer_state.h"

#include <torch/torch.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "trainer/checkpoint/checkpointer.h"
#include "trainer/elastic/state_sync.h"

namespace muster {
namespace {

// Whether `a` and `b` hold the same tensors, in any order.
bool SameSet(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  const auto impls = [](const std::vector<torch::Tensor>& v) {
    std::vector<const void*> out;
    for (const torch::Tensor& t : v) out.push_back(t.unsafeGetTensorImpl());
    std::sort(out.begin(), out.end());
    return out;
  };
  return impls(a) == impls(b);
}

// The training state without its optimizers.
TrainingState WithoutOptimizers(const TrainingState& state) {
  TrainingState rest = state;
  rest.optimizers.clear();
  return rest;
}

}  // namespace

ShardedOptimizerState::ShardedOptimizerState(const TrainingState& state,
                                             OptimizerStateOptions options)
    : state_(state),
      options_(std::move(options)),
      sharded_(OptimizersOf(state_), options_.copies) {}

ShardedOptimizerState::~ShardedOptimizerState() { Close(); }

void ShardedOptimizerState::Close() {
  sync_.reset();       // its threads stop before the state they read goes
  sharded_.Release();  // leaving with shards: the optimizers get their parameters back
}

absl::Status ShardedOptimizerState::Check() const {
  absl::Status s = ShardedOptimizers::Check(OptimizersOf(state_));
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat("Options::shard_optimizer_state: ", s.message()));
}

absl::Status ShardedOptimizerState::AtBoundary(Communicator* comm, absl::Time deadline) {
  // -1 where the world keeps the state whole (ShardedOptimizers::KeepsWhole):
  // StateElements() then counts the whole state when asked, rather than
  // every step here.
  held_elements_ = sharded_.sharded() ? sharded_.StateElements().value_or(-1) : -1;
  return sharded_.AtBoundary(comm, deadline);
}

absl::Status ShardedOptimizerState::AllowsTrainedChange(const std::string& change) const {
  // The shards' layout holds the trained parameters of when it was made
  // (docs/sharding.md): a frozen one would step with zeros inside its
  // masters, an unfrozen one with a step count of its own.
  return absl::InvalidArgumentError(
      absl::StrCat(change,
                   " while the optimizer state is sharded (Options::shard_optimizer_state): "
                   "freeze and unfreeze only without sharding"));
}

GradientSync* ShardedOptimizerState::ResyncSync(const std::vector<torch::Tensor>& params) {
  // Every rank re-reduces through this world's plan, the ranks in the step
  // as those outside it (a spare in a dead rank's place, a survivor whose
  // boundary broke), which add zeros: the sync a rank last reduced with
  // may be of the failed world's layout (its buckets reduce-scattered by
  // its shards) or the whole state's, and the buckets of all ranks must be
  // the same.
  return sharded() ? PassSync(params) : nullptr;
}

GradientSync* ShardedOptimizerState::PassSync(const std::vector<torch::Tensor>& params) {
  if (!sharded()) {
    // Whole again: the gradient vectors go with the sync (the .grad that
    // are views of them until the next boundary).
    sync_.reset();
    plan_.clear();
    sharded_.UseGradientVectors({});
    return nullptr;
  }
  const OptimizerShards& shards = *sharded_.shards();
  // With two copies a rank steps its buddy's shard too: the reduction gives
  // it both where they share its column (two nodes of equal size);
  // elsewhere the pass all-reduces.
  const bool columns = shards.layout().copies() > 1;
  const bool scatter =
      options_.reduce_scatter &&
      (!columns || KeptInColumns(shards.layout(), static_cast<int>(comm_->NodeRanks().size())));
  // An all-reducing plan does not depend on the layout (only on the
  // parameters' sizes), so its sync and gradient vectors outlive a reshard.
  if (sync_ != nullptr && sync_->scatters() == scatter &&
      (!scatter || sync_of_ == sharded_.times_sharded())) {
    return SameSet(sync_->params(), params) ? sync_.get() : nullptr;
  }
  std::vector<torch::Tensor> trained;
  std::vector<std::vector<int64_t>> elements(static_cast<size_t>(shards.groups()));
  std::vector<size_t> first_of_group;
  for (int g = 0; g < shards.groups(); ++g) {
    first_of_group.push_back(trained.size());
    for (const torch::Tensor& p : shards.params(g)) {
      trained.push_back(p);
      elements[static_cast<size_t>(g)].push_back(p.numel());
    }
  }
  if (!SameSet(trained, params) || trained.empty()) return nullptr;
  MakeSync(std::move(trained), first_of_group, elements, scatter);
  return sync_.get();
}

void ShardedOptimizerState::MakeSync(std::vector<torch::Tensor> trained,
                                     const std::vector<size_t>& first_of_group,
                                     const std::vector<std::vector<int64_t>>& elements,
                                     bool scatter) {
  const OptimizerShards& shards = *sharded_.shards();
  const bool columns = shards.layout().copies() > 1;
  sync_.reset();  // its hooks go before the new sync's come
  constexpr int64_t kFloat = sizeof(float);
  plan_ = PlanBuckets(shards.layout(), elements,
                      static_cast<int64_t>(GradientSync::kFirstBucketBytes) / kFloat,
                      static_cast<int64_t>(options_.sync.bucket_bytes) / kFloat);
  std::vector<GradientSync::BucketPlan> plan;
  for (const ShardedBucket& b : plan_) {
    GradientSync::BucketPlan& bucket = plan.emplace_back();
    for (size_t j = b.first; j < b.last; ++j) {
      bucket.params.push_back(first_of_group[static_cast<size_t>(b.group)] + j);
    }
    if (scatter) bucket.scatter = b.counts;
    bucket.columns = scatter && columns;
  }
  if (scatter) {
    MUSTER_LOG(INFO) << "gradients reduce-scattered over " << shards.layout().world()
                     << " ranks in " << plan.size() << " buckets"
                     << (columns ? ", each rank keeping its column's segments" : "");
  } else {
    GiveGradientVectors(shards, trained.size(), &plan);
  }
  GradientSyncOptions options = options_.sync;
  if (scatter) {
    // Each bucket's segments go to the masters as its reduce-scatter
    // completes, and its buffer to the next bucket.
    options.take = [this](size_t i, int64_t offset, const torch::Tensor& part) {
      sharded_.TakeScattered(plan_[i], offset, part);
    };
  }
  sync_ = std::make_unique<GradientSync>(std::move(trained), std::move(plan), comm_,
                                         std::move(options));
  sync_of_ = sharded_.times_sharded();
}

void ShardedOptimizerState::GiveGradientVectors(const OptimizerShards& shards, size_t params,
                                                std::vector<GradientSync::BucketPlan>* plan) {
  // One vector per group, the group's gradients in its flat order; the last
  // bucket (the first group's first parameters: PlanBuckets goes from the
  // end) carries the words in front of them.
  const int64_t words = GradientSync::WordCount(plan->size(), params);
  const ShardedBucket& last = plan_.back();
  std::vector<torch::Tensor> vectors(static_cast<size_t>(shards.groups()));
  std::vector<torch::Tensor> storage(vectors.size());
  for (int g = 0; g < shards.groups(); ++g) {
    if (shards.params(g).empty()) continue;
    const int64_t front = g == last.group ? words : 0;
    storage[g] = torch::zeros({front + shards.layout().group_elements(g)},
                              shards.params(g).front().options().dtype(torch::kFloat32));
    vectors[g] = storage[g].narrow(0, front, shards.layout().group_elements(g));
  }
  for (size_t i = 0; i < plan->size(); ++i) {
    const ShardedBucket& b = plan_[i];
    const torch::Tensor& s = storage[static_cast<size_t>(b.group)];
    (*plan)[i].buffer =
        i + 1 == plan->size()
            ? s.narrow(0, 0, words + b.range.end)  // begins at 0
            : s.narrow(0, s.numel() - vectors[b.group].numel() + b.range.begin, b.range.size());
  }
  sharded_.UseGradientVectors(std::move(vectors));
  MUSTER_LOG(INFO) << "gradients all-reduced in " << plan->size()
                   << " buckets that are the sharded optimizers' gradient vectors";
}

bool ShardedOptimizerState::Reduced(const GradientSync* by) {
  if (by != nullptr && by == sync_.get() && by->scatters()) {
    sharded_.ScatteredTaken();  // bucket by bucket, by the sync (MakeSync)
    return true;
  }
  sharded_.TakeGradients();
  return false;
}

void ShardedOptimizerState::UseCommunicator(Communicator* comm) {
  comm_ = comm;
  if (sync_ != nullptr) sync_->SetCommunicator(comm);
}

absl::Status ShardedOptimizerState::Enter(Communicator* comm, const WorldInfo& world, int64_t step,
                                          const std::optional<FailedStepMark>& failed,
                                          absl::Time deadline) {
  return sharded_.Gather(comm, world.generation, world.node_rank(), deadline,
                         failed ? failed->step : -1, failed ? failed->generation : 0, step);
}

// Sharded state came to its keepers as the world was entered; the
// optimizers' lists hold each rank's own masters, so they stay out.
TrainingState ShardedOptimizerState::Transferred() const {
  return sharded() ? WithoutOptimizers(state_) : state_;
}

void ShardedOptimizerState::StateTransferred() {
  if (sharded()) sharded_.ParametersTransferred();
}

bool ShardedOptimizerState::GoesAlong(int leaving) const {
  return sharded() && (leaving == 0 || (leaving == 1 && options_.copies >= 2));
}

bool ShardedOptimizerState::CanHandOver(int leaving) const {
  return sharded() && sharded_.CanHandOver(comm_->size(), leaving);
}

void ShardedOptimizerState::LoadAtEntry(int64_t step, std::vector<ShardFileRef> files,
                                        FileSystem* fs) {
  ShardedOptimizers::PendingLoad load;
  load.step = step;
  load.fs = fs;
  load.names = state_.Parameters();
  load.whole = [this, files, fs] { return LoadOptimizerFromShards(files, state_, fs); };
  load.files = std::move(files);
  sharded_.LoadAtGather(std::move(load));
}

absl::StatusOr<OwnShardState> ShardedOptimizerState::OwnShard() const {
  if (!sharded()) return absl::FailedPreconditionError("the optimizer state is not sharded");
  return sharded_.shards()->OwnShard(state_.Parameters());
}

absl::Status ShardedOptimizerState::CheckAgrees(const std::vector<int64_t>& counters,
                                                Communicator* comm, absl::Time deadline) const {
  if (!sharded()) return CheckRanksAgree(state_, counters, comm, deadline);
  // The model, extras and counters are the same on every rank; the
  // optimizers' state is compared shard by shard, where it is held.
  MUSTER_RETURN_IF_ERROR(CheckRanksAgree(WithoutOptimizers(state_), counters, comm, deadline));
  return sharded_.shards()->CheckCopiesAgree(comm, deadline);
}

int64_t ShardedOptimizerState::StateElements() const {
  if (held_elements_ >= 0) return held_elements_;
  return OptimizerShards::WholeStateElements(OptimizersOf(state_)).value_or(-1);
}

}  // namespace muster
