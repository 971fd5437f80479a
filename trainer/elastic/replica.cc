#include "trainer/elastic/replica.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "muster/sync_batch_norm.h"
#include "trainer/checkpoint/checkpointer.h"
#include "trainer/checkpoint/state_tensors.h"
#include "trainer/comm/values.h"
#include "trainer/ddp/unscale.h"
#include "trainer/elastic/sharded_optimizers.h"
#include "trainer/elastic/state_sync.h"

namespace muster {

namespace {

// Named modules or several optimizers: a step may hold several passes.
bool HasSeveralPasses(const TrainingState& state) {
  return state.optimizers.size() > 1 ||
         std::any_of(state.modules.begin(), state.modules.end(),
                     [](const TrainingState::Module& m) { return !m.name.empty(); });
}

std::vector<torch::optim::Optimizer*> OptimizersOf(const TrainingState& state) {
  std::vector<torch::optim::Optimizer*> optimizers;
  for (const TrainingState::Optimizer& o : state.optimizers) optimizers.push_back(o.optimizer);
  return optimizers;
}

// Whether `a` and `b` are the same tensors (not equal values), in order.
bool SameTensors(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(),
                    [](const torch::Tensor& x, const torch::Tensor& y) { return x.is_same(y); });
}

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

}  // namespace

Replica::Replica(TrainingState state, ReplicaOptions options)
    : state_(std::move(state)), options_(options), several_passes_(HasSeveralPasses(state_)) {
  if (options_.shard_copies > 0) {
    sharded_ = std::make_unique<ShardedOptimizers>(OptimizersOf(state_), options_.shard_copies);
  }
  statistics_ = std::make_shared<WorldStatistics>(options_.clock);
  for (const TrainingState::Module& m : state_.modules) {
    for (const std::shared_ptr<torch::nn::Module>& sub : m.module->modules()) {
      if (auto* bn = dynamic_cast<SyncBatchNormImpl*>(sub.get())) bn->set_reducer(statistics_);
    }
  }
  if (!options_.broadcast_buffers) return;
  std::vector<torch::nn::Module*> modules;
  for (const TrainingState::Module& m : state_.modules) modules.push_back(m.module);
  buffers_ = std::make_unique<BufferSync>(BufferSync::HoldersOf(modules));
}

Replica::~Replica() { Close(); }

void Replica::Close() {
  statistics_->SetWorld(nullptr);  // a SyncBatchNorm used after the job is BatchNorm
  statistics_->EndPass();
  current_ = nullptr;
  syncs_.clear();  // their threads stop before the state they read goes
  shard_.sync.reset();
  ReleaseShards();  // leaving with shards: the optimizers get their parameters back
}

void Replica::PublishTo(StateServer* server, int64_t step, uint64_t generation,
                        const std::string& member) const {
  if (server == nullptr || !server->Wanted(step)) return;
  absl::StatusOr<std::string> image = EncodeSafetensors(
      state_.Model(),
      {{"format", "muster"}, {"step", std::to_string(step)}, {"member", member}});
  if (!image.ok()) {
    MUSTER_LOG(WARNING) << "state of step " << step << " not published: " << image.status();
    return;
  }
  server->Publish(step, generation, std::move(*image));
}

absl::StatusOr<GradientSync*> Replica::SyncFor(const std::vector<std::string>& modules) {
  std::set<std::string> wanted(modules.begin(), modules.end());
  const std::string key = absl::StrJoin(wanted, ",");
  std::vector<torch::Tensor> params;
  std::vector<std::string> known;
  std::set<const void*> seen;
  const bool all = wanted.empty();
  for (const TrainingState::Module& m : state_.modules) {
    if (!m.name.empty()) known.push_back(m.name);
    if (!all && wanted.erase(m.name) == 0) continue;
    for (const torch::Tensor& p : m.module->parameters()) {
      // A tied weight is listed under each of its names: reduce it once.
      if (p.requires_grad() && seen.insert(p.unsafeGetTensorImpl()).second) params.push_back(p);
    }
  }
  if (!wanted.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("BeforeBackwardFor: no module '", *wanted.begin(), "' in State::modules (",
                     absl::StrJoin(known, ", "), ")"));
  }
  if (params.empty() && !modules.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "BeforeBackwardFor: no parameter of ", key, " requires grad: nothing to reduce"));
  }
  if (GradientSync* shard = StandInShardSync(params); shard != nullptr) return shard;
  std::unique_ptr<GradientSync>& sync = syncs_[key];
  if (sync != nullptr && SameTensors(sync->params(), params)) return sync.get();
  if (sync != nullptr) {
    // Frozen or unfrozen since: the buckets are the trainable parameters'.
    const std::string change =
        absl::StrCat("the parameters that require grad changed (", sync->params().size(), " -> ",
                     params.size(), " tensors", key.empty() ? "" : " of ", key, ")");
    if (sharded_ != nullptr) {
      // The shards' layout holds the trained parameters of when it was
      // made (docs/sharding.md): a frozen one would step with zeros inside
      // its masters, an unfrozen one with a step count of its own.
      return absl::InvalidArgumentError(absl::StrCat(
          change, " while the optimizer state is sharded (Options::shard_optimizer_state): "
                  "freeze and unfreeze only without sharding"));
    }
    // Every rank runs the same program, so every rank makes the same sync
    // at the same step. Between passes, so nothing is in flight.
    MUSTER_LOG(INFO) << change << ": their gradient sync is made anew";
    if (current_ == sync.get()) current_ = nullptr;
    sync.reset();  // its hooks go with it
  }
  sync = std::make_unique<GradientSync>(std::move(params), comm_, SyncOptions());
  if (current_ == nullptr) current_ = sync.get();
  return sync.get();
}

GradientSyncOptions Replica::SyncOptions() const {
  GradientSyncOptions so;
  so.bucket_bytes = options_.bucket_bytes;
  so.overlap = options_.overlap;
  so.clock = options_.clock;
  return so;
}

GradientSync* Replica::StandInShardSync(const std::vector<torch::Tensor>& params) {
  GradientSync* shard = ShardSyncFor(params);
  if (shard != nullptr) {
    // The syncs it stands in for keep no buffers meanwhile.
    for (auto& [key, other] : syncs_) other->ReleaseBuffers();
  }
  return shard;
}

GradientSync* Replica::ShardSyncFor(const std::vector<torch::Tensor>& params) {
  if (!ShardedNow()) {
    // Whole again: the gradient vectors go with the sync (the .grad that
    // are views of them until the next boundary).
    if (current_ == shard_.sync.get()) current_ = nullptr;
    shard_ = ShardSync{};
    if (sharded_) sharded_->UseGradientVectors({});
    return nullptr;
  }
  const OptimizerShards& shards = *sharded_->shards();
  // With two copies a rank steps its buddy's shard too: the reduction gives
  // it both where they share its column (two nodes of equal size);
  // elsewhere the pass all-reduces.
  const bool columns = shards.layout().copies() > 1;
  const bool scatter =
      options_.reduce_scatter &&
      (!columns || KeptInColumns(shards.layout(), static_cast<int>(comm_->NodeRanks().size())));
  // An all-reducing plan does not depend on the layout (only on the
  // parameters' sizes), so its sync and gradient vectors outlive a reshard.
  if (shard_.sync != nullptr && shard_.sync->scatters() == scatter &&
      (!scatter || shard_.of == sharded_->times_sharded())) {
    return SameSet(shard_.sync->params(), params) ? shard_.sync.get() : nullptr;
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
  if (current_ == shard_.sync.get()) current_ = nullptr;
  shard_.sync.reset();  // its hooks go before the new sync's come
  constexpr int64_t kFloat = sizeof(float);
  shard_.plan = PlanBuckets(shards.layout(), elements,
                            static_cast<int64_t>(GradientSync::kFirstBucketBytes) / kFloat,
                            static_cast<int64_t>(options_.bucket_bytes) / kFloat);
  std::vector<GradientSync::BucketPlan> plan;
  for (const ShardedBucket& b : shard_.plan) {
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
  GradientSyncOptions options = SyncOptions();
  if (scatter) {
    // Each bucket's segments go to the masters as its reduce-scatter
    // completes, and its buffer to the next bucket.
    options.take = [this](size_t i, int64_t offset, const torch::Tensor& part) {
      sharded_->TakeScattered(shard_.plan[i], offset, part);
    };
  }
  shard_.sync = std::make_unique<GradientSync>(std::move(trained), std::move(plan), comm_,
                                               std::move(options));
  shard_.of = sharded_->times_sharded();
  return shard_.sync.get();
}

void Replica::GiveGradientVectors(const OptimizerShards& shards, size_t params,
                                  std::vector<GradientSync::BucketPlan>* plan) {
  // One vector per group, the group's gradients in its flat order; the last
  // bucket (the first group's first parameters: PlanBuckets goes from the
  // end) carries the words in front of them.
  const int64_t words = GradientSync::WordCount(plan->size(), params);
  const ShardedBucket& last = shard_.plan.back();
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
    const ShardedBucket& b = shard_.plan[i];
    const torch::Tensor& s = storage[static_cast<size_t>(b.group)];
    (*plan)[i].buffer = i + 1 == plan->size()
                            ? s.narrow(0, 0, words + b.range.end)  // begins at 0
                            : s.narrow(0, s.numel() - vectors[b.group].numel() + b.range.begin,
                                       b.range.size());
  }
  sharded_->UseGradientVectors(std::move(vectors));
  MUSTER_LOG(INFO) << "gradients all-reduced in " << plan->size()
                   << " buckets that are the sharded optimizers' gradient vectors";
}

static_assert(GradientSync::kControlWords == kControlWordCount,
              "the gradient sync carries the step policy's control words");

void Replica::BeginPass(GradientSync* sync, bool reduce, const ControlWords& control,
                        absl::Duration timeout) {
  sync->SetTimeout(timeout);
  current_ = sync;
  current_->Begin(reduce, control.ToArray());
  statistics_->SetPass(sync, timeout);
}

absl::Status Replica::FinishPass(absl::Time deadline, const std::function<void()>& turn) {
  const absl::Time backward_end = options_.clock->Now();
  absl::Status s = current_->Finish(deadline, turn);
  const WorldStatistics::PassAccount statistics = statistics_->EndPass();
  pass_summed_statistics_ = statistics.reduced;
  if (s.ok()) s = statistics.status;
  const absl::Status gathered = std::exchange(pass_failure_, absl::OkStatus());
  MUSTER_RETURN_IF_ERROR(s.ok() ? gathered : s);
  const double comm_s = current_->last_stats().comm_seconds;
  comm_total_ += comm_s;
  last_reduce_ = absl::Seconds(comm_s);
  const double since_backward = absl::ToDoubleSeconds(options_.clock->Now() - backward_end);
  hidden_total_ += std::max(0.0, comm_s - since_backward);
  const bool scattered = sharded_ && current_ == shard_.sync.get() && current_->scatters();
  if (scattered) {
    sharded_->ScatteredTaken();  // bucket by bucket, by the sync (ShardSyncFor)
  } else if (sharded_) {
    sharded_->TakeGradients();
  }
  // A failure here is the pass's, as its reduction's: the salvage reduces
  // the .grad again, unscales and clips them (ResyncGradients).
  return UnscaleAndClip(scattered, deadline);
}

absl::Status Replica::UnscaleAndClip(bool scattered, absl::Time deadline) {
  const bool unscale = static_cast<bool>(options_.inverse_loss_scale);
  if (!unscale && !(options_.clip_norm > 0)) return absl::OkStatus();
  if (scattered) return UnscaleAndClipScattered(deadline);
  // The .grad hold the averages, the same on every rank (where the state
  // is sharded the masters' .grad are views of them: ShareGradients), so
  // every rank finds the same inf or NaN.
  const bool found = unscale && UnscaleGradients(current_->params(), options_.inverse_loss_scale());
  if (options_.clip_norm > 0) {
    // A step with inf or NaN is skipped: nothing to clip.
    last_gradient_norm_ = found ? std::numeric_limits<double>::infinity()
                                : torch::nn::utils::clip_grad_norm_(current_->params(),
                                                                    options_.clip_norm);
  }
  if (unscale) options_.unscaled(found);
  return absl::OkStatus();
}

absl::Status Replica::UnscaleAndClipScattered(absl::Time deadline) {
  const bool unscale = static_cast<bool>(options_.inverse_loss_scale);
  if (unscale) sharded_->ScaleKeptGradients(options_.inverse_loss_scale());
  // Each part counted once, by its owner; every rank gets the same sum,
  // inf or NaN where any part holds one.
  double squares = sharded_->OwnGradientSquares();
  MUSTER_RETURN_IF_ERROR(
      AllReduceValues(comm_, &squares, 1, DataType::kFloat64, ReduceOp::kSum, deadline));
  const double norm = std::sqrt(squares);
  const bool found = !std::isfinite(norm);
  if (options_.clip_norm > 0) {
    // clip_grad_norm_'s coefficient, not above 1.
    const double coefficient = options_.clip_norm / (norm + 1e-6);
    if (!found && !(coefficient >= 1.0)) sharded_->ScaleKeptGradients(coefficient);
    last_gradient_norm_ = norm;
  }
  if (unscale) options_.unscaled(found);
  return absl::OkStatus();
}

double Replica::overlap_pct() const {
  return comm_total_ > 0 ? 100.0 * hidden_total_ / comm_total_ : 0;
}

void Replica::DropGradients() {
  for (const TrainingState::Optimizer& o : state_.optimizers) o.optimizer->zero_grad();
  for (const TrainingState::Module& m : state_.modules) m.module->zero_grad();
}

absl::Status Replica::SyncBuffers(Communicator* comm, absl::Time deadline) {
  if (!buffers_ || buffers_->empty()) return absl::OkStatus();
  return buffers_->Sync(comm, /*root=*/0, deadline);
}

void Replica::SettleBuffers() {
  if (buffers_) buffers_->Settle();
}

absl::Status Replica::CheckSharding() const {
  if (!sharded_) return absl::OkStatus();
  absl::Status s = ShardedOptimizers::Check(OptimizersOf(state_));
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat("Options::shard_optimizer_state: ", s.message()));
}

absl::Status Replica::GatherParameters(Communicator* comm, absl::Time deadline) {
  if (!sharded_) return absl::OkStatus();
  // -1 where the world keeps the state whole (ShardedOptimizers::KeepsWhole):
  // optimizer_state_elements() then counts the whole state when asked,
  // rather than every step here.
  held_elements_ = sharded_->sharded() ? sharded_->StateElements().value_or(-1) : -1;
  return sharded_->AtBoundary(comm, deadline);
}

void Replica::GatherBetweenPasses(Communicator* comm, absl::Time deadline) {
  if (sharded_) pass_failure_ = sharded_->BetweenPasses(comm, deadline);
}

int64_t Replica::optimizer_state_elements() const {
  if (sharded_ && held_elements_ >= 0) return held_elements_;
  return OptimizerShards::WholeStateElements(OptimizersOf(state_)).value_or(-1);
}

void Replica::CountMemory(StorageCounter* counter, MemoryAccount* account) const {
  for (const auto& [name, t] : state_.Model()) counter->Add(t, &account->parameters);
  for (const auto& [name, p] : state_.Parameters()) counter->Add(p.grad(), &account->gradients);
  // The optimizers' lists: the parameters, or the masters while sharded.
  for (const TrainingState::Optimizer& o : state_.optimizers) {
    for (const torch::optim::OptimizerParamGroup& group : o.optimizer->param_groups()) {
      for (const torch::Tensor& p : group.params()) counter->Add(p.grad(), &account->gradients);
    }
  }
  for (const TrainingState::Optimizer& o : state_.optimizers) {
    for (const torch::optim::OptimizerParamGroup& group : o.optimizer->param_groups()) {
      for (const torch::Tensor& p : group.params()) {
        counter->Add(p, &account->optimizer_state);  // a master that copies its range
        torch::optim::OptimizerParamState* held = FindOptimizerState(*o.optimizer, p);
        if (held == nullptr || o.codec == nullptr) continue;
        for (const auto& [field, t] : o.codec->Save(*held, group.options())) {
          counter->Add(t, &account->optimizer_state);
        }
      }
    }
  }
  for (const auto& [key, sync] : syncs_) {
    for (const torch::Tensor& b : sync->buffers()) counter->Add(b, &account->communication);
  }
  if (shard_.sync != nullptr) {
    for (const torch::Tensor& b : shard_.sync->buffers()) counter->Add(b, &account->communication);
  }
}

bool Replica::ShardedNow() const { return sharded_ && sharded_->sharded(); }

absl::StatusOr<OwnShardState> Replica::OwnShard() const {
  if (!ShardedNow()) return absl::FailedPreconditionError("the optimizer state is not sharded");
  return sharded_->shards()->OwnShard(state_.Parameters());
}

bool Replica::CanHandOverShards(int leaving) const {
  return ShardedNow() && sharded_->CanHandOver(comm_->size(), leaving);
}

absl::Status Replica::HandOverShards(Communicator* comm, bool leaves, absl::Time deadline) {
  return sharded_ ? sharded_->HandOver(comm, leaves, deadline) : absl::OkStatus();
}

absl::Status Replica::WholeState(Communicator* comm, absl::Time deadline) {
  return sharded_ ? sharded_->Whole(comm, deadline) : absl::OkStatus();
}

absl::Status Replica::CheckStateAgrees(const std::vector<int64_t>& counters,
                                       Communicator* comm, absl::Time deadline) const {
  if (!sharded_ || !sharded_->sharded()) return CheckRanksAgree(state_, counters, comm, deadline);
  // The model, extras and counters are the same on every rank; the
  // optimizers' state is compared shard by shard, where it is held.
  TrainingState rest = state_;
  rest.optimizers.clear();
  MUSTER_RETURN_IF_ERROR(CheckRanksAgree(rest, counters, comm, deadline));
  return sharded_->shards()->CheckCopiesAgree(comm, deadline);
}

void Replica::LoadShardsAtEntry(int64_t step, std::vector<ShardFileRef> files, FileSystem* fs) {
  if (!sharded_) return;
  ShardedOptimizers::PendingLoad load;
  load.step = step;
  load.fs = fs;
  load.names = state_.Parameters();
  load.whole = [this, files, fs] { return LoadOptimizerFromShards(files, state_, fs); };
  load.files = std::move(files);
  sharded_->LoadAtGather(std::move(load));
}

void Replica::ReleaseShards() {
  if (sharded_) sharded_->Release();
}

absl::Status Replica::Reshard(Communicator* comm) {
  return sharded_ ? sharded_->Reshard(comm) : absl::OkStatus();
}

absl::Status Replica::EnterWorld(Communicator* comm, const WorldInfo& world, int64_t step,
                                 const std::optional<FailedStepMark>& failed,
                                 absl::Time deadline) {
  if (!sharded_) return absl::OkStatus();
  return sharded_->Gather(comm, world.generation, world.node_rank(), deadline,
                          failed ? failed->step : -1, failed ? failed->generation : 0, step);
}

absl::Status Replica::TakeState(int source, Communicator* comm, bool in_step,
                                TrainingCounters* counters, absl::Time deadline) {
  bool held = false;
  // Sharded state came to its keepers as the world was entered; the
  // optimizers' lists hold each rank's own masters, so they stay out.
  TrainingState rest;
  if (ShardedNow()) {
    rest = state_;
    rest.optimizers.clear();
  }
  MUSTER_RETURN_IF_ERROR(SyncStateFrom(source, comm, ShardedNow() ? rest : state_, counters,
                                       deadline, in_step, &held));
  if (ShardedNow()) sharded_->ParametersTransferred();
  // The buffers the transfer left out come from the source at the boundary.
  if (buffers_) buffers_->Owe(held ? source : -1);
  return absl::OkStatus();
}

absl::Status Replica::CatchUpShards(Communicator* comm, bool stepped, absl::Time deadline) {
  if (!sharded_) return absl::OkStatus();
  return sharded_->CatchUp(comm, stepped, deadline);
}

void Replica::AccountMemory(int64_t staging, int64_t transfer) {
  StorageCounter counter;
  MemoryAccount account;
  CountMemory(&counter, &account);
  account.staging = staging;
  account.transfer = transfer;
  memory_ = account;
  if (++passes_in_world_ == 2) {
    MUSTER_LOG(INFO) << "memory held after a reduction: " << DescribeMemory(account)
                     << (ShardedNow() ? " (optimizer state sharded)" : "");
  }
}

void Replica::UseCommunicator(Communicator* comm) {
  comm_ = comm;
  statistics_->SetWorld(comm);
  passes_in_world_ = 0;
  for (auto& [key, sync] : syncs_) sync->SetCommunicator(comm);
  if (shard_.sync != nullptr) shard_.sync->SetCommunicator(comm);
}

absl::StatusOr<WorldChanges::ControlAverages> Replica::ResyncGradients(
    Communicator* comm, bool contribute, int contributors, const ControlWords& words,
    absl::Time deadline) {
  if (ShardedNow()) {
    // Every rank re-reduces through this world's sharded plan, the ranks
    // in the step as those outside it (a spare in a dead rank's place, a
    // survivor whose boundary broke), which add zeros: the sync a rank
    // last reduced with may be of the failed world's layout (its buckets
    // reduce-scattered by its shards) or the whole state's, and the
    // buckets of all ranks must be the same.
    const std::vector<torch::Tensor> params = current_->params();
    if (GradientSync* shard = StandInShardSync(params); shard != nullptr) current_ = shard;
  }
  MUSTER_RETURN_IF_ERROR(
      current_->Resync(comm, contribute, contributors, words.ToArray(), deadline));
  if (sharded_) sharded_->TakeGradients();
  MUSTER_RETURN_IF_ERROR(UnscaleAndClip(/*scattered=*/false, deadline));
  return current_->control();
}

}  // namespace muster
