// Coordinator: construction and loading, helpers, status, shutdown and the
// periodic Tick. Members are in coordinator_members.cc, the KV store,
// barriers and the catalog in coordinator_kv.cc, rendezvous and regrouping
// in coordinator_regroup.cc.
#include "coordinator/coordinator.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace muster {

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(CoordinatorOptions options,
                                                                 StateStore* store) {
  MUSTER_RETURN_IF_ERROR(options.rules.Validate());
  if (options.clock == nullptr) {
    return absl::InvalidArgumentError("CoordinatorOptions::clock is not set");
  }
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
      persister_(&store_, clock_),
      regroup_(options_.rules),
      membership_(options_.limits),
      kv_(options_.limits),
      catalog_(&store_, options_.catalog, options_.limits),
      holds_(options_.partition_holds) {
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
  MUSTER_RETURN_IF_ERROR(
      gen_.Loaded(std::move(world), clock_->Now() + options_.reattach_grace));
  announced_generation_ = gen_.generation();
  // A paused world loaded as such: --pause-timeout counts from the start.
  const bool paused =
      gen_.phase() == GenerationPhase::kNoWorld && !gen_.world().members.empty();
  if (paused) regroup_.Paused(clock_->Now());
  if (gen_.phase() == GenerationPhase::kRecovering) {
    Record("restart", absl::StrCat("coordinator restarted; waiting up to ",
                                   absl::FormatDuration(options_.reattach_grace), " for the ",
                                   gen_.world().size(), " members of generation ",
                                   gen_.world().generation));
  } else {
    Record("start", absl::StrCat("coordinator started at generation ", gen_.generation(),
                                 paused ? " (its world paused)" : ""));
  }
  counters_.generation = gen_.generation();
  counters_.checkpoints_committed = catalog_.committed_count();
  return absl::OkStatus();
}

// ---------------------------------------------------------------- helpers

bool Coordinator::Accepted(const absl::Status& transition) {
  if (transition.ok()) return true;
  MUSTER_LOG(ERROR) << "the coordinator's state refused a transition: " << transition;
  return false;
}

void Coordinator::Record(const std::string& kind, const std::string& detail) {
  MUSTER_LOG(INFO) << kind << ": " << detail;
  unflushed_events_.push_back(JobEvent{clock_->WallNow(), kind, detail});
}

absl::Status Coordinator::AwaitDurable() {
  const absl::Status s = persister_.Wait(persister_.last_ticket());
  if (s.ok()) return s;
  const absl::Status not_durable =
      absl::UnavailableError(absl::StrCat("not on disk: ", s.message()));
  if (store_failed_.exchange(true)) return not_durable;
  if (absl::IsAborted(s)) {
    // Fenced: another coordinator holds the lease, and the members are its.
    Abandon(std::string(s.message()));
    return not_durable;
  }
  // A generation that is not on disk must not be handed out as if it were;
  // crash-only: stop the job loudly (its checkpoints are safe), and let the
  // coordinator be restarted on a working state dir.
  Shutdown(absl::StrCat("the state store cannot be written: ", s.message()))
      .IgnoreError();  // it cannot be, as said; logged
  return not_durable;
}

void Coordinator::Announce(uint64_t generation) {
  uint64_t seen = announced_generation_.load();
  while (seen < generation && !announced_generation_.compare_exchange_weak(seen, generation)) {
  }
}

void Coordinator::FlushEvents() {
  if (unflushed_events_.empty()) return;
  persister_.AppendEvents(std::move(unflushed_events_));
  unflushed_events_.clear();
}

absl::Duration HeartbeatIntervalFor(int64_t streams, const CoordinatorOptions& options) {
  const absl::Duration base = options.heartbeat_interval;
  if (options.max_heartbeat_rate == 0) return base;
  const absl::Duration spread = absl::Seconds(1) * streams / options.max_heartbeat_rate;
  const absl::Duration longest = std::max(base, options.heartbeat_timeout / 3);
  return std::min(std::max(base, spread), longest);
}

absl::Duration IsolatedAfter(absl::Duration interval, const CoordinatorOptions& options) {
  const absl::Duration timeout = options.heartbeat_timeout;
  return std::max(timeout / 2, std::min(2 * interval, (interval + timeout) / 2));
}

std::shared_ptr<SessionSink> Coordinator::SinkOf(const MemberInfo& info) const {
  if (info.session == 0) return nullptr;
  auto it = sessions_.find(info.session);
  return it == sessions_.end() ? nullptr : it->second.sink;
}

void Coordinator::PushTo(const std::string& id, const MemberEvent& event, Actions* actions) {
  const MemberInfo* info = membership_.Find(id);
  if (info == nullptr) return;
  std::shared_ptr<SessionSink> sink = SinkOf(*info);
  if (sink == nullptr) return;
  actions->Add([sink = std::move(sink), event = std::make_shared<const MemberEvent>(event)] {
    sink->PushShared(event);
  });
}

absl::Status Coordinator::CheckServing() const {
  if (gen_.phase() == GenerationPhase::kShuttingDown) {
    // Abandoned: the members belong to the coordinator that took over,
    // and retry there.
    if (!abandoned_.empty()) {
      return absl::UnavailableError(
          absl::StrCat("this coordinator stopped serving (", abandoned_, "); reconnect"));
    }
    return absl::FailedPreconditionError("the coordinator is shutting down");
  }
  return absl::OkStatus();
}

absl::Duration Coordinator::CapWait(absl::Duration d) const {
  return std::clamp(d, absl::ZeroDuration(), absl::Milliseconds(options_.limits.max_wait_ms));
}

bool Coordinator::shutting_down() {
  absl::MutexLock lock(&mu_);
  return gen_.phase() == GenerationPhase::kShuttingDown;
}

// ---------------------------------------------------------------- status

std::shared_ptr<const World> Coordinator::CurrentWorld() {
  absl::MutexLock lock(&mu_);
  if (gen_.world().generation == 0) return nullptr;
  return gen_.Published();
}

StatusSnapshot Coordinator::GetStatus() {
  absl::MutexLock lock(&mu_);
  StatusSnapshot s;
  const World& world = gen_.world();
  const bool live = gen_.world_live();
  s.job_state = gen_.job_state();
  s.generation = gen_.generation();
  s.world_size = live ? world.size() : 0;
  const bool full = live && world.size() >= options_.rules.max_members;
  for (const auto& [id, info] : membership_.members()) {
    const int rank = live ? world.RankOf(id) : -1;
    s.members.push_back(
        MemberRow{info, rank, full && rank < 0 && info.state == MemberState::kWaiting});
  }
  s.committed_checkpoints = catalog_.committed_count();
  const CheckpointRecord* latest = catalog_.LatestCommitted();
  s.latest_committed_step = latest != nullptr ? latest->step : -1;
  s.rules = options_.rules;
  s.now = clock_->Now();
  s.wall_now = clock_->WallNow();
  s.uptime = s.now - started_;
  return s;
}

uint64_t Coordinator::WorldsCompleted() {
  absl::MutexLock lock(&mu_);
  return counters_.regroups_timed;
}

CoordinatorCounters Coordinator::Counters() {
  absl::MutexLock lock(&mu_);
  CoordinatorCounters c = counters_;
  c.generation = gen_.generation();
  c.open_sessions = sessions_.size();
  c.world_size = gen_.world_live() ? gen_.world().size() : 0;
  for (const auto& [id, info] : membership_.members()) {
    ++c.members_by_state[MemberStateName(info.state)];
    if (info.state != MemberState::kActive) continue;
    c.step = std::max(c.step, info.step);
    if (info.memory.total() > c.largest_memory.total()) c.largest_memory = info.memory;
  }
  return c;
}

absl::StatusOr<std::vector<JobEvent>> Coordinator::RecentEvents(size_t limit) {
  {
    absl::MutexLock lock(&mu_);
    FlushEvents();
  }
  // A failed world write is sticky and says nothing of the event log: the
  // events written so far are still worth reading.
  if (absl::Status s = persister_.Flush(absl::Seconds(5));
      absl::IsDeadlineExceeded(s)) {
    return s;
  }
  return store_.LoadEvents(limit);
}

absl::Status Coordinator::Shutdown(const std::string& reason) {
  if (!StopServing(reason)) return absl::OkStatus();
  // Everything decided is on disk when Shutdown returns, and nothing is
  // written after it: a successor may open the same state at once.
  absl::Status flushed = persister_.Flush(absl::Seconds(10));
  persister_.Close();
  if (!flushed.ok()) MUSTER_LOG(ERROR) << "shutdown: the state is not all on disk: " << flushed;
  return flushed;
}

void Coordinator::Abandon(const std::string& reason) { StopServing(reason, false); }

bool Coordinator::StopServing(const std::string& reason, bool tell_members) {
  // Not gated: stopping announces nothing that must be on disk first, and
  // it also runs when the store has failed (from AwaitDurable).
  Decision decision(&mu_, nullptr);
  Actions& actions = decision.actions();
  if (!gen_.ShuttingDown()) return false;
  Record(tell_members ? "shutdown" : "abandon", reason);
  if (!tell_members) abandoned_ = reason;
  MemberEvent stop;
  stop.kind = MemberEvent::Kind::kStop;
  stop.reason = reason;
  const absl::Status down =
      tell_members ? absl::FailedPreconditionError(
                         absl::StrCat("the coordinator is shutting down: ", reason))
                   : absl::UnavailableError(absl::StrCat("this coordinator stopped serving (",
                                                         reason, "); reconnect"));
  for (auto& [id, session] : sessions_) {
    actions.Add([sink = session.sink, stop, tell_members, down] {
      if (!tell_members) {
        sink->Close(down);
        return;
      }
      sink->Push(stop);
      sink->Close(absl::OkStatus());
    });
  }
  sessions_.clear();
  for (RendezvousWaiter& w : regroup_.waiters().TakeAll()) {
    actions.Add([done = std::move(w.done), down] { done(down); });
  }
  if (tell_members) {
    kv_.Reset(std::string(down.message()), &actions);
    barriers_.Reset(std::string(down.message()), &actions);
  } else {
    kv_.Reset(down, &actions);
    barriers_.Reset(down, &actions);
  }
  FlushEvents();
  return true;
}

absl::Duration Coordinator::Unheard() {
  absl::MutexLock lock(&mu_);
  return HoldLocked(clock_->Now());
}

absl::Duration Coordinator::HoldLocked(absl::Time now) {
  const absl::Time heard = std::max(
      membership_.LastSeen(),
      absl::FromUnixNanos(last_heard_ns_.load(std::memory_order_relaxed)));
  const absl::Duration silence = now - heard;
  const bool silent = options_.silence_hold > absl::ZeroDuration() &&
                      silence >= IsolatedAfter(HeartbeatInterval(), options_) &&
                      gen_.phase() != GenerationPhase::kRecovering &&
                      gen_.phase() != GenerationPhase::kShuttingDown &&
                      membership_.AliveOnTwoNodes();
  if (!silent) {
    if (hold_since_ != absl::InfinitePast()) {
      // Heard again: the others get a heartbeat timeout to come back too.
      hold_since_ = absl::InfinitePast();
      excused_until_ = now + options_.heartbeat_timeout;
    }
    return absl::ZeroDuration();
  }
  if (hold_since_ == absl::InfinitePast()) hold_since_ = now;
  // Held long enough for a standby to take over: none did, so nobody else
  // will serve these members; act on the silence as without a hold.
  if (now - hold_since_ > options_.silence_hold) return absl::ZeroDuration();
  return silence;
}

bool Coordinator::ExcusedLocked(absl::Time now) {
  return HoldLocked(now) > absl::ZeroDuration() || now < excused_until_;
}

void Coordinator::Tick() {
  Decision decision(&mu_, durable_);
  Actions& actions = decision.actions();
  if (gen_.phase() == GenerationPhase::kShuttingDown) return;
  const absl::Time now = clock_->Now();
  // The scans below visit every member; at 100,000 members they would take
  // a good part of a core at the tick's rate. A timeout of seconds loses
  // nothing by a scan every twentieth of it (at most 100 ms).
  // Not while this coordinator holds through a silence of its own (decided
  // here under the same lock as the scan), nor for a timeout after it.
  const bool held = ExcusedLocked(now);
  if (now >= next_expiry_scan_ && !held) {
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
  for (RendezvousWaiter& w : regroup_.waiters().TakeExpired(now)) {
    if (MemberInfo* info = membership_.Find(w.member.id);
        info != nullptr && info->key.incarnation == w.member.incarnation) {
      info->wait_ended = now;
    }
    actions.Add([done = std::move(w.done), gen = gen_.generation()] {
      done(absl::DeadlineExceededError(absl::StrCat(
          "no world formed in time (current generation ", gen, "); call again")));
    });
  }
  if (gen_.phase() == GenerationPhase::kForming && regroup_.ArrivalDue(now)) {
    FenceLateArrivals(&actions);
  }
  if (std::optional<absl::Time> end = holds_.NextEnd(); end.has_value() && now >= *end) {
    const std::vector<std::string> ended = holds_.Ended(now);
    const std::string why = absl::StrCat("the partition hold of node", ended.size() > 1 ? "s " : " ",
                                         absl::StrJoin(ended, ", "), " ended");
    Record("partition", why);
    Evaluate(/*urgent=*/false, /*abort=*/false, why, &actions);
  }
  kv_.Expire(now, &actions);
  barriers_.Expire(now, &actions);
  if (gen_.RecoveryExpired(now)) {
    if (Accepted(gen_.Recovered())) {
      Evaluate(/*urgent=*/true, /*abort=*/true,
               "members of the stored generation did not come back after the restart",
               &actions);
    }
  } else if (std::optional<absl::Time> last_call = regroup_.last_call_ends();
             last_call.has_value() && now >= *last_call) {
    Evaluate(/*urgent=*/false, /*abort=*/false, "new members joined", &actions);
  }
  if (now >= next_prune_) {
    // A walk of every member: every 10 s bounds the table under churn as
    // well as every second, at a tenth of the cost (about 8 ms at 100,000).
    next_prune_ = now + absl::Seconds(10);
    membership_.PruneEnded(/*keep=*/10'000);
  }
  if (options_.pause_timeout > absl::ZeroDuration() && ended_.empty() &&
      gen_.phase() == GenerationPhase::kNoWorld &&
      now - regroup_.paused_since() >= options_.pause_timeout) {
    ended_ = absl::StrCat("the job stayed below min_members (", options_.rules.min_members,
                          ") for ", absl::FormatDuration(options_.pause_timeout),
                          " (--pause-timeout); it resumes from its last committed checkpoint "
                          "when started again");
    Record("end", ended_);
  }
  FlushEvents();
}

std::string Coordinator::JobEnded() {
  absl::MutexLock lock(&mu_);
  return ended_;
}

}  // namespace muster
