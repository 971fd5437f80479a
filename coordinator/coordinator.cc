#include "coordinator/coordinator.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace muster {

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

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(CoordinatorOptions options,
                                                                 StateStore* store) {
  MUSTER_RETURN_IF_ERROR(options.rules.Validate());
  if (options.heartbeat_timeout <= options.heartbeat_interval) {
    return absl::InvalidArgumentError("heartbeat_timeout must exceed heartbeat_interval");
  }
  std::unique_ptr<Coordinator> c(new Coordinator(std::move(options), store));
  MUSTER_RETURN_IF_ERROR(c->Load());
  return c;
}

Coordinator::Coordinator(CoordinatorOptions options, StateStore* store)
    : options_(std::move(options)),
      clock_(options_.clock),
      started_(clock_->Now()),
      store_(store),
      persister_(&store_),
      membership_(options_.limits),
      timer_(options_.rules),
      kv_(options_.limits),
      catalog_(&store_, options_.catalog, options_.limits) {
  catalog_.set_writer([this](const CheckpointRecord& r) { persister_.SaveCheckpoint(r); });
}

Coordinator::~Coordinator() {
  absl::MutexLock lock(&mu_);
  FlushEvents();
}

absl::Status Coordinator::Load() {
  absl::MutexLock lock(&mu_);
  MUSTER_RETURN_IF_ERROR(catalog_.Load());
  MUSTER_ASSIGN_OR_RETURN(World world, store_.LoadWorld());
  generation_ = world.generation;
  if (world.generation > 0 && !world.members.empty()) {
    world_ = std::move(world);
    world_live_ = true;
    world_complete_ = true;
    for (const Assignment& a : world_.members) arrived_[a.member.id] = a.step;
    job_state_ = JobState::kRecovering;
    recover_deadline_ = clock_->Now() + options_.reattach_grace;
    Record("restart", absl::StrCat("coordinator restarted; waiting up to ",
                                   absl::FormatDuration(options_.reattach_grace), " for the ",
                                   world_.size(), " members of generation ",
                                   world_.generation));
  } else {
    Record("start", absl::StrCat("coordinator started at generation ", generation_));
  }
  counters_.generation = generation_;
  counters_.checkpoints_committed = catalog_.committed_count();
  return absl::OkStatus();
}

// ---------------------------------------------------------------- helpers

void Coordinator::Record(const std::string& kind, const std::string& detail) {
  MUSTER_LOG(INFO) << kind << ": " << detail;
  unflushed_events_.push_back(JobEvent{clock_->Now(), kind, detail});
}

Actions Coordinator::Gated() {
  return Actions([this] { AwaitDurable(); });
}

void Coordinator::AwaitDurable() {
  const absl::Status s = persister_.Wait(persister_.last_ticket());
  if (s.ok() || store_failed_.exchange(true)) return;
  // A generation that is not on disk must not be handed out as if it were;
  // crash-only: stop the job loudly (its checkpoints are safe), and let the
  // coordinator be restarted on a working state dir.
  Shutdown(absl::StrCat("the state store cannot be written: ", s.message()));
}

void Coordinator::FlushEvents() {
  if (unflushed_events_.empty()) return;
  persister_.AppendEvents(std::move(unflushed_events_));
  unflushed_events_.clear();
}

void Coordinator::PushTo(const std::string& id, const MemberEvent& event, Actions* actions) {
  MemberInfo* info = membership_.Find(id);
  if (info == nullptr || info->session == 0) return;
  auto it = sessions_.find(info->session);
  if (it == sessions_.end()) return;
  actions->Add([sink = it->second.sink, event] { sink->Push(event); });
}

absl::Status Coordinator::CheckGeneration(uint64_t generation) const {
  if (generation < generation_ || (generation == generation_ && !world_live_)) {
    return absl::AbortedError(absl::StrCat("generation ", generation,
                                           " is over; the current generation is ",
                                           generation_, world_live_ ? "" : " (paused)"));
  }
  if (generation > generation_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "generation ", generation, " does not exist; the current one is ", generation_));
  }
  return absl::OkStatus();
}

absl::Status Coordinator::CheckServing() const {
  if (job_state_ == JobState::kShuttingDown) {
    return absl::FailedPreconditionError("the coordinator is shutting down");
  }
  return absl::OkStatus();
}

absl::Duration Coordinator::CapWait(absl::Duration d) const {
  return std::clamp(d, absl::ZeroDuration(), absl::Milliseconds(options_.limits.max_wait_ms));
}

bool Coordinator::shutting_down() {
  absl::MutexLock lock(&mu_);
  return job_state_ == JobState::kShuttingDown;
}

// ---------------------------------------------------------------- members

absl::StatusOr<JoinResult> Coordinator::Join(const JoinSpec& spec) {
  Actions actions = Gated();
  absl::MutexLock lock(&mu_);
  MUSTER_RETURN_IF_ERROR(CheckServing());
  MemberInfo fenced;
  MUSTER_ASSIGN_OR_RETURN(JoinOutcome outcome,
                          membership_.Join(spec, clock_->Now(), &fenced));
  MemberInfo* info = membership_.Find(spec.key.id);
  const int rank = world_.RankOf(spec.key.id);
  const bool in_world = world_live_ && rank >= 0 &&
                        world_.members[rank].member.incarnation == spec.key.incarnation;
  JoinResult result;
  result.generation = generation_;
  if (in_world) {
    result.reattached = true;
    if (info->state == MemberState::kWaiting) info->state = MemberState::kActive;
    Record("reattach", absl::StrCat(spec.key.id, " incarnation ", spec.key.incarnation,
                                    " is back in generation ", generation_));
    return result;
  }
  result.reattached = outcome == JoinOutcome::kReattached;
  if (outcome == JoinOutcome::kReplaced) {
    if (fenced.session != 0) {
      auto it = sessions_.find(fenced.session);
      if (it != sessions_.end()) {
        actions.Add([sink = it->second.sink] {
          sink->Close(absl::AbortedError("replaced by a new incarnation"));
        });
        sessions_.erase(it);
      }
    }
    DropWaiters(spec.key.id, absl::AbortedError("replaced by a new incarnation"), &actions);
  }
  const bool spare = world_live_ && rank < 0 && world_.size() >= options_.rules.max_members;
  Record("join", absl::StrCat(spec.key.id, " incarnation ", spec.key.incarnation, " on ",
                              spec.node, " local rank ", spec.local_rank,
                              spare ? " (a spare: the world is full)" : ""));
  if (world_live_ && rank >= 0 && job_state_ != JobState::kFinished) {
    // A new incarnation of a member of the current world: the old one is gone.
    ++counters_.failures;
    Evaluate(/*urgent=*/true, /*abort=*/true,
             absl::StrCat("member ", spec.key.id, " restarted as incarnation ",
                          spec.key.incarnation),
             &actions);
  }
  return result;
}

absl::StatusOr<uint64_t> Coordinator::OpenSession(const MemberKey& key,
                                                  std::shared_ptr<SessionSink> sink,
                                                  const std::string& node) {
  Actions actions = Gated();
  absl::MutexLock lock(&mu_);
  MUSTER_RETURN_IF_ERROR(CheckServing());
  MUSTER_ASSIGN_OR_RETURN(MemberInfo * info, membership_.Live(key));
  if (!node.empty() && info->node != node) {
    return absl::InvalidArgumentError(absl::StrCat("member ", key.id, " joined on node ",
                                                   info->node, ", not on ", node));
  }
  if (info->session != 0) {
    auto it = sessions_.find(info->session);
    if (it != sessions_.end()) {
      actions.Add([old = it->second.sink] {
        old->Close(absl::AbortedError("superseded by a newer session of the same member"));
      });
      sessions_.erase(it);
    }
  }
  const uint64_t id = next_session_++;
  sessions_[id] = Session{key, std::move(sink)};
  info->session = id;
  info->last_seen = clock_->Now();
  if (job_state_ == JobState::kRecovering) CheckRecovered(&actions);
  return id;
}

absl::Status Coordinator::Beat(uint64_t session, int64_t step, absl::Time now) {
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return absl::NotFoundError("no such session");
  MUSTER_ASSIGN_OR_RETURN(MemberInfo * info, membership_.Live(it->second.member));
  info->last_seen = now;
  if (step >= 0) info->step = step;
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> Coordinator::Heartbeat(uint64_t session, int64_t step) {
  absl::MutexLock lock(&mu_);
  MUSTER_RETURN_IF_ERROR(Beat(session, step, clock_->Now()));
  return generation_;
}

uint64_t Coordinator::Heartbeats(const std::vector<uint64_t>& sessions,
                                 const std::vector<int64_t>& steps, std::vector<bool>* ok) {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  ok->assign(sessions.size(), false);
  for (size_t i = 0; i < sessions.size(); ++i) (*ok)[i] = Beat(sessions[i], steps[i], now).ok();
  return generation_;
}

void Coordinator::SessionClosed(uint64_t session, const std::string& why) {
  Actions actions = Gated();
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return;
  const MemberKey key = it->second.member;
  sessions_.erase(it);
  if (job_state_ == JobState::kShuttingDown) return;
  MemberInfo* info = membership_.Find(key.id);
  if (info == nullptr || info->key != key || info->session != session) return;
  info->session = 0;
  if (IsAlive(info->state)) FailMember(info, absl::StrCat("session closed: ", why), &actions);
}

absl::Status Coordinator::Leave(const MemberKey& key, LeaveReason reason, int64_t step) {
  Actions actions = Gated();
  absl::MutexLock lock(&mu_);
  MUSTER_ASSIGN_OR_RETURN(MemberInfo * info, membership_.Live(key));
  if (step >= 0) info->step = step;
  const bool in_live_world = world_live_ && world_.RankOf(key.id) >= 0 &&
                             info->state == MemberState::kActive;
  DropWaiters(key.id, absl::AbortedError("the member left"), &actions);
  if (reason == LeaveReason::kFinished) {
    info->state = MemberState::kFinished;
    info->reason = "finished";
    Record("finish", absl::StrCat(key.id, " finished at step ", info->step));
    bool all_done = world_live_;
    for (const Assignment& a : world_.members) {
      const MemberInfo* m = membership_.Find(a.member.id);
      if (m != nullptr && IsAlive(m->state)) all_done = false;
    }
    if (all_done && job_state_ != JobState::kShuttingDown) {
      job_state_ = JobState::kFinished;
      Record("finished", absl::StrCat("job finished at generation ", generation_));
      // Members still waiting for a world (one that rejoined after a
      // partition, say) will not get one: tell them now.
      for (RendezvousWaiter& w : waiters_) {
        actions.Add([done = std::move(w.done)] {
          done(absl::FailedPreconditionError("the job has finished"));
        });
      }
      waiters_.clear();
      // A restart on this state dir (a requeued job) must not wait for the
      // finished members: keep the generation counter, forget the world.
      World done;
      done.generation = generation_;
      persister_.SaveWorld(std::move(done));
    }
    return absl::OkStatus();
  }
  info->state = MemberState::kLeft;
  info->reason = "left";
  Record("leave", absl::StrCat(key.id, " left at step ", info->step));
  if (in_live_world && job_state_ != JobState::kFinished) {
    Evaluate(/*urgent=*/true, /*abort=*/false, absl::StrCat("member ", key.id, " left"),
             &actions);
  }
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> Coordinator::Drain(const std::string& node) {
  Actions actions = Gated();
  absl::MutexLock lock(&mu_);
  MUSTER_RETURN_IF_ERROR(CheckServing());
  MUSTER_RETURN_IF_ERROR(CheckName("node", node, options_.limits.max_id_bytes));
  uint32_t drained = 0;
  for (const auto& [id, info] : membership_.members()) {
    if (info.node != node || !IsAlive(info.state)) continue;
    MemberInfo* m = membership_.Find(id);
    m->state = MemberState::kDraining;
    m->reason = "drained";
    DropWaiters(id, absl::AbortedError("the member's node is drained"), &actions);
    ++drained;
  }
  if (drained == 0) {
    return absl::NotFoundError(absl::StrCat("no live member on node ", node));
  }
  Record("drain", absl::StrCat("node ", node, ": ", drained, " members leave"));
  Evaluate(/*urgent=*/true, /*abort=*/false, absl::StrCat("node ", node, " drained"),
           &actions);
  return drained;
}

// ---------------------------------------------------------------- KV, barrier

absl::Status Coordinator::KvSet(uint64_t generation, const std::string& key,
                                std::string value) {
  Actions actions = Gated();
  absl::MutexLock lock(&mu_);
  MUSTER_RETURN_IF_ERROR(CheckGeneration(generation));
  return kv_.Set(key, std::move(value), &actions);
}

void Coordinator::KvGet(uint64_t generation, std::vector<std::string> keys,
                        absl::Duration wait, KvCallback done) {
  Actions actions = Gated();
  absl::MutexLock lock(&mu_);
  absl::Status s = CheckGeneration(generation);
  if (!s.ok()) {
    actions.Add([done = std::move(done), s] { done(s); });
    return;
  }
  wait = CapWait(wait);
  if (wait == absl::ZeroDuration()) {
    auto values = kv_.Get(keys);
    actions.Add([done = std::move(done), values = std::move(values)] { done(values); });
    return;
  }
  kv_.Wait(std::move(keys), clock_->Now() + wait, std::move(done), &actions);
}

absl::StatusOr<int64_t> Coordinator::KvAdd(uint64_t generation, const std::string& key,
                                           int64_t delta) {
  Actions actions = Gated();
  absl::MutexLock lock(&mu_);
  MUSTER_RETURN_IF_ERROR(CheckGeneration(generation));
  return kv_.Add(key, delta, &actions);
}

absl::StatusOr<CasResult> Coordinator::KvCompareAndSet(
    uint64_t generation, const std::string& key, const std::optional<std::string>& expected,
    std::string desired) {
  Actions actions = Gated();
  absl::MutexLock lock(&mu_);
  MUSTER_RETURN_IF_ERROR(CheckGeneration(generation));
  return kv_.CompareAndSet(key, expected, std::move(desired), &actions);
}

void Coordinator::Barrier(uint64_t generation, const MemberKey& key, const std::string& name,
                          absl::Duration timeout, DoneCallback done) {
  Actions actions = Gated();
  absl::MutexLock lock(&mu_);
  absl::Status s = CheckGeneration(generation);
  if (s.ok()) s = CheckName("name", name, options_.limits.max_id_bytes);
  if (s.ok()) s = membership_.Live(key).status();
  if (s.ok() && world_.RankOf(key.id) < 0) {
    s = absl::PermissionDeniedError(
        absl::StrCat("member ", key.id, " is not part of generation ", generation));
  }
  if (!s.ok()) {
    actions.Add([done = std::move(done), s] { done(s); });
    return;
  }
  barriers_.Arrive(name, key.id, world_.size(), clock_->Now() + CapWait(timeout),
                   std::move(done), &actions);
}

// ---------------------------------------------------------------- catalog

absl::StatusOr<uint64_t> Coordinator::BeginCheckpoint(uint64_t generation,
                                                      const MemberKey& key, int64_t step) {
  absl::StatusOr<uint64_t> id = DecideBeginCheckpoint(generation, key, step);
  if (id.ok()) AwaitDurable();
  return id;
}

absl::StatusOr<uint64_t> Coordinator::DecideBeginCheckpoint(uint64_t generation,
                                                            const MemberKey& key, int64_t step) {
  absl::MutexLock lock(&mu_);
  MUSTER_RETURN_IF_ERROR(CheckServing());
  MUSTER_RETURN_IF_ERROR(CheckGeneration(generation));
  MUSTER_RETURN_IF_ERROR(membership_.Live(key).status());
  if (world_.RankOf(key.id) < 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("member ", key.id, " is not part of generation ", generation));
  }
  std::vector<std::string> members;
  for (const Assignment& a : world_.members) members.push_back(a.member.id);
  return catalog_.Begin(generation, step, members, clock_->Now());
}

absl::StatusOr<bool> Coordinator::ReportShard(uint64_t id, const MemberKey& key,
                                              ShardReport report) {
  absl::StatusOr<bool> committed = DecideReportShard(id, key, std::move(report));
  if (committed.ok()) AwaitDurable();  // "committed" is said only once it is on disk
  return committed;
}

absl::StatusOr<bool> Coordinator::DecideReportShard(uint64_t id, const MemberKey& key,
                                                    ShardReport report) {
  absl::MutexLock lock(&mu_);
  MUSTER_RETURN_IF_ERROR(CheckServing());
  MUSTER_RETURN_IF_ERROR(membership_.Live(key).status());
  report.member = key.id;
  MUSTER_ASSIGN_OR_RETURN(bool committed, catalog_.Report(id, report, clock_->Now()));
  if (committed) {
    ++counters_.checkpoints_committed;
    const CheckpointRecord* r = catalog_.LatestCommitted();
    Record("checkpoint", absl::StrCat("checkpoint ", id, " committed",
                                      r != nullptr ? absl::StrCat(" (latest step ", r->step, ")")
                                                   : std::string()));
  }
  return committed;
}

absl::Status Coordinator::AbortCheckpoint(uint64_t id, const MemberKey& key,
                                          const std::string& reason) {
  MUSTER_RETURN_IF_ERROR(CheckOptional("reason", reason, options_.limits.max_reason_bytes));
  {
    absl::MutexLock lock(&mu_);
    MUSTER_RETURN_IF_ERROR(CheckServing());
    MUSTER_RETURN_IF_ERROR(membership_.Live(key).status());
    MUSTER_RETURN_IF_ERROR(catalog_.Abort(id, absl::StrCat(key.id, ": ", reason)));
    Record("checkpoint", absl::StrCat("checkpoint ", id, " aborted by ", key.id, ": ", reason));
  }
  AwaitDurable();
  return absl::OkStatus();
}

std::vector<CheckpointRecord> Coordinator::ListCheckpoints(bool all) {
  absl::MutexLock lock(&mu_);
  return catalog_.List(all);
}

// ---------------------------------------------------------------- status

std::shared_ptr<const World> Coordinator::CurrentWorld() {
  absl::MutexLock lock(&mu_);
  if (world_.generation == 0) return nullptr;
  return Published();
}

StatusSnapshot Coordinator::GetStatus() {
  absl::MutexLock lock(&mu_);
  StatusSnapshot s;
  s.job_state = job_state_;
  s.generation = generation_;
  s.world_size = world_live_ ? world_.size() : 0;
  const bool full = world_live_ && world_.size() >= options_.rules.max_members;
  for (const auto& [id, info] : membership_.members()) {
    const int rank = world_live_ ? world_.RankOf(id) : -1;
    s.members.push_back(
        MemberRow{info, rank, full && rank < 0 && info.state == MemberState::kWaiting});
  }
  s.committed_checkpoints = catalog_.committed_count();
  const CheckpointRecord* latest = catalog_.LatestCommitted();
  s.latest_committed_step = latest != nullptr ? latest->step : -1;
  s.rules = options_.rules;
  s.now = clock_->Now();
  s.uptime = s.now - started_;
  return s;
}

CoordinatorCounters Coordinator::Counters() {
  absl::MutexLock lock(&mu_);
  CoordinatorCounters c = counters_;
  c.generation = generation_;
  c.open_sessions = sessions_.size();
  for (const auto& [id, info] : membership_.members()) {
    ++c.members_by_state[MemberStateName(info.state)];
  }
  return c;
}

std::vector<JobEvent> Coordinator::RecentEvents(size_t limit) {
  {
    absl::MutexLock lock(&mu_);
    FlushEvents();
  }
  persister_.Flush().IgnoreError();
  auto events = store_.LoadEvents(limit);
  return events.ok() ? *events : std::vector<JobEvent>();
}

void Coordinator::Shutdown(const std::string& reason) {
  if (StopServing(reason)) {
    // Everything decided is on disk when Shutdown returns, and nothing is
    // written after it: a successor may open the same state at once.
    persister_.Flush().IgnoreError();
    persister_.Close();
  }
}

bool Coordinator::StopServing(const std::string& reason) {
  Actions actions = Gated();
  absl::MutexLock lock(&mu_);
  if (job_state_ == JobState::kShuttingDown) return false;
  job_state_ = JobState::kShuttingDown;
  Record("shutdown", reason);
  MemberEvent stop;
  stop.kind = MemberEvent::Kind::kStop;
  stop.reason = reason;
  for (auto& [id, session] : sessions_) {
    actions.Add([sink = session.sink, stop] {
      sink->Push(stop);
      sink->Close(absl::OkStatus());
    });
  }
  sessions_.clear();
  const absl::Status down = absl::FailedPreconditionError(
      absl::StrCat("the coordinator is shutting down: ", reason));
  for (RendezvousWaiter& w : waiters_) {
    actions.Add([done = std::move(w.done), down] { done(down); });
  }
  waiters_.clear();
  kv_.Reset(std::string(down.message()), &actions);
  barriers_.Reset(std::string(down.message()), &actions);
  FlushEvents();
  return true;
}

void Coordinator::Tick() {
  Actions actions = Gated();
  absl::MutexLock lock(&mu_);
  if (job_state_ == JobState::kShuttingDown) return;
  const absl::Time now = clock_->Now();
  // The scans below visit every member; at 100,000 members they would take
  // a good part of a core at the tick's rate. A timeout of seconds loses
  // nothing by a scan every twentieth of it (at most 100 ms).
  if (now >= next_expiry_scan_) {
    next_expiry_scan_ = now + std::min(absl::Milliseconds(100), options_.heartbeat_timeout / 20);
    for (const std::string& id : membership_.Expired(now, options_.heartbeat_timeout)) {
      MemberInfo* info = membership_.Find(id);
      FailMember(info,
                 absl::StrCat("no heartbeat for ",
                              absl::FormatDuration(now - info->last_seen), " (timeout ",
                              absl::FormatDuration(options_.heartbeat_timeout), ")"),
                 &actions);
    }
  }
  // Rendezvous waiters: scanned only when the earliest deadline passed (a
  // rendezvous of 100,000 members keeps that many waiting at once).
  if (now >= first_waiter_deadline_) {
    first_waiter_deadline_ = absl::InfiniteFuture();
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (it->deadline <= now) {
        actions.Add([done = std::move(it->done), gen = generation_] {
          done(absl::DeadlineExceededError(absl::StrCat(
              "no world formed in time (current generation ", gen, "); call again")));
        });
        it = waiters_.erase(it);
      } else {
        first_waiter_deadline_ = std::min(first_waiter_deadline_, it->deadline);
        ++it;
      }
    }
  }
  kv_.Expire(now, &actions);
  barriers_.Expire(now, &actions);
  if (job_state_ == JobState::kRecovering && now >= recover_deadline_) {
    job_state_ = JobState::kRunning;
    Evaluate(/*urgent=*/true, /*abort=*/true,
             "members of the stored generation did not come back after the restart",
             &actions);
  } else if (timer_.deadline() && now >= *timer_.deadline()) {
    Evaluate(/*urgent=*/false, /*abort=*/false, "new members joined", &actions);
  }
  if (now >= next_prune_) {
    next_prune_ = now + absl::Seconds(1);
    membership_.PruneEnded(/*keep=*/10'000);
  }
  FlushEvents();
}

}  // namespace muster
