// Coordinator: members — joining, sessions and heartbeats, leaving and
// draining.
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "coordinator/coordinator.h"

namespace muster {

absl::StatusOr<JoinResult> Coordinator::Join(const JoinSpec& spec) {
  Decision decision(&mu_, durable_);
  Actions& actions = decision.actions();
  MUSTER_RETURN_IF_ERROR(CheckServing());
  MemberInfo fenced;
  MUSTER_ASSIGN_OR_RETURN(JoinOutcome outcome,
                          membership_.Join(spec, clock_->Now(), &fenced));
  MemberInfo* info = membership_.Find(spec.key.id);
  const World& world = gen_.world();
  const bool live = gen_.world_live();
  const int rank = world.RankOf(spec.key.id);
  const bool in_world = live && rank >= 0 &&
                        world.members[rank].member.incarnation == spec.key.incarnation;
  JoinResult result;
  result.generation = gen_.generation();
  if (in_world) {
    result.reattached = true;
    if (info->state == MemberState::kWaiting) info->state = MemberState::kActive;
    Record("reattach", absl::StrCat(spec.key.id, " incarnation ", spec.key.incarnation,
                                    " is back in generation ", gen_.generation()));
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
  const bool spare = live && rank < 0 && world.size() >= options_.rules.max_members;
  Record("join", absl::StrCat(spec.key.id, " incarnation ", spec.key.incarnation, " on ",
                              spec.node, " local rank ", spec.local_rank,
                              spare ? " (a spare: the world is full)" : ""));
  if (live && rank >= 0 && gen_.phase() != GenerationPhase::kFinished) {
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
  Decision decision(&mu_, durable_);
  Actions& actions = decision.actions();
  MUSTER_RETURN_IF_ERROR(CheckServing());
  if (membership_.Find(key.id) == nullptr) ReattachFromWorld(key, node);
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
  membership_.Seen(info, clock_->Now());
  if (gen_.phase() == GenerationPhase::kRecovering) CheckRecovered(&actions);
  return id;
}

absl::StatusOr<MemberInfo*> Coordinator::LiveMember(const MemberKey& key) {
  // One lookup by id in the common case: a second only for a member of the
  // world reattached after a restart.
  absl::StatusOr<MemberInfo*> live = membership_.Live(key);
  if (absl::IsNotFound(live.status()) && ReattachFromWorld(key, "")) {
    return membership_.Live(key);
  }
  return live;
}

bool Coordinator::ReattachFromWorld(const MemberKey& key, const std::string& node) {
  if (gen_.phase() != GenerationPhase::kRecovering) return false;
  const World& world = gen_.world();
  const int rank = world.RankOf(key.id);
  if (rank < 0 || world.members[rank].member.incarnation != key.incarnation) return false;
  const Assignment& a = world.members[rank];
  if (!node.empty() && a.node != node) return false;
  JoinSpec spec;
  spec.key = key;
  spec.node = a.node;
  spec.local_rank = a.local_rank;
  spec.state_address = a.state_address;
  spec.step = a.step;
  MemberInfo unused;
  if (!membership_.Join(spec, clock_->Now(), &unused).ok()) return false;
  membership_.Find(key.id)->state = MemberState::kActive;
  Record("reattach", absl::StrCat(key.id, " incarnation ", key.incarnation,
                                  " is back in generation ", gen_.generation(),
                                  " (its session reopened)"));
  return true;
}

absl::Status Coordinator::Beat(uint64_t session, MemberProgress progress, absl::Time now) {
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return absl::NotFoundError("no such session");
  MUSTER_ASSIGN_OR_RETURN(MemberInfo * info, membership_.Live(it->second.member));
  membership_.Seen(info, now);
  if (progress.step >= 0) info->step = progress.step;
  if (progress.samples > 0) info->samples = progress.samples;
  if (progress.memory.total() > 0) info->memory = progress.memory;
  info->progress_at = now - progress.age;
  info->stalled_since = progress.stalled > absl::ZeroDuration()
                            ? info->progress_at - progress.stalled
                            : absl::InfiniteFuture();
  info->working = progress.working;
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> Coordinator::Heartbeat(uint64_t session, MemberProgress progress) {
  absl::MutexLock lock(&mu_);
  MUSTER_RETURN_IF_ERROR(CheckServing());
  MUSTER_RETURN_IF_ERROR(Beat(session, progress, clock_->Now()));
  return announced_generation_.load();
}

absl::StatusOr<uint64_t> Coordinator::Heartbeats(const std::vector<uint64_t>& sessions,
                                                 const std::vector<MemberProgress>& progress,
                                                 std::vector<bool>* ok) {
  absl::MutexLock lock(&mu_);
  ok->assign(sessions.size(), false);
  MUSTER_RETURN_IF_ERROR(CheckServing());
  const absl::Time now = clock_->Now();
  for (size_t i = 0; i < sessions.size(); ++i) {
    (*ok)[i] = Beat(sessions[i], progress[i], now).ok();
  }
  return announced_generation_.load();
}

void Coordinator::SessionClosed(uint64_t session, const std::string& why) {
  Decision decision(&mu_, durable_);
  Actions& actions = decision.actions();
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return;
  const MemberKey key = it->second.member;
  sessions_.erase(it);
  if (gen_.phase() == GenerationPhase::kShuttingDown) return;
  MemberInfo* info = membership_.Find(key.id);
  if (info == nullptr || info->key != key || info->session != session) return;
  info->session = 0;
  if (!IsAlive(info->state)) return;
  // While this coordinator holds through a silence of its own, or is
  // excused after one, a stream that ends is most likely its member giving
  // up on that same silence to reconnect: the member is left to the
  // heartbeat scan, which fails it only if it stays away past the hold.
  if (ExcusedLocked(clock_->Now())) {
    MUSTER_LOG(INFO) << "session of " << key.id << " closed (" << why
                     << ") while no member was heard: it may reconnect";
    return;
  }
  FailMember(info, absl::StrCat("session closed: ", why), &actions);
}

void Coordinator::SessionLost(uint64_t session) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return;
  const MemberKey key = it->second.member;
  sessions_.erase(it);
  MemberInfo* info = membership_.Find(key.id);
  if (info != nullptr && info->key == key && info->session == session) info->session = 0;
}

absl::Status Coordinator::Leave(const MemberKey& key, LeaveReason reason, int64_t step) {
  Decision decision(&mu_, durable_);
  Actions& actions = decision.actions();
  MUSTER_ASSIGN_OR_RETURN(MemberInfo * info, membership_.Live(key));
  if (step >= 0) info->step = step;
  const bool in_live_world = gen_.world_live() && gen_.world().RankOf(key.id) >= 0 &&
                             info->state == MemberState::kActive;
  DropWaiters(key.id, absl::AbortedError("the member left"), &actions);
  if (reason == LeaveReason::kFinished) {
    info->state = MemberState::kFinished;
    any_finished_ = true;
    info->reason = "finished";
    Record("finish", absl::StrCat(key.id, " finished at step ", info->step));
    FinishIfDone(&actions);
    return absl::OkStatus();
  }
  if (reason == LeaveReason::kStopped) {
    info->state = MemberState::kLeft;
    info->stopped = true;
    any_stopped_ = true;
    info->reason = "stopped with the job";
    Record("stop", absl::StrCat(key.id, " stopped with the job at step ", info->step));
    ForgetIfStopped(&actions);
    return absl::OkStatus();
  }
  info->state = MemberState::kLeft;
  info->reason = "left";
  Record("leave", absl::StrCat(key.id, " left at step ", info->step));
  if (in_live_world && gen_.phase() != GenerationPhase::kFinished) {
    Evaluate(/*urgent=*/true, /*abort=*/false, absl::StrCat("member ", key.id, " left"),
             &actions);
  }
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> Coordinator::Drain(const std::string& node) {
  Decision decision(&mu_, durable_);
  Actions& actions = decision.actions();
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

}  // namespace muster
