#include "trainer/elastic/elastic_world.h"

#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "trainer/client/coordinator_store.h"
#include "trainer/elastic/build_watchdog.h"

namespace muster {
namespace {

// Entering a world can fail because the world moved on while its
// communicator was being built (another join, a peer that died): then the
// next world is the one to enter.
bool WorldMovedOn(const absl::Status& s) {
  return absl::IsAborted(s) || absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s) ||
         absl::IsCancelled(s);
}

// The first setting (a "name=value" line) of `mine` that `theirs` holds
// otherwise, said for people; empty when they are the same.
std::string FirstDifference(const std::string& mine, const std::string& theirs) {
  std::map<std::string, std::string, std::less<>> other;
  for (absl::string_view line : absl::StrSplit(theirs, '\n', absl::SkipEmpty())) {
    const std::pair<std::string, std::string> kv = absl::StrSplit(line, absl::MaxSplits('=', 1));
    other.emplace(kv.first, kv.second);
  }
  for (absl::string_view line : absl::StrSplit(mine, '\n', absl::SkipEmpty())) {
    const std::pair<std::string, std::string> kv = absl::StrSplit(line, absl::MaxSplits('=', 1));
    const auto it = other.find(kv.first);
    if (it == other.end()) return absl::StrCat(kv.first, " is ", kv.second, " here, unset there");
    if (it->second != kv.second) {
      return absl::StrCat(kv.first, " is ", kv.second, " here, ", it->second, " there");
    }
    other.erase(it);
  }
  if (other.empty()) return "";
  return absl::StrCat(other.begin()->first, " is unset here, ", other.begin()->second, " there");
}

}  // namespace

absl::StatusOr<std::unique_ptr<ElasticWorld>> ElasticWorld::Connect(ElasticWorldOptions options) {
  if (options.clock == nullptr || options.client.clock != options.clock ||
      options.comm.clock != options.clock) {
    return absl::InvalidArgumentError(
        "ElasticWorldOptions::clock is required, and client.clock and comm.clock must be it");
  }
  std::unique_ptr<ElasticWorld> w(new ElasticWorld(std::move(options)));
  MUSTER_RETURN_IF_ERROR(w->Join(w->options_.client.incarnation));
  return w;
}

ElasticWorld::~ElasticWorld() { Detach(); }

absl::Status ElasticWorld::Join(uint64_t incarnation) {
  ClientOptions co = options_.client;
  co.incarnation = incarnation;
  co.progress = &progress_;
  MUSTER_ASSIGN_OR_RETURN(client_, CoordinatorClient::Create(co));
  MUSTER_RETURN_IF_ERROR(client_->Join(0, options_.clock->Now() + options_.join_timeout));
  return client_->StartSession([this](const SessionNotice& n) { OnNotice(n); });
}

void ElasticWorld::OnNotice(const SessionNotice& n) {
  if (n.kind == SessionNotice::Kind::kRegroup && n.leave) told_to_leave_ = true;
  if (n.kind == SessionNotice::Kind::kRegroup && !n.abort) return;
  MutexLock lock(&mu_);
  // Abort only the world the notice is about: a failure forms a newer
  // generation; a pause names the current one. A late notice about a world
  // this trainer already left behind changes nothing.
  const bool about_us = n.kind != SessionNotice::Kind::kRegroup ||
                        n.generation > live_generation_ ||
                        (n.paused && n.generation == live_generation_);
  if (!about_us) return;
  MUSTER_LOG(WARNING) << "coordinator: " << n.reason;
  if (live_comm_ != nullptr) live_comm_->Abort(absl::AbortedError(n.reason));
}

void ElasticWorld::Detach() {
  MutexLock lock(&mu_);
  live_comm_ = nullptr;
}

absl::Status ElasticWorld::AgreeOnSettings(absl::Time deadline) {
  if (options_.settings.empty()) return absl::OkStatus();
  const std::string key = "muster/settings";
  // The state source's (the member furthest ahead, whose state the world
  // takes): in a running job an incumbent, not a newcomer.
  if (world_.rank == world_.state_source_rank) {
    return store_->Set(key, options_.settings, deadline);
  }
  MUSTER_ASSIGN_OR_RETURN(const std::vector<std::string> values, store_->Wait({key}, deadline));
  const std::string difference = FirstDifference(options_.settings, values.front());
  if (difference.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "this trainer's options are not those of generation ", world_.generation,
      "'s state source, rank ", world_.state_source_rank, " (", difference,
      "): every trainer of a job must use the same values; this one leaves"));
}

absl::Status ElasticWorld::Enter(const EnterFn& enter, int64_t step) {
  store_ = NewCoordinatorStore(client_.get(), world_.generation);
  if (absl::Status s = AgreeOnSettings(options_.clock->Now() + options_.build_timeout);
      absl::IsInvalidArgument(s)) {
    // Before any collective: the others regroup without this member at
    // once, rather than break on collectives of other sizes.
    MUSTER_LOG(ERROR) << s.message();
    client_->Leave(Departure::kLeaving, step).IgnoreError();
    return s;
  } else if (!s.ok()) {
    return s;
  }
  std::unique_ptr<Communicator> comm;
  {
    // Gloo's connect can block past its timeout when a peer vanished in the
    // middle of it, and nothing can wake it. Rather than hang, this trainer
    // gives up as a process: its agent restarts it and it takes a live
    // peer's state (crash-only). Bound: the build's deadline, or 10 s after
    // a newer world is known; the deadline and the watchdog share a clock.
    Clock* const clock = options_.clock;
    const absl::Time deadline = clock->Now() + options_.build_timeout;
    BuildWatchdog watchdog(
        deadline + absl::Seconds(5),
        [this, generation = world_.generation] {
          return client_->latest_generation() > generation;
        },
        /*superseded_grace=*/absl::Seconds(10), clock);
    CommOptions comm_options = options_.comm;
    comm_options.gloo.observed_host = client_->observed_host();
    MUSTER_ASSIGN_OR_RETURN(
        comm, BuildCommunicator(world_, store_.get(), comm_options, deadline, &kept_));
  }
  {
    MutexLock lock(&mu_);
    comm_ = std::move(comm);
    live_comm_ = comm_.get();
    live_generation_ = world_.generation;
  }
  return enter(comm_.get(), world_);
}

absl::StatusOr<WorldInfo> ElasticWorld::AwaitWorld(uint64_t after, int64_t step, bool as_spare,
                                                    const BrokenWorld* broken) {
  const absl::Time give_up = options_.clock->Now() + options_.rendezvous_timeout;
  for (;;) {
    // Past give_up only a spare waits on, a full poll at a time.
    const absl::Time now = options_.clock->Now();
    const absl::Time slice = now < give_up ? std::min(give_up, now + options_.spare_poll)
                                           : now + options_.spare_poll;
    // Every renewal carries the report: after a failover it reaches the
    // coordinator that serves now (reports are idempotent per generation).
    absl::StatusOr<WorldInfo> w = client_->Rendezvous(after, step, slice, broken);
    if (!absl::IsDeadlineExceeded(w.status())) return w;
    if (options_.interrupted && options_.interrupted()) {
      return absl::CancelledError("a stop or leave signal while waiting for a world");
    }
    const bool spare = as_spare && client_->latest_generation() > 0;
    if (!spare && options_.clock->Now() >= give_up) return w;
  }
}

// The first world: while the job runs without a place for this member (a
// world exists: the heartbeats name its generation), keep waiting as a spare.
absl::StatusOr<WorldInfo> ElasticWorld::FirstWorld(int64_t step) {
  return AwaitWorld(0, step, /*as_spare=*/true);
}

void ElasticWorld::NoPlace(const std::string& why, int64_t step) {
  MUSTER_LOG(WARNING) << "no world for this trainer: " << why;
  told_to_leave_ = true;
  client_->Leave(Departure::kLeaving, step).IgnoreError();
  left_ = true;
}

absl::Status ElasticWorld::EnterFirst(int64_t step, const EnterFn& enter) {
  absl::StatusOr<WorldInfo> first = FirstWorld(step);
  if (absl::IsFailedPrecondition(first.status()) || absl::IsCancelled(first.status())) {
    NoPlace(std::string(first.status().message()), step);  // the job finished, or drained us
    return absl::OkStatus();
  }
  MUSTER_RETURN_IF_ERROR(first.status());
  world_ = *first;
  const absl::Status entered = Enter(enter, step);
  if (entered.ok() || !WorldMovedOn(entered)) return entered;
  const BrokenWorld broken = BrokenWorld::Because(
      std::string(entered.message()), options_.build_timeout, UnreachableRanks(entered));
  return Regroup(std::string(entered.message()), step, enter, &broken);
}

absl::StatusOr<WorldInfo> ElasticWorld::NextWorld(int64_t step, const BrokenWorld* broken) {
  absl::StatusOr<WorldInfo> next =
      AwaitWorld(world_.generation, step, /*as_spare=*/false, broken);
  if (absl::IsAborted(next.status())) {
    // This incarnation was declared failed (it hung past the heartbeat
    // timeout, e.g. SIGSTOP): rejoin as a new one; a live peer's state
    // replaces ours.
    MUSTER_LOG(WARNING) << "fenced (" << next.status().message()
                        << "); rejoining as a new incarnation";
    if (options_.before_rejoin) options_.before_rejoin();
    MUSTER_RETURN_IF_ERROR(Join(/*incarnation=*/0));
    next = AwaitWorld(0, step, /*as_spare=*/false);
  }
  return next;
}

absl::Status ElasticWorld::Regroup(const std::string& why, int64_t step, const EnterFn& enter,
                                   const BrokenWorld* broken) {
  const absl::Time start = options_.clock->Now();
  BrokenWorld failed_entry;
  // Whom the broken world's collectives could not reach, if anyone: the
  // coordinator leaves a side out rather than form the same world again.
  BrokenWorld probed;
  if (broken != nullptr && comm_ != nullptr) {
    probed = *broken;
    probed.unreachable = comm_->Unreachable();
    if (!probed.unreachable.empty()) {
      MUSTER_LOG(WARNING) << "cannot reach rank" << (probed.unreachable.size() > 1 ? "s " : " ")
                          << absl::StrJoin(probed.unreachable, ", ")
                          << " of generation " << world_.generation << " over the network";
      broken = &probed;
    }
  }
  for (;;) {
    Detach();
    // A node-local communicator no failure touched may go on (node_comm.h).
    kept_ = KeepNodeCommunicator(std::move(comm_), world_);
    store_.reset();
    absl::StatusOr<WorldInfo> next = NextWorld(step, broken);
    if (absl::IsFailedPrecondition(next.status()) || absl::IsCancelled(next.status())) {
      // Drained (the leave notice may still be on its way), the job is
      // over, or a stop or leave signal came while the job waited for
      // members (paused below its minimum): there is no world for this
      // trainer. Leave.
      NoPlace(std::string(next.status().message()), step);
      return absl::OkStatus();
    }
    if (!next.ok()) return next.status();
    world_ = *next;
    const absl::Status entered = Enter(enter, step);
    if (entered.ok()) break;
    if (!WorldMovedOn(entered)) return entered;
    MUSTER_LOG(WARNING) << "generation " << world_.generation << " did not start (" << entered
                        << "); joining the next one";
    // Maybe nobody else knows (a peer hung while the world was built).
    failed_entry = BrokenWorld::Because(
        absl::StrCat("generation ", world_.generation, " did not start: ", entered.message()),
        broken != nullptr ? broken->deadline : options_.build_timeout, UnreachableRanks(entered));
    broken = &failed_entry;
  }
  ++regroups_;
  MUSTER_LOG(WARNING) << "regrouped into generation " << world_.generation << " (world "
                      << world_.world_size << ", rank " << world_.rank << ", step " << step
                      << ") after " << why << " in "
                      << absl::FormatDuration(options_.clock->Now() - start);
  return absl::OkStatus();
}

absl::Status ElasticWorld::Leave(Departure departure, int64_t step) {
  Detach();
  return client_->Leave(departure, step);
}

}  // namespace muster
