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
#include "trainer/elastic/state_sync.h"

namespace muster {

namespace {

// Named modules or several optimizers: a step may hold several passes.
bool HasSeveralPasses(const TrainingState& state) {
  return state.optimizers.size() > 1 ||
         std::any_of(state.modules.begin(), state.modules.end(),
                     [](const TrainingState::Module& m) { return !m.name.empty(); });
}

// Whether `a` and `b` are the same tensors (not equal values), in order.
bool SameTensors(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(),
                    [](const torch::Tensor& x, const torch::Tensor& y) { return x.is_same(y); });
}

}  // namespace

Replica::Replica(TrainingState state, ReplicaOptions options)
    : state_(std::move(state)), options_(options), several_passes_(HasSeveralPasses(state_)) {
  optimizer_state_ =
      OptimizerState::Make(state_, {options_.shard_copies, options_.reduce_scatter, SyncOptions()});
  statistics_ = std::make_shared<WorldStatistics>(options_.clock);
  // Not modules() with the module itself: that needs it held by a
  // shared_ptr, and a program may declare its model as a plain object
  // (`Net model;`, as pytorch/examples' mnist.cpp does).
  for (const TrainingState::Module& m : state_.modules) {
    if (auto* bn = dynamic_cast<SyncBatchNormImpl*>(m.module)) bn->set_reducer(statistics_);
    for (const std::shared_ptr<torch::nn::Module>& sub :
         m.module->modules(/*include_self=*/false)) {
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
  optimizer_state_->Close();
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
  if (GradientSync* own = StandIn(&OptimizerState::PassSync, params)) return own;
  std::unique_ptr<GradientSync>& sync = syncs_[key];
  if (sync != nullptr && SameTensors(sync->params(), params)) return sync.get();
  if (sync != nullptr) {
    // Frozen or unfrozen since: the buckets are the trainable parameters'.
    const std::string change =
        absl::StrCat("the parameters that require grad changed (", sync->params().size(), " -> ",
                     params.size(), " tensors", key.empty() ? "" : " of ", key, ")");
    MUSTER_RETURN_IF_ERROR(optimizer_state_->AllowsTrainedChange(change));
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

GradientSync* Replica::StandIn(
    GradientSync* (OptimizerState::*which)(const std::vector<torch::Tensor>&),
    const std::vector<torch::Tensor>& params) {
  GradientSync* const before = optimizer_state_->sync();
  GradientSync* const own = (optimizer_state_.get()->*which)(params);
  if (current_ == before && optimizer_state_->sync() != before) current_ = nullptr;  // it went
  if (own != nullptr) {
    // The syncs it stands in for keep no buffers meanwhile.
    for (auto& [key, other] : syncs_) other->ReleaseBuffers();
  }
  return own;
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
  const bool scattered = optimizer_state_->Reduced(current_);
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
  if (unscale) optimizer_state_->ScaleKeptGradients(options_.inverse_loss_scale());
  // Each part counted once, by its owner; every rank gets the same sum,
  // inf or NaN where any part holds one.
  double squares = optimizer_state_->KeptGradientSquares();
  MUSTER_RETURN_IF_ERROR(
      AllReduceValues(comm_, &squares, 1, DataType::kFloat64, ReduceOp::kSum, deadline));
  const double norm = std::sqrt(squares);
  const bool found = !std::isfinite(norm);
  if (options_.clip_norm > 0) {
    // clip_grad_norm_'s coefficient, not above 1.
    const double coefficient = options_.clip_norm / (norm + 1e-6);
    if (!found && !(coefficient >= 1.0)) optimizer_state_->ScaleKeptGradients(coefficient);
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

void Replica::GatherBetweenPasses(Communicator* comm, absl::Time deadline) {
  pass_failure_ = optimizer_state_->BetweenPasses(comm, deadline);
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
  if (const GradientSync* own = optimizer_state_->sync()) {
    for (const torch::Tensor& b : own->buffers()) counter->Add(b, &account->communication);
  }
}

absl::Status Replica::EnterWorld(Communicator* comm, const WorldInfo& world, int64_t step,
                                 const std::optional<FailedStepMark>& failed,
                                 absl::Time deadline) {
  return optimizer_state_->Enter(comm, world, step, failed, deadline);
}

absl::Status Replica::TakeState(int source, Communicator* comm, bool in_step,
                                TrainingCounters* counters, absl::Time deadline) {
  bool held = false;
  MUSTER_RETURN_IF_ERROR(SyncStateFrom(source, comm, optimizer_state_->Transferred(), counters,
                                       deadline, in_step, &held));
  optimizer_state_->StateTransferred();
  // The buffers the transfer left out come from the source at the boundary.
  if (buffers_) buffers_->Owe(held ? source : -1);
  return absl::OkStatus();
}

absl::Status Replica::CatchUpShards(Communicator* comm, bool stepped, absl::Time deadline) {
  return optimizer_state_->CatchUp(comm, stepped, deadline);
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
                     << (optimizer_state_->sharded() ? " (optimizer state sharded)" : "");
  }
}

void Replica::UseCommunicator(Communicator* comm) {
  comm_ = comm;
  statistics_->SetWorld(comm);
  passes_in_world_ = 0;
  for (auto& [key, sync] : syncs_) sync->SetCommunicator(comm);
  optimizer_state_->UseCommunicator(comm);
}

absl::StatusOr<WorldChanges::ControlAverages> Replica::ResyncGradients(
    Communicator* comm, bool contribute, int contributors, const ControlWords& words,
    absl::Time deadline) {
  // The optimizer state may re-reduce through a sync of its own, every
  // rank alike (OptimizerState::ResyncSync).
  const std::vector<torch::Tensor> params = current_->params();
  if (GradientSync* own = StandIn(&OptimizerState::ResyncSync, params)) current_ = own;
  MUSTER_RETURN_IF_ERROR(
      current_->Resync(comm, contribute, contributors, words.ToArray(), deadline));
  optimizer_state_->Reduced(nullptr);
  MUSTER_RETURN_IF_ERROR(UnscaleAndClip(/*scattered=*/false, deadline));
  return current_->control();
}

}  // namespace muster
