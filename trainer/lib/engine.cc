// The elastic engine behind include/muster/muster.h: one Distributed per
// trainer, composed of an ElasticWorld (membership, communicator), a
// GradientSync (bucketed all-reduce carrying the control words), a
// StepPolicy decision per step, WorldChanges (regroups, state transfer,
// salvage, catch-up and the collective deadline), a CatalogCheckpointer and
// a ProgressReporter; a StepLifecycle says where the step stands.
// muster-train is a client of this file like any user.
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/clock.h"
#include "common/lines.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "muster/muster.h"
#include "trainer/checkpoint/training_state.h"
#include "trainer/data/sampler.h"
#include "trainer/comm/values.h"
#include "trainer/ddp/buffer_sync.h"
#include "trainer/ddp/device_comm.h"
#include "trainer/ddp/gradient_sync.h"
#include "trainer/elastic/catalog_checkpointer.h"
#include "trainer/elastic/collective_deadline.h"
#include "trainer/elastic/elastic_world.h"
#include "trainer/elastic/progress_reporter.h"
#include "trainer/elastic/state_server.h"
#include "trainer/elastic/state_sync.h"
#include "trainer/elastic/step_policy.h"
#include "trainer/elastic/training_counters.h"
#include "trainer/elastic/world_changes.h"
#include "trainer/lib/launch_options.h"
#include "trainer/lib/learning_rates.h"
#include "trainer/lib/signals.h"
#include "trainer/lib/state_from.h"
#include "trainer/lib/step_lifecycle.h"

namespace muster {
namespace {

// Named modules or several optimizers: a step may hold several passes.
bool HasSeveralPasses(const TrainingState& state) {
  return state.optimizers.size() > 1 ||
         std::any_of(state.modules.begin(), state.modules.end(),
                     [](const TrainingState::Module& m) { return !m.name.empty(); });
}

WorldChangesOptions WorldChangesOptionsFrom(const Options& o, bool several_passes,
                                            Clock* clock) {
  WorldChangesOptions wo;
  wo.salvage = o.salvage;
  wo.several_passes = several_passes;
  wo.scale_lr = o.elastic_lr == ElasticLr::kScale;
  wo.batch_per_rank = o.batch_per_rank;
  wo.deadline = CollectiveDeadlineOptions{absl::Seconds(o.collective_timeout_s)};
  wo.clock = clock;
  return wo;
}

class Engine : public Distributed, private WorldChanges::Trainer {
 public:
  Engine(const Options& o, TrainingState state)
      : options_(o),
        state_(std::move(state)),
        sampler_(o.dataset_size, o.seed),
        several_passes_(HasSeveralPasses(state_)),
        changes_(WorldChangesOptionsFrom(o, several_passes_, clock_), this, &counters_,
                 &sampler_) {}
  ~Engine() override;

  absl::Status Begin();

  bool ShouldStop() override;
  const std::vector<int64_t>& Batch() const override { return batch_.indices; }
  void BeforeBackward(bool sync) override;
  void BeforeBackwardFor(const std::vector<std::string>& modules, bool sync) override;
  absl::Status AfterBackward() override;
  absl::StatusOr<std::vector<double>> AllReduceSum(std::vector<double> values) override;
  std::vector<double> learning_rates() const override {
    return lr_ ? lr_->current() : std::vector<double>();
  }
  void RecordLoss(double loss) override { reporter_->RecordLoss(loss); }
  void LogScalars(const std::map<std::string, double>& values) override {
    reporter_->Scalars(counters_.step, values);
  }
  absl::StatusOr<Outcome> Finish() override;
  void RequestStop() override { stop_asked_ = true; }
  void RequestLeave() override { leave_asked_ = true; }
  absl::Status status() const override { return life_.status(); }

  Progress progress() const override;
  bool finished() const override {
    return life_.ended() && life_.outcome() == StepOutcome::kFinished;
  }
  int regroups() const override { return world_ ? world_->regroups() : 0; }
  int steps_salvaged() const override { return changes_.salvaged(); }
  int steps_dropped() const override { return changes_.dropped(); }
  int checkpoints_committed() const override {
    return checkpointer_ ? checkpointer_->committed() : 0;
  }
  int64_t resumed_from_step() const override { return resumed_from_; }
  bool resumed_from_live_state() const override { return resumed_live_; }
  uint64_t StateDigest() const override {
    return muster::StateDigest(state_, counters_.ToWords());
  }
  double comm_overlap_pct() const override {
    return comm_total_ > 0 ? 100.0 * hidden_total_ / comm_total_ : 0;
  }

 private:
  // The training thread's progress, which heartbeats report: entering and
  // leaving a call is progress; a call's blocking or long work is Busy
  // (training_progress.h).
  TrainingProgress* training_progress() const { return world_->training_progress(); }
  absl::Status StartServices(ClientOptions* client);
  // A world was entered: said by the reporter, and LibTorch's threads
  // shared out among the node's trainers of this world.
  void WorldEntered();
  absl::Status ResumeFromCheckpoint();
  // `broken`: the world broke under this rank (a collective failed), which
  // the rendezvous reports; false at an agreed step boundary.
  absl::Status Regroup(const std::string& why, bool broken);
  // The regroup found no world for this trainer: it left or stopped.
  absl::Status EndWithoutWorld();
  // This step's all-reduce (or broadcast) failed with `failure`: regroup,
  // then the step is salvaged (OK) or dropped (ABORTED).
  absl::Status RegroupAfterFailedStep(const absl::Status& failure);
  bool StopAsked() const {
    return stop_asked_.load() || (stop_flag_ != nullptr && stop_flag_->load());
  }
  bool LeaveAsked() const {
    return leave_asked_.load() || (leave_flag_ != nullptr && leave_flag_->load());
  }
  absl::Status AtBoundary();
  absl::Status Stop();
  absl::StatusOr<bool> CheckpointToStop();
  void SayStopped(const std::string& how) const;
  // A line for people, through Options::output, unless quiet.
  void Say(const std::string& line) const {
    if (!options_.quiet) options_.output(line);
  }
  int64_t NewestCommitted() const;
  void PublishState();
  void PrepareStep();
  // A synchronised pass (or a no-sync backward) reducing `sync`'s
  // parameters begins.
  void BeginPass(GradientSync* sync, bool reduce);
  // The gradient sync of the named modules' parameters that require grad
  // (all modules: none named), made on first use. INVALID_ARGUMENT for a
  // name that is no module, or modules with nothing to reduce.
  absl::StatusOr<GradientSync*> SyncFor(const std::vector<std::string>& modules);
  // The step ends: its counters advance over the world it began in,
  // returning the examples of the shares a salvaged pass lost. At once
  // after its one pass, or at its boundary after several.
  void EndStep();
  // The buffers a forward changed on some rank, from rank 0, at the step
  // boundary (buffer_sync.h); a peer that fails meanwhile regroups.
  absl::Status SyncBuffers();
  // Whether every rank holds the same state (`when`: for the message), at
  // most once per step; DATA_LOSS naming the ranks and the first tensor
  // that differ ends the run.
  absl::Status CheckStateAgrees(const std::string& when);
  bool Done() const;
  void DropGradients();
  CheckpointMeta CommittedStepMeta() const;
  absl::Time FromNow(absl::Duration d) const { return clock_->Now() + d; }

  // WorldChanges::Trainer: what a change of world asks of the engine.
  absl::Status EnterFirstWorld(int64_t step, const WorldChanges::EnterFn& enter) override {
    return world_->EnterFirst(step, enter);
  }
  absl::Status EnterNextWorld(const std::string& why, int64_t step,
                              const WorldChanges::EnterFn& enter,
                              const BrokenWorld* broken) override;
  bool told_to_leave() const override { return world_->told_to_leave(); }
  void ReportCounters(const TrainingCounters& c) override {
    world_->client()->SetStep(c.step, c.position.offset);
  }
  absl::Status TakeState(int source, Communicator* comm, TrainingCounters* counters,
                         absl::Time deadline) override {
    // A peer failed inside a step: its graphs may still hold the buffers,
    // which then come from the source at the boundary.
    bool held = false;
    MUSTER_RETURN_IF_ERROR(SyncStateFrom(source, comm, state_, counters, deadline,
                                         /*in_step=*/life_.state() == StepState::kFailed, &held));
    if (buffers_) buffers_->Owe(held ? source : -1);
    return absl::OkStatus();
  }
  void UseCommunicator(Communicator* comm) override {
    for (auto& [key, sync] : syncs_) sync->SetCommunicator(comm);
  }
  absl::StatusOr<WorldChanges::ControlAverages> ResyncGradients(Communicator* comm,
                                                                bool contribute,
                                                                int contributors,
                                                                const ControlWords& words,
                                                                absl::Time deadline) override;
  ControlWords CurrentControl() const override;
  absl::Status StepTakenByOthers(StepDecision next) override;
  void BeforeSalvagedStep() override { lr_->Apply(progress()); }
  absl::Status StepSalvaged(const SalvagedStep& step) override;

  // Constant after construction.
  const Options options_;
  const TrainingState state_;
  Clock* const clock_ = RealClock::Get();
  DistributedSampler sampler_;
  const bool several_passes_;  // HasSeveralPasses
  const std::atomic<bool>* stop_flag_ = nullptr;
  const std::atomic<bool>* leave_flag_ = nullptr;
  // RequestStop, RequestLeave: any thread, signal handlers too.
  std::atomic<bool> stop_asked_{false};
  std::atomic<bool> leave_asked_{false};
  // Training thread only.
  std::unique_ptr<StateServer> state_server_;
  std::unique_ptr<ElasticWorld> world_;
  // One gradient sync per set of modules a pass reduces (by their names,
  // joined; "" for all), and the one of the pass under way.
  std::map<std::string, std::unique_ptr<GradientSync>> syncs_;
  GradientSync* sync_ = nullptr;
  bool pass_reduces_ = true;  // the last BeforeBackward had sync = true
  std::unique_ptr<CatalogCheckpointer> checkpointer_;
  std::unique_ptr<BufferSync> buffers_;  // null without Options::broadcast_buffers
  int64_t state_checked_at_ = -1;        // the step of the last CheckStateAgrees
  std::unique_ptr<ProgressReporter> reporter_;
  // The counters every rank holds alike between steps.
  TrainingCounters counters_;
  // Regroups, the failed step, and how long collectives wait.
  WorldChanges changes_;
  int64_t resumed_from_ = -1;
  bool resumed_live_ = false;  // resumed_from_ is a live peer's step
  // The step in flight and the boundary after it.
  SampledBatch batch_;
  ControlWords sent_;
  // With several passes: the world the step began in, and the ranks of it
  // whose shares a salvaged pass lost.
  uint64_t step_generation_ = 0;
  int step_world_size_ = 0;
  std::vector<int> step_lost_;
  // Where the step stands (see step_lifecycle.h), its error and outcome.
  StepLifecycle life_;
  StepDecision decision_ = StepDecision::kContinue;
  std::optional<LearningRates> lr_;  // set by Begin
  double comm_total_ = 0, hidden_total_ = 0;
};

Engine::~Engine() {
  sync_ = nullptr;
  syncs_.clear();
  if (world_) world_->Detach();
}

absl::Status Engine::StartServices(ClientOptions* client) {
  if (options_.state_listen.empty()) return absl::OkStatus();
  const std::string listen = StateListenAddress(options_.state_listen, client->token);
  if (listen != options_.state_listen) {
    MUSTER_LOG(WARNING) << "no job token: the state service listens on " << listen
                        << " only (give a token to serve the weights to other hosts)";
  }
  MUSTER_ASSIGN_OR_RETURN(state_server_,
                          StateServer::Start({listen, client->token,
                                              {options_.state_tls_cert, options_.state_tls_key, ""},
                                              client->member_id}));
  // Without an address of its own, this member is reached where the
  // coordinator sees it (":port": the coordinator fills in the host).
  const std::string host = listen.rfind("127.0.0.1:", 0) == 0 ? "127.0.0.1" : options_.address;
  client->state_address = absl::StrCat(host, ":", state_server_->port());
  return absl::OkStatus();
}

absl::Status Engine::Begin() {
  if (options_.handle_signals) InstallSignalHandlers();
  stop_flag_ = options_.stop_requested != nullptr ? options_.stop_requested
               : options_.handle_signals          ? &StopSignalled()
                                                  : nullptr;
  leave_flag_ = options_.leave_requested != nullptr ? options_.leave_requested
                : options_.handle_signals           ? &LeaveSignalled()
                                                    : nullptr;
  std::vector<torch::optim::Optimizer*> optimizers;
  for (const TrainingState::Optimizer& o : state_.optimizers) optimizers.push_back(o.optimizer);
  MUSTER_ASSIGN_OR_RETURN(lr_, LearningRates::For(options_, std::move(optimizers)));
  MUSTER_ASSIGN_OR_RETURN(ClientOptions client, ClientOptionsFrom(options_));
  MUSTER_RETURN_IF_ERROR(StartServices(&client));
  ElasticWorldOptions wo;
  wo.comm = CommOptionsFrom(options_, static_cast<int>(client.local_rank));
  wo.client = std::move(client);
  wo.build_timeout = changes_.long_timeout();
  wo.join_timeout = absl::Seconds(options_.join_timeout_s);
  wo.rendezvous_timeout = absl::Seconds(options_.rendezvous_timeout_s);
  wo.interrupted = [this] { return StopAsked() || LeaveAsked(); };
  MUSTER_ASSIGN_OR_RETURN(world_, ElasticWorld::Connect(std::move(wo)));
  MUSTER_ASSIGN_OR_RETURN(sync_, SyncFor({}));
  if (options_.broadcast_buffers) {
    std::vector<torch::nn::Module*> modules;
    for (const TrainingState::Module& m : state_.modules) modules.push_back(m.module);
    buffers_ = std::make_unique<BufferSync>(BufferSync::HoldersOf(modules));
  }
  MUSTER_RETURN_IF_ERROR(ResumeFromCheckpoint());
  MUSTER_RETURN_IF_ERROR(changes_.EnterFirst());
  if (counters_.step != std::max<int64_t>(resumed_from_, 0)) {  // a live peer was further ahead
    MUSTER_LOG(INFO) << "took the live state of step " << counters_.step << " from rank "
                     << world_->world().state_source_rank
                     << (resumed_from_ >= 0 ? absl::StrCat(" (the checkpoint restored was of step ",
                                                           resumed_from_, ")")
                                            : std::string());
    resumed_from_ = counters_.step;
    resumed_live_ = true;
  }
  if (world_->left()) {  // drained before it began
    MUSTER_RETURN_IF_ERROR(life_.End(StepOutcome::kLeft));
  } else if (life_.state() == StepState::kStarting) {  // else a salvaged step's boundary is due
    MUSTER_RETURN_IF_ERROR(life_.Ready());
  }
  ProgressOptions po;
  if (!options_.quiet) po.output = options_.output;
  po.log_every = options_.log_every;
  po.log_dir = options_.log_dir;
  po.model_name = options_.model_name;
  po.batch_per_rank = options_.batch_per_rank;
  MUSTER_ASSIGN_OR_RETURN(reporter_, ProgressReporter::Create(po, world_->world().rank));
  if (life_.ended()) return absl::OkStatus();
  WorldEntered();
  if (resumed_from_ > 0 && !resumed_live_ && world_->world().rank == 0 && !options_.quiet) {
    Say(absl::StrCat("muster: resumed from the checkpoint of step ", resumed_from_));
  }
  training_progress()->Mark();
  return absl::OkStatus();
}

// A fresh start resumes from the newest committed checkpoint that verifies
// (locally: the state transfer on entering the world makes all ranks agree).
absl::Status Engine::ResumeFromCheckpoint() {
  if (options_.checkpoint_dir.empty()) return absl::OkStatus();
  CatalogCheckpointerOptions co;
  co.dir = options_.checkpoint_dir;
  co.every_steps = options_.checkpoint_every;
  co.interval_seconds = options_.checkpoint_interval_s;
  co.model_name = options_.model_name;
  co.optimizer_name = options_.optimizer_name;
  co.fs = options_.checkpoint_fs;
  checkpointer_ = std::make_unique<CatalogCheckpointer>(co, state_);
  if (!options_.resume) return absl::OkStatus();
  absl::StatusOr<CheckpointMeta> meta = checkpointer_->Resume(world_->client());
  if (absl::IsNotFound(meta.status())) return absl::OkStatus();
  MUSTER_RETURN_IF_ERROR(meta.status());
  for (int64_t i : meta->returned_examples) {
    if (i >= options_.dataset_size) {
      return absl::DataLossError(absl::StrCat("the checkpoint of step ", meta->step,
                                              " returns example ", i, " of a data set of ",
                                              options_.dataset_size));
    }
  }
  counters_.step = meta->step;
  counters_.position = {meta->sample_offset, meta->returned_epoch, meta->returned_examples};
  counters_.lr_world_size = meta->lr_world_size;
  resumed_from_ = meta->step;
  return absl::OkStatus();
}

absl::Status Engine::EnterNextWorld(const std::string& why, int64_t step,
                                    const WorldChanges::EnterFn& enter,
                                    const BrokenWorld* broken) {
  return world_->Regroup(
      why, step, enter,
      [this] {  // a scheduled checkpoint that failed was logged; training goes on
        if (checkpointer_) checkpointer_->Wait().IgnoreError();
      },
      broken);
}

absl::StatusOr<WorldChanges::ControlAverages> Engine::ResyncGradients(
    Communicator* comm, bool contribute, int contributors, const ControlWords& words,
    absl::Time deadline) {
  MUSTER_RETURN_IF_ERROR(sync_->Resync(comm, contribute, contributors, words.ToArray(), deadline));
  return sync_->control();
}

absl::Status Engine::StepTakenByOthers(StepDecision next) {
  decision_ = next;
  return life_.StepTaken();
}

absl::Status Engine::StepSalvaged(const SalvagedStep& step) {
  decision_ = step.next;
  if (!step.contributed) batch_.indices.clear();  // this rank's examples did not count
  step_lost_.insert(step_lost_.end(), step.lost.begin(), step.lost.end());
  MUSTER_RETURN_IF_ERROR(life_.Salvaged());
  if (step.catch_up_from >= 0) life_.CatchUpFrom(step.catch_up_from);
  return absl::OkStatus();
}

absl::Status Engine::Regroup(const std::string& why, bool broken) {
  MUSTER_RETURN_IF_ERROR(changes_.Regroup(why, broken));
  if (world_->left()) return EndWithoutWorld();
  WorldEntered();
  return absl::OkStatus();
}

void Engine::WorldEntered() {
  // The state transfer of entering a world made every rank's buffers equal.
  if (buffers_) buffers_->Settle();
  reporter_->WorldEntered(progress(), world_->comm()->name(), world_->world().node_count);
  const int trainers = world_->world().local_world_size(), cpus = UsableCpus();
  const int threads = IntraOpThreads(options_.intra_op_threads, cpus, trainers,
                                     std::getenv("OMP_NUM_THREADS") != nullptr);
  if (threads < 1 || threads == at::get_num_threads()) return;
  at::set_num_threads(threads);
  MUSTER_LOG(INFO) << "LibTorch intra-op threads: " << threads
                   << (options_.intra_op_threads > 0
                           ? std::string(" (Options::intra_op_threads)")
                           : absl::StrCat(" (", cpus, " CPUs shared by ", trainers,
                                          " trainers on this node)"));
}

absl::Status Engine::EndWithoutWorld() {
  // Told to stop (not to leave) while waiting for a world, as when the
  // time-limit warning comes in a paused job: there is no world to
  // checkpoint in, so this is a stop that resumes from the newest committed
  // checkpoint (exit 75, requeued), not a departure.
  const bool stopped = StopAsked() && !LeaveAsked();
  if (!stopped) {
    MUSTER_RETURN_IF_ERROR(life_.End(StepOutcome::kLeft));
    Say(absl::StrCat("muster: left the job after step ", counters_.step));
    return absl::OkStatus();
  }
  const bool saved = checkpointer_ && checkpointer_->newest_committed() == counters_.step;
  MUSTER_RETURN_IF_ERROR(
      life_.End(saved ? StepOutcome::kStopped : StepOutcome::kStoppedWithoutCheckpoint));
  SayStopped("stopped while waiting for a world after step ");
  return absl::OkStatus();
}

Progress Engine::progress() const {
  Progress p;
  p.step = counters_.step;
  p.sample_offset = counters_.position.offset;
  p.epoch = sampler_.Epoch(counters_.position);
  if (world_) {
    p.rank = world_->world().rank;
    p.world_size = world_->world().world_size;
    p.generation = world_->world().generation;
  }
  p.global_batch = int64_t{options_.batch_per_rank} * std::max(1, p.world_size);
  p.lr_world_size = counters_.lr_world_size;
  if (options_.steps > 0) {
    p.total_steps = options_.steps;
  } else {
    const int64_t left = sampler_.Remaining(counters_.position, options_.epochs);
    p.total_steps = counters_.step + (left + p.global_batch - 1) / p.global_batch;
  }
  return p;
}

// The schedule follows the global sample count (or the step count), which
// every rank holds alike: all ranks leave the loop after the same step,
// whatever world sizes they went through.
bool Engine::Done() const {
  if (options_.steps > 0) return counters_.step >= options_.steps;
  return sampler_.Done(counters_.position, options_.epochs);
}

void Engine::PrepareStep() {
  const Progress p = progress();
  batch_ = sampler_.Next(counters_.position, p.world_size, p.rank, options_.batch_per_rank);
  lr_->Apply(p);
  step_generation_ = world_->world().generation;
  step_world_size_ = p.world_size;
  step_lost_.clear();
}

absl::StatusOr<GradientSync*> Engine::SyncFor(const std::vector<std::string>& modules) {
  std::set<std::string> wanted(modules.begin(), modules.end());
  const std::string key = absl::StrJoin(wanted, ",");
  if (auto it = syncs_.find(key); it != syncs_.end()) return it->second.get();
  std::vector<torch::Tensor> params;
  std::vector<std::string> known;
  const bool all = wanted.empty();
  for (const TrainingState::Module& m : state_.modules) {
    if (!m.name.empty()) known.push_back(m.name);
    if (!all && wanted.erase(m.name) == 0) continue;
    for (const torch::Tensor& p : m.module->parameters()) {
      if (p.requires_grad()) params.push_back(p);
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
  GradientSyncOptions so;
  so.bucket_bytes = static_cast<size_t>(options_.bucket_mb * (1 << 20));
  so.overlap = options_.overlap;
  so.timeout = changes_.step_timeout();
  auto sync = std::make_unique<GradientSync>(std::move(params), world_->comm(), so);
  GradientSync* out = sync.get();
  syncs_[key] = std::move(sync);
  return out;
}

void Engine::EndStep() {
  counters_.position = sampler_.Advance(counters_.position, batch_, step_world_size_,
                                        options_.batch_per_rank, step_lost_);
  ++counters_.step;
  counters_.pass = 0;
  step_lost_.clear();
  ReportCounters(counters_);
  changes_.StepCommitted();
}

bool Engine::ShouldStop() {
  if (life_.over()) return true;
  // The boundary's work (a regroup, a checkpoint's copy, a catch-up).
  TrainingProgress::Busy busy(training_progress());
  // A regroup at the boundary may salvage a step: its boundary follows.
  while (life_.state() == StepState::kBoundaryDue) {
    if (counters_.pass > 0) EndStep();  // a step of several passes
    if (absl::Status s = life_.BeginBoundary(); !s.ok()) life_.Break(s);
    if (absl::Status s = AtBoundary(); !s.ok()) life_.Break(s);
    if (life_.over()) return true;
    if (life_.state() == StepState::kAtBoundary) life_.Break(life_.Settle());
  }
  if (Done()) {
    life_.Break(life_.End(StepOutcome::kFinished));
    return true;
  }
  if (absl::Status s = life_.Prepare(); !s.ok()) {
    life_.Break(absl::FailedPreconditionError(
        absl::StrCat("ShouldStop before AfterBackward ended the step (", s.message(), ")")));
    return true;
  }
  PrepareStep();
  return false;
}

void Engine::BeforeBackward(bool sync) { BeginPass(syncs_.at("").get(), sync); }

void Engine::BeforeBackwardFor(const std::vector<std::string>& modules, bool sync) {
  absl::StatusOr<GradientSync*> chosen = SyncFor(modules);
  if (!chosen.ok()) {
    life_.Break(chosen.status());
    return;
  }
  BeginPass(*chosen, sync);
}

void Engine::BeginPass(GradientSync* sync, bool reduce) {
  const bool next_pass = several_passes_ && life_.state() == StepState::kBoundaryDue;
  const bool first = next_pass || life_.state() == StepState::kPrepared;
  if (absl::Status s = next_pass ? life_.NextPass() : life_.Backward(); !s.ok()) {
    life_.Break(absl::FailedPreconditionError(
        absl::StrCat("BeforeBackward outside a step ShouldStop prepared (", s.message(), ")")));
    return;
  }
  pass_reduces_ = reduce;
  if (first || reduce) sent_ = CurrentControl();
  if (first || sync != sync_) sync->SetTimeout(changes_.step_timeout());
  sync_ = sync;
  sync_->Begin(reduce, sent_.ToArray());
}

ControlWords Engine::CurrentControl() const {
  ControlWords w;
  w.stop = StopAsked() ||
           (options_.stop_after_step > 0 && counters_.step + 1 >= options_.stop_after_step);
  w.leave = world_->told_to_leave() || LeaveAsked();
  w.newer_world = world_->newer_world_known();
  return w;
}

void Engine::DropGradients() {
  for (const TrainingState::Optimizer& o : state_.optimizers) o.optimizer->zero_grad();
  for (const TrainingState::Module& m : state_.modules) m.module->zero_grad();
}

absl::Status Engine::AfterBackward() {
  if (!life_.status().ok()) return life_.status();
  TrainingProgress* const progress = training_progress();
  progress->Mark();
  if (life_.state() != StepState::kInBackward) {
    return absl::FailedPreconditionError("AfterBackward without BeforeBackward in this step");
  }
  if (!pass_reduces_) {
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
  const absl::Time backward_end = clock_->Now();
  absl::Status s = sync_->Finish(changes_.StepDeadline(), [progress] { progress->Mark(); });
  TrainingProgress::Busy busy(progress);  // a regroup
  if (!s.ok()) return RegroupAfterFailedStep(s);
  const double comm_s = sync_->last_stats().comm_seconds;
  comm_total_ += comm_s;
  const double since_backward = absl::ToDoubleSeconds(clock_->Now() - backward_end);
  hidden_total_ += std::max(0.0, comm_s - since_backward);
  decision_ = DecideAfterStep(sync_->control(), world_->world().world_size, sent_,
                              world_->told_to_leave());
  if (several_passes_) {
    ++counters_.pass;  // the step ends at its boundary
  } else {
    EndStep();
  }
  return life_.Reduced();
}

// A peer failed or hung: regroup with the others, keeping this rank's
// gradients for the new world to salvage the step (WorldChanges).
absl::Status Engine::RegroupAfterFailedStep(const absl::Status& failure) {
  const int64_t failed = counters_.step + 1;
  const std::string what =
      several_passes_ ? absl::StrCat("pass ", counters_.pass + 1, " of step ", failed)
                      : absl::StrCat("step ", failed);
  MUSTER_LOG(WARNING) << what << " failed: " << failure;
  MUSTER_RETURN_IF_ERROR(life_.Fail());
  // A step of several passes is salvaged in the world it began in only.
  changes_.KeepFailedStep(world_->world(),
                          !several_passes_ || world_->world().generation == step_generation_);
  if (absl::Status r = Regroup(std::string(failure.message()), /*broken=*/true); !r.ok()) {
    life_.Break(r);
    return r;
  }
  if (life_.state() == StepState::kBoundaryDue) return absl::OkStatus();  // salvaged
  if (life_.state() == StepState::kFailed) MUSTER_RETURN_IF_ERROR(life_.Dropped());
  DropGradients();
  if (life_.ended()) {  // no world for this member: it left or stopped
    changes_.ForgetFailedStep();
    return absl::AbortedError(absl::StrCat(what, " not taken: this member left the job"));
  }
  if (!changes_.DropFailedStep()) {
    // The world took the step without this rank (a rank fenced while
    // stopped comes back after it): the state transfer brought its
    // result, nothing is lost or done again.
    MUSTER_LOG(INFO) << what << " was taken by the world without this rank (now at step "
                     << counters_.step << "); its gradients are discarded";
    return absl::AbortedError(absl::StrCat(what, " taken without this rank: ", failure.message()));
  }
  MUSTER_LOG(WARNING) << what << " dropped in generation " << world_->world().generation;
  return absl::AbortedError(absl::StrCat(what, " dropped: ", failure.message()));
}

absl::Status Engine::SyncBuffers() {
  if (!buffers_ || buffers_->empty()) return absl::OkStatus();
  absl::Status s = buffers_->Sync(world_->comm(), /*root=*/0, changes_.StepDeadline());
  if (s.ok()) return s;
  // The regroup's state transfer makes every rank's buffers the source's.
  return Regroup(std::string(s.message()), /*broken=*/true);
}

absl::Status Engine::CheckStateAgrees(const std::string& when) {
  if (state_checked_at_ == counters_.step || world_->comm()->size() == 1) return absl::OkStatus();
  absl::Status s = CheckRanksAgree(state_, counters_.ToWords(), world_->comm(),
                                   changes_.LongDeadline());
  if (s.ok()) {
    state_checked_at_ = counters_.step;
    return s;
  }
  if (absl::IsDataLoss(s)) {
    s = absl::DataLossError(absl::StrCat("state check at step ", counters_.step, " (", when,
                                         "): ", s.message()));
    MUSTER_LOG(ERROR) << s.message() << "; the run stops without checkpointing this step";
    return s;
  }
  // A peer failed during the check: the regroup's state transfer checks.
  return Regroup(std::string(s.message()), /*broken=*/true);
}

// What a checkpoint after the last committed step records.
CheckpointMeta Engine::CommittedStepMeta() const {
  CheckpointMeta meta;
  meta.generation = world_->world().generation;
  meta.world_size = world_->world().world_size;
  meta.lr_world_size = counters_.lr_world_size;
  meta.step = counters_.step;
  meta.epoch = batch_.epoch;
  meta.sample_offset = counters_.position.offset;
  meta.returned_epoch = counters_.position.returned_epoch;
  meta.returned_examples = counters_.position.returned;
  return meta;
}

// Some rank was told to stop, or every rank got SIGTERM (the whole job is
// preempted): every rank saw it in this step's all-reduce. Checkpoint and
// stop: kStopped once the checkpoint of this step is committed (a restart
// resumes from it), else kStoppedWithoutCheckpoint.
absl::Status Engine::Stop() {
  const int rank = world_->world().rank;
  MUSTER_ASSIGN_OR_RETURN(const bool committed, CheckpointToStop());
  world_->Detach();
  MUSTER_RETURN_IF_ERROR(
      life_.End(committed ? StepOutcome::kStopped : StepOutcome::kStoppedWithoutCheckpoint));
  if (rank == 0) SayStopped("stopping at step ");
  return absl::OkStatus();
}

// Whether the checkpoint of this step committed, as every rank agrees. A
// failed attempt (the catalog unreachable, a full or read-only file system)
// is tried once more.
absl::StatusOr<bool> Engine::CheckpointToStop() {
  if (!checkpointer_) return false;
  MUSTER_RETURN_IF_ERROR(CheckStateAgrees("before the checkpoint to stop"));
  if (life_.ended()) return false;  // the check's regroup found no world for this member
  constexpr int kAttempts = 2;
  for (int attempt = 1; attempt <= kAttempts; ++attempt) {
    absl::Status s = checkpointer_->Take(world_->client(), world_->world().rank,
                                         CommittedStepMeta(), absl::Seconds(20));
    if (absl::Status written = checkpointer_->Wait(); s.ok()) s = written;
    // Each rank's report counts, and nobody leaves before every rank
    // reported (a departure would abort the checkpoint before it commits):
    // the ranks sum their failures, which is also a barrier.
    int64_t failed = s.ok() ? 0 : 1;
    MUSTER_RETURN_IF_ERROR(AllReduceValues(world_->comm(), &failed, 1, DataType::kInt64,
                                           ReduceOp::kSum, changes_.LongDeadline()));
    if (failed == 0) return true;
    MUSTER_LOG(WARNING) << "the checkpoint to stop at step " << counters_.step
                        << " did not commit (try " << attempt << " of " << kAttempts << "): "
                        << (s.ok() ? absl::StrCat(failed, " rank(s) failed") : s.ToString());
  }
  return false;
}

// The step of the newest committed checkpoint, as the catalog says (this
// rank's own reports need not have seen the last commit), else as this rank
// knows; 0 when none.
int64_t Engine::NewestCommitted() const {
  if (!checkpointer_) return 0;
  absl::StatusOr<std::vector<CatalogEntry>> committed =
      world_->client()->ListCommitted(FromNow(absl::Seconds(5)));
  if (committed.ok()) return committed->empty() ? 0 : committed->front().step;
  return std::max<int64_t>(0, checkpointer_->newest_committed());
}

// The stop's last word, from one rank: what a restart resumes from.
void Engine::SayStopped(const std::string& how) const {
  if (life_.outcome() == StepOutcome::kStopped) {
    Say(absl::StrCat("muster: ", how, counters_.step, " after checkpointing"));
    return;
  }
  const int64_t from = NewestCommitted();
  const std::string why = checkpointer_ ? "its checkpoint did not commit"
                                        : "no checkpoint dir is set, nothing was saved";
  MUSTER_LOG(ERROR) << how << counters_.step << " without a checkpoint of it (" << why
                    << "): a restart resumes from "
                    << (from > 0 ? absl::StrCat("the checkpoint of step ", from)
                                 : std::string("the start"))
                    << " and repeats " << counters_.step - from << " steps";
  Say(absl::StrCat("muster: ", how, counters_.step, " without a checkpoint (", why,
                   "); a restart resumes from step ", from));
}

absl::Status Engine::AtBoundary() {
  if (const int source = life_.TakeCatchUp(); source >= 0) {
    if (absl::Status s = changes_.CatchUp(world_->comm(), source); !s.ok()) {
      MUSTER_RETURN_IF_ERROR(Regroup(std::string(s.message()), /*broken=*/true));
      if (life_.ended()) return absl::OkStatus();
    }
  }
  // After every pass of the step, before anything reads the state.
  MUSTER_RETURN_IF_ERROR(SyncBuffers());
  if (life_.ended()) return absl::OkStatus();
  if (options_.check_state_every > 0 && counters_.step % options_.check_state_every == 0) {
    MUSTER_RETURN_IF_ERROR(
        CheckStateAgrees(absl::StrCat("every ", options_.check_state_every, " steps")));
    if (life_.ended()) return absl::OkStatus();
  }
  reporter_->StepDone(progress(), lr_->current());
  switch (decision_) {
    case StepDecision::kStop:
      return Stop();
    case StepDecision::kLeave:
      // This trainer leaves after this step; the others regroup without it.
      world_->Leave(/*finished=*/false, counters_.step).IgnoreError();
      if (checkpointer_) checkpointer_->Wait().IgnoreError();  // logged when it failed
      Say(absl::StrCat("muster: left the job after step ", counters_.step));
      return life_.End(StepOutcome::kLeft);
    case StepDecision::kRegroup:
      // Every rank stops after this same step and enters the new generation.
      MUSTER_RETURN_IF_ERROR(Regroup("a membership change at a step boundary", /*broken=*/false));
      if (life_.ended()) return absl::OkStatus();
      break;
    case StepDecision::kContinue:
      break;
  }
  if (checkpointer_ && checkpointer_->Due(counters_.step)) {
    MUSTER_RETURN_IF_ERROR(CheckStateAgrees("before a checkpoint"));
    if (life_.ended()) return absl::OkStatus();
    // A scheduled checkpoint that fails is skipped: training goes on.
    if (absl::Status s =
            checkpointer_->Take(world_->client(), world_->world().rank, CommittedStepMeta());
        !s.ok()) {
      MUSTER_LOG(WARNING) << s << "; skipped";
    }
  }
  PublishState();
  return absl::OkStatus();
}

// Someone pulls the state after this step (muster pull-weights).
void Engine::PublishState() {
  if (!state_server_ || !state_server_->Wanted(counters_.step)) return;
  absl::StatusOr<std::string> image =
      EncodeSafetensors(state_.Model(), {{"format", "muster"},
                                         {"step", std::to_string(counters_.step)},
                                         {"member", world_->client()->member_id()}});
  if (!image.ok()) {
    MUSTER_LOG(WARNING) << "state of step " << counters_.step
                        << " not published: " << image.status();
    return;
  }
  state_server_->Publish(counters_.step, world_->world().generation, std::move(*image));
}

absl::StatusOr<std::vector<double>> Engine::AllReduceSum(std::vector<double> values) {
  if (!life_.status().ok()) return life_.status();
  if (life_.ended() && life_.outcome() != StepOutcome::kFinished) {
    return absl::FailedPreconditionError("this member is no longer in a world");
  }
  TrainingProgress::Busy busy(training_progress());
  // Between steps (an evaluation): ranks may arrive far apart after work
  // of their own, so the long deadline, not the step's.
  absl::Status s = AllReduceValues(world_->comm(), values.data(), values.size(),
                                   DataType::kFloat64, ReduceOp::kSum,
                                   changes_.LongDeadline());
  if (s.ok()) return values;
  if (absl::Status r = Regroup(std::string(s.message()), /*broken=*/true); !r.ok()) {
    life_.Break(r);
    return r;
  }
  return absl::AbortedError(absl::StrCat("all-reduce failed, regrouped: ", s.message()));
}

static_assert(static_cast<int>(StepOutcome::kStopped) ==
                  static_cast<int>(Distributed::Outcome::kStopped) &&
              static_cast<int>(StepOutcome::kLeft) == static_cast<int>(Distributed::Outcome::kLeft) &&
              static_cast<int>(StepOutcome::kStoppedWithoutCheckpoint) ==
                  static_cast<int>(Distributed::Outcome::kStoppedWithoutCheckpoint),
              "StepOutcome follows Distributed::Outcome");

absl::StatusOr<Distributed::Outcome> Engine::Finish() {
  std::optional<TrainingProgress::Busy> busy;
  if (world_) busy.emplace(training_progress());
  if (checkpointer_) checkpointer_->Wait().IgnoreError();  // logged when it failed
  if (!life_.status().ok()) return life_.status();
  if (!life_.ended()) {  // the loop ended before ShouldStop said so: leave
    world_->Leave(/*finished=*/false, counters_.step).IgnoreError();
    MUSTER_RETURN_IF_ERROR(life_.End(StepOutcome::kLeft));
  } else if (life_.outcome() == StepOutcome::kFinished) {
    world_->Leave(/*finished=*/true, counters_.step).IgnoreError();
  }
  world_->Detach();
  return static_cast<Outcome>(life_.outcome());
}

}  // namespace

absl::StatusOr<std::unique_ptr<Distributed>> Distributed::Start(const Options& options,
                                                                State state) {
  MUSTER_RETURN_IF_ERROR(options.Validate());
  MUSTER_ASSIGN_OR_RETURN(TrainingState ts, TrainingStateFrom(state));
  Options composed = options;
  if (!composed.output) composed.output = StandardOutput();
  auto engine = std::make_unique<Engine>(std::move(composed), std::move(ts));
  MUSTER_RETURN_IF_ERROR(engine->Begin());
  return std::unique_ptr<Distributed>(std::move(engine));
}

int Distributed::ExitCode(const absl::StatusOr<Outcome>& outcome) {
  if (!outcome.ok()) {
    if (absl::IsInvalidArgument(outcome.status())) return kExitConfig;
    if (absl::IsDataLoss(outcome.status())) return kExitDataLoss;
    return kExitError;
  }
  switch (*outcome) {
    case Outcome::kStopped: return kExitStopped;
    case Outcome::kStoppedWithoutCheckpoint: return kExitStoppedWithoutCheckpoint;
    case Outcome::kFinished:
    case Outcome::kLeft: return 0;
  }
  return kExitError;
}


}  // namespace muster
