#include "trainer/train/trainer.h"

#include <sys/stat.h>
#include <unistd.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "trainer/checkpoint/checkpointer.h"
#include "trainer/data/dataset.h"
#include "trainer/data/sampler.h"
#include "trainer/ddp/gradient_sync.h"
#include "trainer/checkpoint/state_tensors.h"
#include "trainer/elastic/state_server.h"
#include "trainer/elastic/state_sync.h"
#include "trainer/models/models.h"
#include "trainer/train/build_watchdog.h"
#include "trainer/train/event_writer.h"

namespace muster {
namespace {

constexpr absl::Duration kCollectiveTimeout = absl::Seconds(120);

absl::StatusOr<std::unique_ptr<Dataset>> LoadData(const TrainOptions& o, bool train) {
  if (o.dataset == "fashion-mnist") {
    return LoadFashionMnist(o.data_dir.empty() ? kDefaultFashionMnistDir : o.data_dir, train);
  }
  if (o.dataset == "synthetic") {
    return NewSyntheticDataset(train ? o.synthetic_examples : o.synthetic_examples / 6,
                               o.synthetic_channels, o.synthetic_size, o.synthetic_size, 10);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dataset '", o.dataset, "' (fashion-mnist, synthetic)"));
}

// Images and labels of `indices` as tensors.
std::pair<torch::Tensor, torch::Tensor> Batch(const Dataset& data,
                                              const std::vector<int64_t>& indices,
                                              const torch::Device& device) {
  const int64_t n = static_cast<int64_t>(indices.size());
  torch::Tensor x = torch::empty({n, data.channels(), data.height(), data.width()});
  torch::Tensor y = torch::empty({n}, torch::kInt64);
  data.Fill(indices.data(), n, x.data_ptr<float>(), y.data_ptr<int64_t>());
  return {x.to(device), y.to(device)};
}

std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(const TrainOptions& o,
                                                       std::vector<torch::Tensor> params,
                                                       double lr) {
  if (o.optimizer == "adamw") {
    return std::make_unique<torch::optim::AdamW>(
        params, torch::optim::AdamWOptions(lr).weight_decay(o.weight_decay));
  }
  return std::make_unique<torch::optim::SGD>(
      params, torch::optim::SGDOptions(lr).momentum(o.momentum).weight_decay(o.weight_decay));
}

void SetLearningRate(torch::optim::Optimizer& opt, double lr) {
  for (auto& group : opt.param_groups()) group.options().set_lr(lr);
}

// Linear warm-up, then cosine decay to 10% at `total` steps.
double ScheduledLr(double peak, int64_t step, int64_t warmup, int64_t total) {
  if (warmup > 0 && step < warmup) return peak * static_cast<double>(step + 1) / warmup;
  if (total <= warmup) return peak;
  const double t = std::min(1.0, static_cast<double>(step - warmup) / (total - warmup));
  return peak * (0.1 + 0.9 * 0.5 * (1.0 + std::cos(M_PI * t)));
}

struct Evaluation {
  double loss = 0;
  double accuracy = 0;
};

// Loss and accuracy over the whole test set: each rank takes a contiguous
// shard; sums are all-reduced.
absl::StatusOr<Evaluation> Evaluate(Net& model, const Dataset& test, Communicator& comm,
                                    int rank, int world, const torch::Device& device) {
  torch::NoGradGuard no_grad;
  model.eval();
  const int64_t n = test.size();
  const int64_t lo = n * rank / world, hi = n * (rank + 1) / world;
  double sums[3] = {0, 0, 0};  // loss sum, correct, count
  std::vector<int64_t> idx;
  for (int64_t start = lo; start < hi; start += 1000) {
    idx.clear();
    for (int64_t i = start; i < std::min(hi, start + 1000); ++i) idx.push_back(i);
    auto [x, y] = Batch(test, idx, device);
    torch::Tensor logits = model.forward(x);
    sums[0] += torch::cross_entropy_loss(logits, y, {}, at::Reduction::Sum).item<double>();
    sums[1] += logits.argmax(1).eq(y).sum().item<double>();
    sums[2] += static_cast<double>(idx.size());
  }
  model.train();
  MUSTER_RETURN_IF_ERROR(comm.AllReduce(sums, 3, DataType::kFloat64, ReduceOp::kSum,
                                        absl::Now() + kCollectiveTimeout));
  return Evaluation{sums[0] / std::max(1.0, sums[2]), sums[1] / std::max(1.0, sums[2])};
}

std::string FormatEta(double seconds) {
  const int64_t s = static_cast<int64_t>(std::max(0.0, seconds));
  return absl::StrFormat("%d:%02d", s / 60, s % 60);
}

}  // namespace


TrainResult::TrainResult() = default;
TrainResult::~TrainResult() = default;
TrainResult::TrainResult(TrainResult&&) = default;
TrainResult& TrainResult::operator=(TrainResult&&) = default;
TrainResult::TrainResult(const TrainResult&) = default;
TrainResult& TrainResult::operator=(const TrainResult&) = default;

absl::StatusOr<TrainResult> RunTraining(const TrainOptions& o) {
  const torch::Device device = o.comm.cuda ? torch::Device(torch::kCUDA, o.comm.cuda_device)
                                           : torch::Device(torch::kCPU);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  torch::set_num_threads(o.threads > 0 ? o.threads : std::max(1, cores / o.local_world_size));
  MUSTER_ASSIGN_OR_RETURN(std::unique_ptr<Dataset> train, LoadData(o, /*train=*/true));
  MUSTER_ASSIGN_OR_RETURN(std::unique_ptr<Dataset> test, LoadData(o, /*train=*/false));

  std::shared_ptr<Net> model;
  {
    // The global generator is shared by threads (trainers as threads in
    // tests): seed and initialise in one piece.
    static std::mutex init_mu;
    std::lock_guard<std::mutex> lock(init_mu);
    torch::manual_seed(o.seed);
    MUSTER_ASSIGN_OR_RETURN(
        model, MakeModel(o.model, {train->channels(), train->height(), train->width(), 10}));
  }
  model->to(device);
  std::vector<torch::Tensor> params = model->parameters();

  // Join the job and form the world.
  std::mutex comm_mu;
  std::atomic<bool> told_to_leave{false};  // drained by the coordinator
  Communicator* live_comm = nullptr;  // guarded by comm_mu
  uint64_t live_generation = 0;       // guarded by comm_mu
  auto on_notice = [&](const SessionNotice& n) {
    if (n.kind == SessionNotice::Kind::kRegroup && n.leave) told_to_leave = true;
    if (n.kind == SessionNotice::Kind::kRegroup && !n.abort) return;
    std::lock_guard<std::mutex> lock(comm_mu);
    // Abort only the world the notice is about: a failure forms a newer
    // generation; a pause names the current one. A late notice about a
    // world this trainer already left behind changes nothing.
    const bool about_us = n.kind != SessionNotice::Kind::kRegroup ||
                          n.generation > live_generation ||
                          (n.paused && n.generation == live_generation);
    if (!about_us) return;
    MUSTER_LOG(WARNING) << "coordinator: " << n.reason;
    if (live_comm != nullptr) live_comm->Abort(absl::AbortedError(n.reason));
  };
  // The state service, advertised at join.
  std::unique_ptr<StateServer> state_server;
  ClientOptions client_options = o.client;
  if (!o.state_listen.empty()) {
    MUSTER_ASSIGN_OR_RETURN(state_server, StateServer::Start({o.state_listen, o.client.token,
                                                              o.state_tls, o.client.member_id}));
    std::string host = o.comm.gloo.hostname;
    if (host.empty()) {
      char name[256] = "localhost";
      ::gethostname(name, sizeof(name) - 1);
      host = name;
    }
    client_options.state_address = absl::StrCat(host, ":", state_server->port());
  }
  // Joins with `incarnation` (0: a new one, for a fresh process or one that
  // was fenced).
  std::unique_ptr<CoordinatorClient> client;
  auto connect = [&](uint64_t incarnation) -> absl::Status {
    ClientOptions co = client_options;
    co.incarnation = incarnation;
    MUSTER_ASSIGN_OR_RETURN(client, CoordinatorClient::Create(co));
    MUSTER_RETURN_IF_ERROR(client->Join(0, absl::Now() + absl::Seconds(120)));
    return client->StartSession(on_notice);
  };
  MUSTER_RETURN_IF_ERROR(connect(o.client.incarnation));
  // The optimizer exists before the world: a joining member receives the
  // optimizer state of a live peer.
  auto optimizer = MakeOptimizer(o, params, o.lr);
  // A fresh start resumes from the newest committed checkpoint that
  // verifies (locally: the state transfer below makes all ranks agree).
  int64_t resume_step = 0, resume_offset = 0;
  if (!o.checkpoint_dir.empty() && o.resume) {
    MUSTER_ASSIGN_OR_RETURN(std::vector<CatalogEntry> committed,
                            client->ListCommitted(absl::Now() + absl::Seconds(60)));
    for (const CatalogEntry& entry : committed) {
      std::vector<FileReport> files;
      for (const CatalogFile& f : entry.files) files.push_back({f.path, f.bytes, f.xxh3});
      absl::StatusOr<CheckpointMeta> meta = LoadCheckpoint(
          files, *model, *optimizer,
          o.checkpoint_fs != nullptr ? o.checkpoint_fs : DefaultFileSystem());
      if (meta.ok()) {
        resume_step = meta->step;
        resume_offset = meta->sample_offset;
        break;
      }
      MUSTER_LOG(WARNING) << "checkpoint of step " << entry.step << " is unusable ("
                          << meta.status() << "); trying the previous one";
    }
  }
  int64_t offset = resume_offset, step = resume_step;

  MUSTER_ASSIGN_OR_RETURN(WorldInfo world,
                          client->Rendezvous(0, step, absl::Now() + absl::Seconds(600)));
  int rank = world.rank, w = world.world_size;
  std::unique_ptr<Store> store;
  std::unique_ptr<Communicator> comm;
  GradientSyncOptions sync_options;
  sync_options.bucket_bytes = o.bucket_bytes;
  sync_options.overlap = o.overlap;
  GradientSync sync(params, nullptr, sync_options);
  double peak_lr = o.lr;
  int64_t lr_world = 0;
  int64_t global_batch = 0;
  // Connects the world's communicator and takes the state of the member
  // holding the newest step (every rank, newcomers included).
  auto enter = [&]() -> absl::Status {
    rank = world.rank;
    w = world.world_size;
    store = NewCoordinatorStore(client.get(), world.generation);
    {
      // Gloo's connect can block past its timeout when a peer vanished in
      // the middle of it, and nothing can wake it. Rather than hang, this
      // trainer gives up as a process: its agent restarts it and it takes a
      // live peer's state (crash-only). Bound: the build's deadline, or 10 s
      // after a newer world is known.
      const absl::Time deadline = absl::Now() + absl::Seconds(120);
      BuildWatchdog watchdog(deadline + absl::Seconds(5), [&, generation = world.generation] {
        return client->latest_generation() > generation;
      });
      MUSTER_ASSIGN_OR_RETURN(comm, BuildCommunicator(world, store.get(), o.comm, deadline));
    }
    {
      std::lock_guard<std::mutex> lock(comm_mu);
      live_comm = comm.get();
      live_generation = world.generation;
    }
    // lr_world: the world size the learning rate is scaled for. "scale"
    // follows the world; "keep" keeps the source's (the first world's).
    if (lr_world == 0 || o.elastic_lr == "scale") lr_world = w;
    std::vector<int64_t> counters = {step, offset, lr_world};
    MUSTER_RETURN_IF_ERROR(SyncStateFrom(world.state_source_rank, comm.get(), *model, *optimizer,
                                         &counters, absl::Now() + kCollectiveTimeout));
    step = counters[0];
    offset = counters[1];
    lr_world = o.elastic_lr == "scale" ? w : counters[2];
    sync.SetCommunicator(comm.get());
    peak_lr = o.lr * (o.lr_scaling == "linear" ? lr_world : 1);
    global_batch = int64_t{o.batch_size} * w;
    if (rank == 0 && !o.quiet) {
      std::cout << absl::StrFormat(
                       "muster: generation %d, world %d on %d nodes, backend %s, model %s, "
                       "batch %d per rank (%d global), step %d",
                       world.generation, w, world.node_count, comm->name(), o.model,
                       o.batch_size, global_batch, step)
                << std::endl;
    }
    return absl::OkStatus();
  };
  // After a failure (abort) or a membership change at a step boundary: a new
  // world, a new communicator, the newest state from a live peer.
  int regroups = 0;
  bool left = false;  // drained while regrouping: this trainer is done
  std::unique_ptr<Checkpointer> checkpointer;  // created below, when configured
  // Entering a world can fail because the world moved on while its
  // communicator was being built (another join, a peer that died): then the
  // next world is the one to enter.
  auto world_moved_on = [](const absl::Status& s) {
    return absl::IsAborted(s) || absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s) ||
           absl::IsCancelled(s);
  };
  auto regroup = [&](const std::string& why) -> absl::Status {
    const absl::Time start = absl::Now();
    optimizer->zero_grad();  // the step in flight, if any, is dropped
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(comm_mu);
        live_comm = nullptr;
      }
      sync.SetCommunicator(nullptr);
      comm.reset();
      store.reset();
      absl::StatusOr<WorldInfo> next =
          client->Rendezvous(world.generation, step, absl::Now() + absl::Seconds(600));
      if (absl::IsAborted(next.status())) {
        // This incarnation was declared failed (it hung past the heartbeat
        // timeout, e.g. SIGSTOP): rejoin as a new one; a live peer's state
        // replaces ours.
        MUSTER_LOG(WARNING) << "fenced (" << next.status().message()
                            << "); rejoining as a new incarnation";
        if (checkpointer) checkpointer->Wait();
        MUSTER_RETURN_IF_ERROR(connect(/*incarnation=*/0));
        next = client->Rendezvous(0, step, absl::Now() + absl::Seconds(600));
      }
      if (absl::IsFailedPrecondition(next.status())) {
        // Drained (the leave notice may still be on its way), or the job is
        // over: there is no world for this trainer. Leave.
        MUSTER_LOG(WARNING) << "no new world for this trainer: " << next.status().message();
        told_to_leave = true;
        client->Leave(/*finished=*/false, step).IgnoreError();
        left = true;
        return absl::OkStatus();
      }
      if (!next.ok()) return next.status();
      world = *next;
      const absl::Status entered = enter();
      if (entered.ok()) break;
      if (!world_moved_on(entered)) return entered;
      MUSTER_LOG(WARNING) << "generation " << world.generation << " did not start (" << entered
                          << "); joining the next one";
    }
    ++regroups;
    MUSTER_LOG(WARNING) << "regrouped into generation " << world.generation << " (world " << w
                        << ", rank " << rank << ", step " << step << ") after " << why << " in "
                        << absl::FormatDuration(absl::Now() - start);
    return absl::OkStatus();
  };
  if (const absl::Status entered = enter(); !entered.ok()) {
    if (!world_moved_on(entered)) return entered;
    MUSTER_RETURN_IF_ERROR(regroup(std::string(entered.message())));
    if (left) {  // drained before it began
      TrainResult r;
      r.left = true;
      r.steps = step;
      return r;
    }
  }
  if (resume_step > 0 && rank == 0 && !o.quiet) {
    std::cout << "muster: resumed from the checkpoint of step " << resume_step << std::endl;
  }
  DistributedSampler sampler(train->size(), o.seed);
  const int64_t end_offset = o.steps > 0 ? INT64_MAX : int64_t{o.epochs} * train->size();
  const int64_t total_steps =
      o.steps > 0 ? o.steps
                  : o.epochs * ((train->size() + global_batch - 1) / global_batch);

  std::unique_ptr<JsonLinesWriter> jsonl;
  std::unique_ptr<EventWriter> events;
  if (rank == 0 && !o.log_dir.empty()) {
    ::mkdir(o.log_dir.c_str(), 0755);
    MUSTER_ASSIGN_OR_RETURN(jsonl, JsonLinesWriter::Create(o.log_dir + "/metrics.jsonl"));
    MUSTER_ASSIGN_OR_RETURN(events, EventWriter::Create(o.log_dir));
  }

  TrainResult result;
  // After leaving the job early (SIGTERM, drain): what this trainer holds.
  auto left_result = [&]() -> TrainResult {
    if (checkpointer) checkpointer->Wait();
    {
      std::lock_guard<std::mutex> lock(comm_mu);
      live_comm = nullptr;
    }
    if (!o.quiet) std::cout << "muster: left the job after step " << step << std::endl;
    result.steps = step;
    result.left = true;
    for (const torch::Tensor& p : params) result.parameters.push_back(p.detach().cpu().clone());
    return result;
  };
  result.rank = rank;
  result.world_size = w;
  result.resumed_from_step = resume_step > 0 ? resume_step : -1;

  if (!o.checkpoint_dir.empty()) {
    checkpointer = std::make_unique<Checkpointer>(
        o.checkpoint_dir, *model, *optimizer,
        o.checkpoint_fs != nullptr ? o.checkpoint_fs : DefaultFileSystem());
  }
  std::atomic<int> committed{0};
  absl::Time last_checkpoint = absl::Now();
  // Checkpoints the state after `step`: every rank begins it in the catalog;
  // rank 0 writes the (replicated) state in the background and reports its
  // files, the others report none. Failures abort it; training goes on.
  auto checkpoint = [&](int64_t at_step, int64_t epoch) -> absl::Status {
    absl::StatusOr<uint64_t> id =
        client->BeginCheckpoint(world.generation, at_step, absl::Now() + absl::Seconds(30));
    if (!id.ok()) {
      MUSTER_LOG(WARNING) << "checkpoint of step " << at_step << " not started: " << id.status();
      return absl::OkStatus();
    }
    if (rank != 0) {
      absl::Status s = client->ReportShard(*id, {}, absl::Now() + absl::Seconds(30)).status();
      if (!s.ok()) MUSTER_LOG(WARNING) << "checkpoint report failed: " << s;
      return absl::OkStatus();
    }
    CheckpointMeta meta;
    meta.step = at_step;
    meta.epoch = epoch;
    meta.sample_offset = offset;
    meta.generation = world.generation;
    meta.world_size = w;
    meta.model = o.model;
    meta.optimizer = o.optimizer;
    const uint64_t cid = *id;
    CoordinatorClient* c = client.get();
    const std::string dir = o.checkpoint_dir;
    return checkpointer->Snapshot(
        meta, [c, cid, at_step, dir, &committed](absl::StatusOr<std::vector<FileReport>> files,
                                                 CheckpointTiming timing) {
          if (!files.ok()) {
            c->AbortCheckpoint(cid, std::string(files.status().message()),
                               absl::Now() + absl::Seconds(30)).IgnoreError();
            return;
          }
          std::vector<CatalogFile> report;
          for (const FileReport& f : *files) report.push_back({f.path, f.bytes, f.xxh3});
          absl::StatusOr<bool> done = c->ReportShard(cid, report, absl::Now() + absl::Seconds(30));
          if (!done.ok()) {
            MUSTER_LOG(WARNING) << "checkpoint of step " << at_step << " not reported: " << done.status();
            return;
          }
          ++committed;
          MUSTER_LOG(INFO) << "checkpoint of step " << at_step << " written ("
                           << timing.bytes / 1e6 << " MB, blocking " << timing.blocking_seconds
                           << " s, write " << timing.write_seconds << " s)";
          // Retention: the catalog retired older checkpoints; remove their files.
          auto kept = c->ListCommitted(absl::Now() + absl::Seconds(30));
          auto names = DefaultFileSystem()->ListDir(dir);
          if (!kept.ok() || !names.ok()) {
            MUSTER_LOG(WARNING) << "retention skipped: "
                                << (kept.ok() ? names.status() : kept.status());
            return;
          }
          MUSTER_LOG(DEBUG) << "retention after step " << at_step << ": " << kept->size()
                            << " committed, " << names->size() << " directories";
          for (const std::string& name : *names) {
            int64_t s = -1;
            if (name.rfind("step-", 0) != 0 || !absl::SimpleAtoi(name.substr(5), &s)) continue;
            bool keep = s >= at_step;
            for (const CatalogEntry& e : *kept) keep |= e.step == s;
            if (!keep) DefaultFileSystem()->RemoveAll(dir + "/" + name).IgnoreError();
          }
        });
  };
  double loss_sum = 0, comm_total = 0, hidden_total = 0;
  int64_t loss_count = 0;
  const absl::Time start = absl::Now();
  absl::Time interval_start = start;
  int64_t interval_samples = 0;
  model->train();
  while (step < total_steps && offset < end_offset) {
    SampledBatch b = sampler.Next(offset, w, rank, o.batch_size);
    auto [x, y] = Batch(*train, b.indices, device);
    const double lr = ScheduledLr(peak_lr, step, o.warmup_steps, total_steps);
    SetLearningRate(*optimizer, lr);
    optimizer->zero_grad();
    const bool stop_here = (o.stop_requested != nullptr && o.stop_requested->load()) ||
                           (o.stop_after_step > 0 && step + 1 >= o.stop_after_step);
    // The control words, averaged over the world with this step's gradients:
    // ranks told to stop (SIGUSR1), ranks leaving (SIGTERM, drain), ranks
    // that heard of a newer generation (a member joined or left).
    const bool newer_world = client->latest_generation() > world.generation;
    const bool leave_here = told_to_leave.load() ||
                            (o.leave_requested != nullptr && o.leave_requested->load());
    sync.Begin(/*sync=*/true, {stop_here ? 1.0f : 0.0f, leave_here ? 1.0f : 0.0f,
                               newer_world ? 1.0f : 0.0f});
    torch::Tensor loss = torch::cross_entropy_loss(model->forward(x), y);
    const absl::Time backward_start = absl::Now();
    loss.backward();
    const absl::Time backward_end = absl::Now();
    if (absl::Status s = sync.Finish(absl::Now() + kCollectiveTimeout); !s.ok()) {
      // A peer failed or hung: drop this step and regroup with the others.
      MUSTER_LOG(WARNING) << "step " << step + 1 << " dropped: " << s;
      MUSTER_RETURN_IF_ERROR(regroup(std::string(s.message())));
      if (left) return left_result();
      continue;
    }
    const int stopping = static_cast<int>(std::lround(sync.control()[0] * w));
    const int leaving = static_cast<int>(std::lround(sync.control()[1] * w));
    const int heard_newer = static_cast<int>(std::lround(sync.control()[2] * w));
    // The all-reduce time not spent waiting after backward was hidden.
    const double comm_s = sync.last_stats().comm_seconds;
    const double exposed = absl::ToDoubleSeconds(absl::Now() - backward_end);
    (void)backward_start;
    comm_total += comm_s;
    hidden_total += std::max(0.0, comm_s - exposed);
    optimizer->step();
    offset += b.global_batch;
    interval_samples += b.global_batch;
    ++step;
    result.last_loss = loss.item<double>();
    loss_sum += result.last_loss;
    ++loss_count;

    if (stopping > 0 || (leaving == w && !told_to_leave.load())) {
      // Some rank was told to stop, or every rank got SIGTERM (the whole job
      // is preempted) (Slurm's warning signal, preemption):
      // every rank saw it in this step's all-reduce. Checkpoint and leave.
      if (checkpointer) {
        MUSTER_RETURN_IF_ERROR(checkpoint(step, b.epoch));
        checkpointer->Wait();
        // Nobody leaves before rank 0 reported: a departure would abort the
        // checkpoint before it commits.
        MUSTER_RETURN_IF_ERROR(comm->Barrier(absl::Now() + kCollectiveTimeout));
      }
      if (rank == 0 && !o.quiet) {
        std::cout << "muster: stopping at step " << step
                  << (checkpointer ? " after checkpointing" : "") << std::endl;
      }
      result.steps = step;
      result.stopped = true;
      result.checkpoints_committed = committed.load();
      {
        std::lock_guard<std::mutex> lock(comm_mu);
        live_comm = nullptr;
      }
      for (const torch::Tensor& p : params) result.parameters.push_back(p.detach().cpu().clone());
      return result;
    }
    if (leave_here && leaving > 0) {
      // This trainer leaves after this step; the others regroup without it.
      client->Leave(/*finished=*/false, step).IgnoreError();
      return left_result();
    }
    if (leaving > 0 || heard_newer > 0) {
      // Every rank stops after this same step and enters the new generation.
      MUSTER_RETURN_IF_ERROR(regroup("a membership change at a step boundary"));
      if (left) return left_result();
    }
    if (checkpointer &&
        ((o.checkpoint_every > 0 && step % o.checkpoint_every == 0) ||
         (o.checkpoint_interval_s > 0 &&
          absl::Now() - last_checkpoint >= absl::Seconds(o.checkpoint_interval_s)))) {
      MUSTER_RETURN_IF_ERROR(checkpoint(step, b.epoch));
      last_checkpoint = absl::Now();
    }

    if (state_server && state_server->Wanted(step)) {
      // Someone pulls the state after this step (muster pull-weights).
      MUSTER_ASSIGN_OR_RETURN(std::string image,
                              EncodeSafetensors(ModelTensors(*model),
                                                {{"format", "muster"},
                                                 {"step", std::to_string(step)},
                                                 {"member", o.client.member_id}}));
      state_server->Publish(step, world.generation, std::move(image));
    }

    const bool eval_now = o.eval_every > 0 && step % o.eval_every == 0 && step < total_steps;
    if (eval_now) {
      absl::StatusOr<Evaluation> evaluated = Evaluate(*model, *test, *comm, rank, w, device);
      if (!evaluated.ok()) {
        MUSTER_RETURN_IF_ERROR(regroup(std::string(evaluated.status().message())));
        if (left) return left_result();
        continue;
      }
      const Evaluation ev = *evaluated;
      if (rank == 0 && !o.quiet) {
        std::cout << absl::StrFormat("eval step %d: test loss %.4f accuracy %.2f%%", step,
                                     ev.loss, 100 * ev.accuracy)
                  << std::endl;
      }
      if (jsonl) jsonl->Write(step, absl::ToUnixMicros(absl::Now()) / 1e6, {{"test_loss", ev.loss}, {"test_accuracy", ev.accuracy}});
      if (events) {
        events->Scalar("test/loss", static_cast<float>(ev.loss), step, absl::ToUnixMicros(absl::Now()) / 1e6);
        events->Scalar("test/accuracy", static_cast<float>(ev.accuracy), step, absl::ToUnixMicros(absl::Now()) / 1e6);
      }
    }
    if (step % o.log_every == 0 || step == total_steps) {
      const double secs = absl::ToDoubleSeconds(absl::Now() - interval_start);
      const double sps = interval_samples / std::max(secs, 1e-9);
      const double mean_loss = loss_sum / std::max<int64_t>(1, loss_count);
      const double eta = (total_steps - step) * global_batch / std::max(sps, 1e-9);
      if (rank == 0 && !o.quiet) {
        std::cout << absl::StrFormat(
                         "step %d/%d  epoch %d  loss %.4f  lr %.4f  %.0f samples/s  ETA %s",
                         step, total_steps, b.epoch, mean_loss, lr, sps, FormatEta(eta))
                  << std::endl;
      }
      const double now = absl::ToUnixMicros(absl::Now()) / 1e6;
      if (jsonl) {
        jsonl->Write(step, now, {{"loss", mean_loss}, {"lr", lr}, {"samples_per_s", sps},
                                 {"epoch", static_cast<double>(b.epoch)},
                                 {"world_size", static_cast<double>(w)},
                                 {"generation", static_cast<double>(world.generation)}});
      }
      if (events) {
        events->Scalar("train/loss", static_cast<float>(mean_loss), step, now);
        events->Scalar("train/samples_per_s", static_cast<float>(sps), step, now);
        events->Flush();
      }
      interval_start = absl::Now();
      interval_samples = 0;
      loss_sum = 0;
      loss_count = 0;
    }
  }
  if (checkpointer) checkpointer->Wait();
  result.checkpoints_committed = committed.load();
  result.regroups = regroups;
  result.rank = rank;
  result.world_size = w;
  const double elapsed = absl::ToDoubleSeconds(absl::Now() - start);
  result.steps = step;
  result.steps_per_second = (step - resume_step) / std::max(elapsed, 1e-9);
  result.samples_per_second = result.steps_per_second * global_batch;
  result.comm_overlap_pct = comm_total > 0 ? 100.0 * hidden_total / comm_total : 0;
  absl::StatusOr<Evaluation> evaluated = Evaluate(*model, *test, *comm, rank, w, device);
  while (!evaluated.ok()) {
    MUSTER_RETURN_IF_ERROR(regroup(std::string(evaluated.status().message())));
    if (left) return left_result();
    evaluated = Evaluate(*model, *test, *comm, rank, w, device);
  }
  const Evaluation final_eval = *evaluated;
  result.test_loss = final_eval.loss;
  result.test_accuracy = final_eval.accuracy;
  if (jsonl) {
    jsonl->Write(step, absl::ToUnixMicros(absl::Now()) / 1e6,
                 {{"test_loss", final_eval.loss}, {"test_accuracy", final_eval.accuracy}});
  }
  if (events) {
    events->Scalar("test/accuracy", static_cast<float>(final_eval.accuracy), step,
                   absl::ToUnixMicros(absl::Now()) / 1e6);
    events->Flush();
  }
  if (rank == 0 && !o.quiet) {
    std::cout << absl::StrFormat(
                     "done: %d steps in %.1f s (%.0f samples/s); test loss %.4f, test accuracy "
                     "%.2f%%%s",
                     step, elapsed, result.samples_per_second, final_eval.loss,
                     100 * final_eval.accuracy,
                     o.log_dir.empty() ? "" : absl::StrCat("; logs in ", o.log_dir))
              << std::endl;
  }
  {
    std::lock_guard<std::mutex> lock(comm_mu);
    live_comm = nullptr;
  }
  for (const torch::Tensor& p : params) result.parameters.push_back(p.detach().cpu().clone());
  result.parameter_checksum = TensorChecksum(result.parameters);
  client->Leave(/*finished=*/true, step).IgnoreError();
  return result;
}

}  // namespace muster
