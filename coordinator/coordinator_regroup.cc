// Coordinator: rendezvous and regrouping — who is in the next world, when it
// forms, and how members arrive in it. The transitions of the generation's
// lifecycle (gen_, generation_state.h) are taken here and in Leave, Load,
// Tick and StopServing; those of the regroup (regroup_, regroup_state.h)
// here.
#include <algorithm>
#include <memory>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "coordinator/coordinator.h"

namespace muster {

void Coordinator::Rendezvous(const MemberKey& key, uint64_t after_generation, int64_t step,
                             absl::Duration timeout, RendezvousCallback done,
                             bool takes_delta) {
  Decision decision(&mu_, durable_);
  Actions& actions = decision.actions();
  RendezvousLocked(
      RendezvousCall{key, after_generation, step, timeout, std::move(done), takes_delta},
      &actions);
}

void Coordinator::RendezvousAll(std::vector<RendezvousCall> calls) {
  Decision decision(&mu_, durable_);
  Actions& actions = decision.actions();
  for (RendezvousCall& call : calls) RendezvousLocked(std::move(call), &actions);
}

void Coordinator::RendezvousLocked(RendezvousCall call, Actions* actions) {
  const MemberKey& key = call.key;
  const uint64_t after_generation = call.after_generation;
  const int64_t step = call.step;
  const absl::Duration timeout = call.timeout;
  RendezvousCallback done = std::move(call.done);
  const bool takes_delta = call.takes_delta;
  absl::Status s = CheckServing();
  absl::StatusOr<MemberInfo*> live = LiveMember(key);
  if (s.ok()) s = live.status();
  if (s.ok() && gen_.phase() == GenerationPhase::kFinished) {
    s = absl::FailedPreconditionError("the job has finished");
  }
  if (s.ok() && (*live)->state == MemberState::kDraining) {
    s = absl::FailedPreconditionError(
        absl::StrCat("member ", key.id, " is drained; it must leave"));
  }
  if (s.ok() && after_generation > gen_.generation()) {
    // Newer than the counter: the coordinator lost its state (taken without
    // a live world, up to GenerationState::kMaxAdoptedGeneration; refused
    // otherwise).
    s = gen_.Adopted(after_generation);
    if (s.ok()) {
      // Keep generation numbers increasing across a restart too: the
      // adopted number is stored (as a world without members, which a
      // restart starts from without recovering).
      World adopted;
      adopted.generation = gen_.generation();
      persister_.SaveWorld(std::make_shared<const World>(std::move(adopted)));
      actions->Add([this, g = gen_.generation()] { Announce(g); });
    }
  }
  if (s.ok() && step < 0) {
    s = absl::InvalidArgumentError(absl::StrCat("step is negative (", step, ")"));
  }
  if (!s.ok()) {
    actions->Add([done = std::move(done), s] { done(s); });
    return;
  }
  MemberInfo* info = *live;
  info->step = step;
  const absl::Duration wait = std::min(CapWait(timeout), options_.rules.join_timeout);
  const World& world = gen_.world();
  const int rank = world.RankOf(key.id, info->seat);
  const bool in_newer_world = gen_.world_live() && world.generation > after_generation &&
                              rank >= 0 &&
                              world.members[rank].member.incarnation == key.incarnation;
  if (in_newer_world && gen_.complete()) {
    RendezvousResult result =
        regroup_.ResultFor(key, gen_.Published(), static_cast<uint32_t>(rank), takes_delta);
    actions->Add([done = std::move(done), result] { done(result); });
    return;
  }
  regroup_.waiters().Add(RendezvousWaiter{key, after_generation, step, clock_->Now() + wait,
                                          std::move(done), takes_delta,
                                          in_newer_world ? rank : -1});
  if (in_newer_world) {
    if (Arrive(static_cast<uint32_t>(rank), step)) WorldCompleted(actions);
    return;
  }
  if (info->state != MemberState::kActive) info->state = MemberState::kWaiting;
  if (StillWaiting()) return;
  Evaluate(/*urgent=*/false, /*abort=*/false,
           absl::StrCat("member ", key.id, " is waiting to join"), actions);
}

bool Coordinator::StillWaiting() {
  // Without a live world every candidate is a waiter (or renews its wait
  // within kRenewGrace, and its renewal evaluates again), so the waiters
  // bound the candidates. While they cannot reach min_members, or cannot fill the
  // world before a last call already under way ends, one more waiter
  // changes no decision: skip the full evaluation, which is linear in the
  // members (N arrivals would cost N^2). Tick evaluates when the last call
  // ends.
  if (gen_.phase() != GenerationPhase::kNoWorld) return false;
  const size_t bound = regroup_.waiters().size();
  if (bound < options_.rules.min_members) return true;
  const std::optional<absl::Time> last_call = regroup_.last_call_ends();
  return bound < options_.rules.max_members && last_call.has_value() &&
         clock_->Now() < *last_call;
}

std::vector<Candidate> Coordinator::Candidates(std::vector<MemberInfo*>* infos) {
  const absl::flat_hash_set<absl::string_view> waiting = regroup_.waiters().MemberIds();
  std::vector<Candidate> out;
  out.reserve(membership_.size());
  infos->clear();
  infos->reserve(membership_.size());
  const bool live = gen_.world_live();
  const bool holds = !holds_.empty();
  const absl::Time now = clock_->Now();
  membership_.ForEach([&](MemberInfo& info) {
    mu_.AssertHeld();  // ForEach calls back at once, under Candidates' lock
    const std::string& id = info.key.id;
    // A node held out after a lost link waits, its members alive.
    if (holds && holds_.Held(info.node, now)) return;
    // Only a world's members are made active (Form, ReattachFromWorld).
    int rank = -1;
    if (live && info.state == MemberState::kActive) {
      rank = gen_.world().RankOf(id, info.seat);
    }
    const bool incumbent = rank >= 0;
    // Waiting: a Rendezvous call of its is pending, or its last one ran out
    // a moment ago and it is renewing it (a spare polls in slices): a
    // failure that falls between two of a spare's calls still gives the
    // spare the place. Seated, it arrives with its next call.
    const bool waiting_now =
        (info.state == MemberState::kWaiting || info.state == MemberState::kActive) &&
        (waiting.count(id) > 0 ||
         (info.state == MemberState::kWaiting && now - info.wait_ended <= kRenewGrace));
    if (!incumbent && !waiting_now) return;
    Candidate c;
    c.member = info.key;
    c.node = info.node;
    c.local_rank = info.local_rank;
    c.state_address = info.state_address;
    c.step = info.step;
    c.incumbent = incumbent;
    c.current_rank = rank;
    c.spare = info.spare;
    c.joined = info.joined;
    out.push_back(std::move(c));
    infos->push_back(&info);
  });
  return out;
}

void Coordinator::Evaluate(bool urgent, bool abort, const std::string& reason,
                           Actions* actions) {
  switch (gen_.phase()) {
    case GenerationPhase::kShuttingDown:
    case GenerationPhase::kFinished:
      return;
    case GenerationPhase::kRecovering:
      CheckRecovered(actions);
      return;
    case GenerationPhase::kNoWorld:
    case GenerationPhase::kForming:
    case GenerationPhase::kRunning:
      break;
  }
  const World& world = gen_.world();
  const bool live = gen_.world_live();
  // A world that began finishing neither pauses nor regroups: its other
  // members trained the same last step and finish too (a member that fails
  // now has nothing left to train), and members waiting for a world (a
  // restart, a spare) have no step left. It ends when none of it trains.
  if (live && WorldFinishing()) {
    FinishIfDone(actions);
    return;
  }
  // The same for a world that began stopping: its other members stop at
  // the same step, and none of them is to be replaced.
  if (live && WorldStopping()) {
    ForgetIfStopped(actions);
    return;
  }
  std::vector<MemberInfo*> infos;
  std::vector<Candidate> candidates = Candidates(&infos);
  const uint32_t n = static_cast<uint32_t>(candidates.size());
  // Changed: the world that would form now is not the live one. Members
  // waiting beyond max_members (spares) change nothing while every incumbent
  // is alive: they take a place when one frees up.
  // AssignWorld puts incumbents first, so the world is unchanged exactly
  // when every member of it is an incumbent candidate of the same
  // incarnation and the usable size is its size.
  bool changed = !live || UsableWorldSize(n, options_.rules) != world.size();
  uint32_t incumbents = 0;
  uint32_t preferred = 0;
  for (const Candidate& c : candidates) preferred += c.incumbent || !c.spare ? 1 : 0;
  for (size_t i = 0; !changed && i < candidates.size(); ++i) {
    if (!candidates[i].incumbent) continue;
    const int rank = candidates[i].current_rank;
    changed = world.members[rank].member.incarnation != candidates[i].member.incarnation;
    ++incumbents;
  }
  changed = changed || incumbents != world.size();
  // The job's first world: none formed before (a paused world is kept).
  const bool first_world = !live && world.members.empty();
  switch (regroup_.Decide(n, preferred, changed, urgent, clock_->Now(), first_world)) {
    case FormDecision::kNothing:
    case FormDecision::kWait:
      return;
    case FormDecision::kNotEnough:
      if (live) Pause(reason, actions);
      return;
    case FormDecision::kNow:
      Form(std::move(candidates), std::move(infos), UsableWorldSize(n, options_.rules),
           abort || !live, reason, actions);
      return;
  }
}

bool Coordinator::AnyOfTheWorld(absl::FunctionRef<bool(const MemberInfo&)> what) const {
  for (const Assignment& a : gen_.world().members) {
    const MemberInfo* m = membership_.Find(a.member.id);
    if (m != nullptr && m->key == a.member && what(*m)) return true;
  }
  return false;
}

bool Coordinator::WorldFinishing() const {
  return any_finished_ &&
         AnyOfTheWorld([](const MemberInfo& m) { return m.state == MemberState::kFinished; });
}

bool Coordinator::WorldStopping() const {
  return any_stopped_ && AnyOfTheWorld([](const MemberInfo& m) { return m.stopped; });
}

void Coordinator::ForgetIfStopped(Actions* actions) {
  if (!gen_.world_live() || gen_.phase() == GenerationPhase::kFinished ||
      gen_.phase() == GenerationPhase::kShuttingDown) {
    return;
  }
  // As in FinishIfDone, a member that only waits for the world (a joiner
  // of a world formed at the step the others stopped at) trains nothing:
  // it waits on, as in a paused job.
  const absl::flat_hash_set<absl::string_view> waiting = regroup_.waiters().MemberIds();
  if (AnyOfTheWorld([&](const MemberInfo& m) {
        return IsAlive(m.state) && waiting.count(m.key.id) == 0;
      })) {
    return;
  }
  const std::shared_ptr<const World> stopped = gen_.Published();
  const uint64_t generation = gen_.generation();
  if (!Accepted(gen_.Stopped())) return;
  regroup_.Paused(clock_->Now());  // its arrival deadline dropped; --pause-timeout as a pause's
  for (const Assignment& a : stopped->members) {
    MemberInfo* m = membership_.Find(a.member.id);
    if (m != nullptr && m->key == a.member && m->state == MemberState::kActive) {
      m->state = MemberState::kWaiting;
    }
  }
  const std::string reason = absl::StrCat("the job stopped at generation ", generation);
  ResetGenerationState(generation, reason, actions);
  Record("stopped", absl::StrCat(reason, "; the next world forms as its first"));
  // A restart on this state dir (the requeued job) must not wait for the
  // stopped members: as a finished job's, the generation is kept and the
  // world forgotten.
  persister_.SaveWorld(gen_.Published());
}

void Coordinator::FinishIfDone(Actions* actions) {
  // Done when no member of the world trains: the ones still alive that
  // wait for a world (a restart that joined as the job ran its last steps,
  // say) have no step left to train, and a world that waits for them would
  // never form.
  const absl::flat_hash_set<absl::string_view> waiting = regroup_.waiters().MemberIds();
  bool all_done = gen_.world_live() && gen_.phase() != GenerationPhase::kShuttingDown;
  for (const Assignment& a : gen_.world().members) {
    const MemberInfo* m = membership_.Find(a.member.id);
    if (m != nullptr && IsAlive(m->state) && waiting.count(a.member.id) == 0) {
      all_done = false;
    }
  }
  if (!all_done || !Accepted(gen_.Finished())) return;
  Record("finished", absl::StrCat("job finished at generation ", gen_.generation()));
  // Members still waiting for a world (one that rejoined after a
  // partition, say) will not get one: tell them now.
  for (RendezvousWaiter& w : regroup_.waiters().TakeAll()) {
    actions->Add([done = std::move(w.done)] {
      done(absl::FailedPreconditionError("the job has finished"));
    });
  }
  // A restart on this state dir (a requeued job) must not wait for the
  // finished members: keep the generation counter, forget the world.
  World done;
  done.generation = gen_.generation();
  persister_.SaveWorld(std::make_shared<const World>(std::move(done)));
}

void Coordinator::ResetGenerationState(uint64_t generation, const std::string& reason,
                                       Actions* actions) {
  kv_.Reset(absl::StrCat("generation ", generation, " is over: ", reason), actions);
  barriers_.Reset(absl::StrCat("generation ", generation, " is over: ", reason), actions);
}

void Coordinator::Pause(const std::string& reason, Actions* actions) {
  if (!Accepted(gen_.Paused())) return;
  regroup_.Paused(clock_->Now());
  // The world is written again, marked paused, so that the pause notices,
  // like a regroup's, go out only after a write that the lease fences: a
  // coordinator whose lease was taken over while it was frozen, woken, must
  // not tell the new holder's members that their world paused. A restart
  // on it then waits for none of its members (GenerationState::Loaded).
  auto paused = std::make_shared<World>(gen_.world());
  paused->paused = true;
  persister_.SaveWorld(std::move(paused));
  ResetGenerationState(gen_.world().generation, reason, actions);
  absl::Status s = catalog_.AbortBefore(gen_.generation() + 1, reason);
  if (!s.ok()) MUSTER_LOG(WARNING) << "aborting pending checkpoints: " << s;
  MemberEvent event;
  event.generation = gen_.generation();
  event.abort = true;
  event.paused = true;
  event.reason = absl::StrCat(reason, "; fewer than min_members (",
                              options_.rules.min_members, ") remain, waiting for more");
  for (const Assignment& a : gen_.world().members) {
    MemberInfo* info = membership_.Find(a.member.id);
    if (info == nullptr || info->key != a.member || !IsAlive(info->state)) continue;
    if (info->state == MemberState::kActive) info->state = MemberState::kWaiting;
    PushTo(a.member.id, event, actions);
  }
  Record("pause", event.reason);
}

void Coordinator::Form(std::vector<Candidate> candidates, std::vector<MemberInfo*> infos,
                       uint32_t size, bool abort, const std::string& reason,
                       Actions* actions) {
  const std::shared_ptr<const World> before = gen_.Published();  // not a copy
  const World& old = *before;
  const bool old_live = gen_.world_live();
  // The incumbents' records by their old rank, read before AssignWorld takes
  // the candidates: the pushes below then need no lookup by id.
  std::vector<MemberInfo*> old_infos(old_live ? old.size() : 0, nullptr);
  std::vector<bool> incumbent(candidates.size(), false);
  for (size_t i = 0; old_live && i < candidates.size(); ++i) {
    if (candidates[i].current_rank < 0) continue;
    old_infos[candidates[i].current_rank] = infos[i];
    incumbent[i] = true;
  }
  std::vector<uint32_t> taken;
  if (!Accepted(gen_.Formed(
          AssignWorld(gen_.generation() + 1, std::move(candidates), size, &taken)))) {
    return;
  }
  regroup_.Formed(clock_->Now());
  // Held, not referred to: when the waiters below complete the world, it is
  // copied first if the persister still holds it (GenerationState), and the
  // persister may let go of this one at any time after.
  const std::shared_ptr<const World> formed = gen_.Published();
  const World& world = *formed;
  const uint64_t generation = gen_.generation();
  // Durable before anyone hears of it: every caller's actions wait for it.
  persister_.SaveWorld(formed);
  actions->Add([this, generation] { Announce(generation); });
  ResetGenerationState(old.generation, reason, actions);
  ++counters_.regroups;
  if (abort) {
    absl::Status s = catalog_.AbortBefore(generation, reason);
    if (!s.ok()) MUSTER_LOG(WARNING) << "aborting pending checkpoints: " << s;
  }
  TakeSeats(infos, taken, old_live);
  if (old_live) PushRegroup(old, old_infos, generation, abort, reason, actions);
  // Members already waiting arrive now, newest call first: a member that
  // waits twice arrives with the step of its later call. Once the world is
  // complete, every waiter left for it is such an earlier call.
  bool complete = false;
  for (const auto& [w, rank] : regroup_.waiters().AnsweredBy(world)) {
    if (complete) break;
    if (!gen_.has_arrived_at(rank)) complete = Arrive(rank, w->step);
  }
  // How the old world's members are told: none where no world was live
  // (the first, or one after a pause).
  Record("regroup", absl::StrCat("generation ", generation, ": ", world.size(), " members on ",
                                 world.node_count, " nodes (", reason,
                                 !old_live ? ""
                                 : abort   ? ", abort"
                                           : ", at step boundary",
                                 ")"));
  if (old_live && old.size() >= options_.rules.max_members) {
    // The old world was full: its newcomers waited as spares.
    for (const Assignment& a : world.members) {
      if (incumbent[taken[a.rank]] || old.RankOf(a.member.id) >= 0) continue;
      Record("spare", absl::StrCat(a.member.id, " takes rank ", a.rank, " in generation ",
                                   generation));
    }
  }
  if (complete) WorldCompleted(actions);
}

void Coordinator::TakeSeats(const std::vector<MemberInfo*>& infos,
                            const std::vector<uint32_t>& taken, bool old_live) {
  if (old_live) {
    // The active members are the old world's, each an incumbent candidate.
    std::vector<bool> seated(infos.size(), false);
    for (const uint32_t i : taken) seated[i] = true;
    for (size_t i = 0; i < infos.size(); ++i) {
      if (!seated[i] && infos[i]->state == MemberState::kActive) {
        infos[i]->state = MemberState::kWaiting;
      }
    }
  } else {
    membership_.ForEach([](MemberInfo& info) {
      if (info.state == MemberState::kActive) info.state = MemberState::kWaiting;
    });
  }
  for (uint32_t rank = 0; rank < taken.size(); ++rank) {
    infos[taken[rank]]->state = MemberState::kActive;
    infos[taken[rank]]->seat = rank;
  }
}

void Coordinator::PushRegroup(const World& old, const std::vector<MemberInfo*>& old_infos,
                              uint64_t generation, bool abort, const std::string& reason,
                              Actions* actions) {
  // One event for the members that stay and one for those drained (told to
  // leave), each shared by every push; the pushes go out as one action, in
  // the old world's order (a node's members one after the other).
  std::shared_ptr<const MemberEvent> events[2];
  for (const bool leave : {false, true}) {
    MemberEvent event;
    event.generation = generation;
    event.abort = abort;
    event.leave = leave;
    event.reason = reason;
    events[leave] = std::make_shared<const MemberEvent>(std::move(event));
  }
  std::vector<std::pair<std::shared_ptr<SessionSink>, std::shared_ptr<const MemberEvent>>> pushes;
  pushes.reserve(old.size());
  for (uint32_t rank = 0; rank < old.size(); ++rank) {
    const MemberInfo* info = old_infos[rank];
    if (info == nullptr) {  // not an incumbent: drained, failed or gone
      info = membership_.Find(old.members[rank].member.id);
      if (info == nullptr || info->key != old.members[rank].member) continue;
    }
    if (!IsAlive(info->state)) continue;
    if (std::shared_ptr<SessionSink> sink = SinkOf(*info)) {
      pushes.emplace_back(std::move(sink), events[info->state == MemberState::kDraining]);
    }
  }
  actions->Add([pushes = std::move(pushes)] {
    for (const auto& [sink, event] : pushes) sink->PushShared(event);
  });
}

bool Coordinator::Arrive(uint32_t rank, int64_t step) {
  absl::StatusOr<bool> complete = gen_.ArrivedAt(rank, step);
  return Accepted(complete.status()) && *complete;
}

void Coordinator::WorldCompleted(Actions* actions) {
  std::shared_ptr<const World> shared = gen_.Published();
  absl::StatusOr<RegroupCompletion> done = regroup_.Completed(shared, clock_->Now());
  if (!Accepted(done.status())) return;
  persister_.SaveWorld(shared);
  const World& world = *shared;
  // How long the regroup took: from the decision to form to the last
  // member's arrival.
  Record("complete", absl::StrCat("generation ", world.generation, ": all ", world.size(),
                                  " members in ",
                                  absl::FormatDuration(absl::Trunc(done->took,
                                                                   absl::Milliseconds(1))),
                                  " after it formed"));
  CoordinatorCounters::Keep(&counters_.regroup_seconds, absl::ToDoubleSeconds(done->took));
  ++counters_.regroups_timed;
  // The answers go out as one action (one allocation, not one per member).
  auto answers = std::make_shared<RendezvousAnswers>(std::move(done->answers));
  actions->Add([answers] {
    for (auto& [callback, result] : *answers) callback(result);
  });
}

void Coordinator::FailMember(MemberInfo* info, const std::string& reason, Actions* actions) {
  const std::string id = info->key.id;
  if (Fence(info, reason, /*hung=*/false, actions)) {
    Evaluate(/*urgent=*/true, /*abort=*/true,
             absl::StrCat("member ", id, " failed: ", reason), actions);
  }
}

bool Coordinator::Fence(MemberInfo* info, const std::string& reason, bool hung,
                        Actions* actions) {
  const std::string id = info->key.id;
  const World& world = gen_.world();
  const int rank = world.RankOf(id);
  const bool in_world = gen_.world_live() && rank >= 0 &&
                        world.members[rank].member.incarnation == info->key.incarnation &&
                        info->state == MemberState::kActive;
  info->state = MemberState::kFailed;
  info->reason = reason;
  ++counters_.failures;
  Record("fail", absl::StrCat(id, " incarnation ", info->key.incarnation, ": ", reason));
  if (info->session != 0) {
    auto it = sessions_.find(info->session);
    if (it != sessions_.end()) {
      actions->Add([sink = it->second.sink, reason, hung] {
        const absl::Status status = absl::AbortedError(
            absl::StrCat("declared failed (", reason, "); rejoin with a new incarnation"));
        if (hung) {
          sink->CloseHung(status);
        } else {
          sink->Close(status);
        }
      });
      sessions_.erase(it);
    }
    info->session = 0;
  }
  DropWaiters(id, absl::AbortedError(absl::StrCat("member declared failed: ", reason)),
              actions);
  return in_world;
}

absl::Status Coordinator::ReportBroken(const MemberKey& key, const BrokenWorldReport& report) {
  Decision decision(&mu_, durable_);
  Actions& actions = decision.actions();
  MUSTER_RETURN_IF_ERROR(CheckServing());
  MUSTER_ASSIGN_OR_RETURN(MemberInfo * info, LiveMember(key));
  const uint64_t g = report.generation;
  if (g > gen_.generation()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "generation ", g, " was never formed here (current: ", gen_.generation(), ")"));
  }
  if (g < gen_.world().generation) {
    return absl::AbortedError(absl::StrCat("generation ", g, " was already regrouped: generation ",
                                           gen_.world().generation, " is current"));
  }
  // A stored world the coordinator is waiting for after a restart: one of
  // its members says it broke, so waiting for the others to come back to
  // it is pointless.
  if (gen_.phase() == GenerationPhase::kRecovering && !Accepted(gen_.Recovered())) {
    return absl::InternalError("the recovering world could not be ended");
  }
  // Paused, finished, or still forming: no live world to regroup.
  if (gen_.phase() != GenerationPhase::kRunning) return absl::OkStatus();
  const World& world = gen_.world();
  const int rank = world.RankOf(key.id);
  if (rank < 0 || world.members[rank].member.incarnation != key.incarnation ||
      info->state != MemberState::kActive) {
    return absl::FailedPreconditionError(
        absl::StrCat("member ", key.id, " is not in generation ", g));
  }
  const std::string why = absl::StrCat("rank ", rank, " (", key.id,
                                       ") reports that generation ", g, " broke: ", report.reason);
  Record("broken", why);
  const bool left_out = !report.unreachable.empty() && LeaveOutUnreachable(world, rank, report);
  absl::Duration window =
      report.deadline > absl::ZeroDuration() ? report.deadline : options_.regroup_arrival;
  window = std::min(std::max(window, absl::Seconds(1)),
                    std::max(options_.rules.join_timeout, absl::Seconds(1)));
  FenceStuck(world, window, &actions);
  std::vector<MemberInfo*> infos;
  std::vector<Candidate> candidates = Candidates(&infos);
  const uint32_t n = static_cast<uint32_t>(candidates.size());
  if (left_out && UsableWorldSize(n, options_.rules) == 0) {
    // Too few members reach each other: wait for the holds to end.
    Pause(why, &actions);
    return absl::OkStatus();
  }
  Form(std::move(candidates), std::move(infos), UsableWorldSize(n, options_.rules),
       /*abort=*/true, why, &actions);
  if (gen_.phase() == GenerationPhase::kForming && gen_.generation() == g + 1) {
    Accepted(regroup_.ArriveWithin(window));
  }
  return absl::OkStatus();
}

bool Coordinator::LeaveOutUnreachable(const World& world, int reporter,
                                      const BrokenWorldReport& report) {
  const std::vector<std::string> nodes =
      holds_.LeaveOut(world, static_cast<uint32_t>(reporter), report.unreachable);
  const absl::Time now = clock_->Now();
  for (const std::string& node : nodes) {
    const absl::Duration hold = holds_.Hold(node, now);
    // Out of the world that forms next, alive: they wait for the hold.
    for (const Assignment& a : world.members) {
      if (a.node != node) continue;
      MemberInfo* info = membership_.Find(a.member.id);
      if (info != nullptr && info->key == a.member && info->state == MemberState::kActive) {
        info->state = MemberState::kWaiting;
      }
    }
    Record("partition",
           absl::StrCat("node ", node, " left out for ", absl::FormatDuration(hold), ": rank ",
                        reporter, " (", world.members[reporter].member.id,
                        ") cannot reach rank", report.unreachable.size() > 1 ? "s " : " ",
                        absl::StrJoin(report.unreachable, ", "), " of generation ",
                        world.generation, " over the network; its members wait and join "
                        "again when the hold ends"));
  }
  return !nodes.empty();
}

void Coordinator::FenceStuck(const World& world, absl::Duration deadline, Actions* actions) {
  // Its peers started waiting about `deadline` ago. A member stuck since
  // before then has stalled for at least that long, and says so in
  // heartbeats sent while they waited; a peer's heartbeat from before it
  // began to wait can say "stalled" too (it was computing), so only
  // heartbeats from the second half of the wait count. Without one, the
  // arrival window decides.
  const absl::Time now = clock_->Now();
  for (const Assignment& a : world.members) {
    MemberInfo* info = membership_.Find(a.member.id);
    if (info == nullptr || info->key != a.member || info->state != MemberState::kActive ||
        info->progress_at < now - deadline / 2 || info->stalled_since > now - deadline * 0.9) {
      continue;
    }
    const std::string stalled = absl::StrCat(
        absl::FormatDuration(absl::Trunc(now - info->stalled_since, absl::Milliseconds(100))),
        " (after step ", info->step, ")");
    if (InOwnWork(*info, now, deadline)) {
      Record("waiting", absl::StrCat("rank ", a.rank, " (", info->key.id,
                                     ") is in the program's own work between muster's calls "
                                     "for ",
                                     stalled,
                                     ", its training thread running: the regroup "
                                     "waits for it up to the coordinator's --own-work-limit (",
                                     absl::FormatDuration(options_.own_work_limit), ")"));
      continue;
    }
    Fence(info,
          absl::StrCat("hung: its training thread made no progress and did not run for ", stalled,
                       " while its peers' collective deadline (", absl::FormatDuration(deadline),
                       ") passed waiting for it; its agent restarts it"),
          /*hung=*/true, actions);
  }
}

bool Coordinator::InOwnWork(const MemberInfo& info, absl::Time now, absl::Duration window) const {
  // Stalled: outside muster's calls (a thread that spins inside one, say
  // on a hung device, is not the program's work). Its newest heartbeat is
  // recent: from the second half of the window, or one heartbeat timeout
  // (a member with none newer fails anyway), whichever is longer, for the
  // period of heartbeats may exceed a short window.
  return info.working && info.stalled_since != absl::InfiniteFuture() &&
         info.progress_at >= now - std::max(window / 2, options_.heartbeat_timeout) &&
         now - info.stalled_since < options_.own_work_limit;
}

void Coordinator::FenceLateArrivals(Actions* actions) {
  const absl::Time now = clock_->Now();
  const std::shared_ptr<const World> shared = gen_.Published();
  const World& world = *shared;
  std::vector<MemberInfo*> late;
  bool working = false;
  for (const Assignment& a : world.members) {
    if (gen_.has_arrived_at(a.rank)) continue;
    MemberInfo* info = membership_.Find(a.member.id);
    if (info == nullptr || info->key != a.member || !IsAlive(info->state)) continue;
    if (InOwnWork(*info, now, regroup_.arrival_window())) {
      working = true;
    } else {
      late.push_back(info);
    }
  }
  // Only members in their own work are late: they come when it ends.
  if (late.empty() && working && Accepted(regroup_.ArrivalExtended(now))) return;
  const absl::StatusOr<absl::Duration> window = regroup_.ArrivalMissed();
  if (!Accepted(window.status()) || late.empty()) return;
  std::vector<std::string> ids;
  for (MemberInfo* info : late) {
    ids.push_back(info->key.id);
    Fence(info,
          absl::StrCat("hung: did not come to the regroup of generation ", world.generation,
                       " within ", absl::FormatDuration(*window), " while its session lived",
                       info->working && info->progress_at >= now - *window / 2
                           ? absl::StrCat(", in the program's own work past the "
                                          "coordinator's --own-work-limit (",
                                          absl::FormatDuration(options_.own_work_limit), ")")
                           : "",
                       "; its agent restarts it"),
          /*hung=*/true, actions);
  }
  Evaluate(/*urgent=*/true, /*abort=*/true,
           absl::StrCat("hung member", ids.size() > 1 ? "s " : " ", absl::StrJoin(ids, ", "),
                        " left out"),
           actions);
}

void Coordinator::DropWaiters(const std::string& id, const absl::Status& status,
                              Actions* actions) {
  for (RendezvousWaiter& w : regroup_.waiters().TakeMember(id)) {
    actions->Add([done = std::move(w.done), status] { done(status); });
  }
}

void Coordinator::CheckRecovered(Actions* actions) {
  // Each stored member is back (same incarnation, session open), replaced (a
  // new incarnation of its id joined: the old process is gone), or pending.
  bool all_back = true;
  for (const Assignment& a : gen_.world().members) {
    const MemberInfo* info = membership_.Find(a.member.id);
    if (info == nullptr) return;  // pending
    if (info->key == a.member && IsAlive(info->state) && info->session != 0) continue;
    if (info->key != a.member) {
      all_back = false;
      continue;
    }
    return;  // same incarnation, no session yet
  }
  if (!Accepted(gen_.Recovered())) return;
  if (all_back) {
    Record("recovered", absl::StrCat("all ", gen_.world().size(), " members of generation ",
                                     gen_.generation(), " are back; training continues"));
    return;
  }
  Evaluate(/*urgent=*/true, /*abort=*/true,
           "members restarted while the coordinator was down", actions);
}

}  // namespace muster
