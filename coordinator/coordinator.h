// Coordinator: the job's control plane as a plain, thread-safe class —
// membership, sessions and heartbeats, generations and rendezvous, the KV
// store and barriers of the current generation, and the checkpoint catalog.
// It knows nothing of gRPC: grpc_service.h adapts it to the wire.
//
// Blocking operations (Rendezvous, KvGet with a wait, Barrier) never block:
// they take a callback that runs exactly once, on some thread, when the
// operation completes, fails, or its deadline passes. Time comes from the
// injected Clock and deadlines are enforced by Tick(), which the owner calls
// periodically (every few tens of milliseconds), so unit tests drive every
// timeout with a FakeClock. Heartbeat expiry, deadlines and every duration
// use the clock's monotonic Now(), which a wall clock step does not move;
// only records take its WallNow(): event times and the checkpoints'
// created and committed times (stored, and shown as dates).
//
// Thread-safety: every method may be called from any thread. Callbacks and
// SessionSink calls run without the coordinator's lock held.
#ifndef MUSTER_COORDINATOR_COORDINATOR_H_
#define MUSTER_COORDINATOR_COORDINATOR_H_

#include <cstdint>
#include <functional>
#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/actions.h"
#include "coordinator/partition_holds.h"
#include "coordinator/barrier.h"
#include "coordinator/checkpoint_catalog.h"
#include "coordinator/generation_state.h"
#include "coordinator/kv_store.h"
#include "coordinator/limits.h"
#include "coordinator/membership.h"
#include "coordinator/persister.h"
#include "coordinator/regroup_state.h"
#include "coordinator/rendezvous.h"
#include "coordinator/rendezvous_waiters.h"
#include "coordinator/state_store.h"
#include "coordinator/types.h"

namespace muster {

// An event pushed down a member's session.
// What a heartbeat says of a member's progress (Heartbeat in the proto).
struct MemberProgress {
  MemberProgress(int64_t step = 0, int64_t samples = 0,
                 absl::Duration stalled = absl::ZeroDuration(),
                 absl::Duration age = absl::ZeroDuration(), bool working = false)
      : step(step), samples(samples), stalled(stalled), age(age), working(working) {}
  int64_t step;
  int64_t samples;
  // How long its training thread had made no progress
  // (Heartbeat.stalled_ms), as of `age` ago (a node session relays its
  // members' heartbeats).
  absl::Duration stalled;
  absl::Duration age;
  bool working;         // Heartbeat.working: the thread ran meanwhile
  MemberMemory memory;  // all 0: not reported
};

struct MemberEvent {
  enum class Kind { kRegroup, kStop };
  Kind kind = Kind::kRegroup;
  uint64_t generation = 0;
  bool abort = false;  // regroup: abort in-flight collectives now
  bool leave = false;  // regroup: the receiver is not in the new world
  bool paused = false; // regroup: no new world; below min_members
  std::string reason;
};

// The sending half of a member's session, implemented by the transport.
// Push and Close must not block and may be called from any thread; calls
// after Close are ignored.
class SessionSink {
 public:
  virtual ~SessionSink() = default;
  virtual void Push(const MemberEvent& event) = 0;
  // The same event pushed to many members (a regroup's): a node session
  // sends it once, naming those of its members it went to
  // (NodeHello.grouped).
  virtual void PushShared(const std::shared_ptr<const MemberEvent>& event) { Push(*event); }
  // Ends the session with `status` (OK for a normal stop).
  virtual void Close(const absl::Status& status) = 0;
  // Ends the session of a member fenced as hung (its session lived, its
  // training did not come to a regroup): as Close, and a node session also
  // tells the member's agent to end the process, which it then restarts.
  virtual void CloseHung(const absl::Status& status) { Close(status); }
};

struct CoordinatorOptions {
  RendezvousRules rules;
  absl::Duration heartbeat_interval = absl::Seconds(1);
  absl::Duration heartbeat_timeout = absl::Seconds(5);
  // Heartbeats a second the coordinator asks for at most, from all its
  // session streams together: with more streams than this many per
  // heartbeat_interval, each is asked to beat less often
  // (HeartbeatIntervalFor). 0: no bound.
  uint32_t max_heartbeat_rate = 5000;
  // After a coordinator restart, how long the stored world waits for all of
  // its members to come back before the missing ones count as failed.
  absl::Duration reattach_grace = absl::Seconds(30);
  // A job paused below min_members for this long ends (JobEnded); zero:
  // it waits for members as long as it runs.
  absl::Duration pause_timeout = absl::ZeroDuration();
  // How long the members of a world formed after a broken-world report have
  // to come to its rendezvous when the report names no deadline of its own.
  absl::Duration regroup_arrival = absl::Seconds(30);
  // How long a member that its peers' collective deadline passed waiting
  // for, and whose training thread runs in the program's own code (an
  // evaluation on one rank: Heartbeat.working), is waited for from the
  // start of its stall before it is fenced as hung.
  absl::Duration own_work_limit = absl::Minutes(10);
  // The longest a coordinator that hears from nobody holds (Unheard): it
  // fails nobody for the silence meanwhile. Zero: it never holds (no lease,
  // so no standby to take over: CoordinatorServer gives twice the lease
  // timeout when it holds one). Past it, members are failed as before.
  absl::Duration silence_hold = absl::ZeroDuration();
  // Nodes left out because their peers could not reach them: how long
  // (partition_holds.h).
  PartitionHoldOptions partition_holds;
  CatalogOptions catalog;
  Limits limits;
  // Times of clock->Now() and ->WallNow(). Required; not owned.
  // CoordinatorServer::Start gives the real one when none is set.
  Clock* clock = nullptr;
};

// The heartbeat period asked of each of `streams` open session streams
// (HeartbeatAck.heartbeat_interval_ms): heartbeat_interval, longer when the
// streams would beat more than max_heartbeat_rate times a second, and never
// longer than a third of heartbeat_timeout, so that a silent session is
// still found within the timeout (it misses three beats first).
absl::Duration HeartbeatIntervalFor(int64_t streams, const CoordinatorOptions& options);

// How long a coordinator hears from nobody before it takes itself to be the
// one cut off (Coordinator::Unheard), when its sessions beat every
// `interval` (HeartbeatIntervalFor): half the heartbeat timeout, and at
// least two such periods where that still falls short of the timeout.
// Always shorter than the timeout, so that the hold begins before any
// member would be failed for the same silence.
absl::Duration IsolatedAfter(absl::Duration interval, const CoordinatorOptions& options);

// kStopped: the job stops at a step every member agreed on (a checkpoint to
// stop, a requeue); see Coordinator::Leave.
enum class LeaveReason { kFinished, kGraceful, kStopped };

struct JoinResult {
  uint64_t generation = 0;
  bool reattached = false;
};

struct MemberRow {
  MemberInfo info;
  int rank = -1;       // in the current world
  bool spare = false;  // waiting outside a live world that is full
};

struct StatusSnapshot {
  JobState job_state = JobState::kWaiting;
  uint64_t generation = 0;
  uint32_t world_size = 0;
  std::vector<MemberRow> members;
  size_t committed_checkpoints = 0;
  int64_t latest_committed_step = -1;
  RendezvousRules rules;
  absl::Duration uptime;
  // The coordinator clock's two readings at the snapshot: `now`
  // (monotonic) for ages, as now - members[i].info.last_seen; `wall_now`
  // for what is shown as a time of day (now_unix_ms).
  absl::Time now;
  absl::Time wall_now;
};

// Monotonic counters for metrics.
struct CoordinatorCounters {
  uint64_t generation = 0;
  uint64_t regroups = 0;
  uint64_t failures = 0;
  uint64_t checkpoints_committed = 0;
  uint64_t open_sessions = 0;
  std::map<std::string, uint64_t> members_by_state;
  uint32_t world_size = 0;  // of the live world (0: none)
  int64_t step = 0;         // the newest step an active member reported
  // The memory account of the active member that reported the largest.
  MemberMemory largest_memory;
  // The latest observations, oldest first (at most kRecentObservations of
  // each), and how many there were in all: a reader observes the ones it
  // has not seen yet.
  static constexpr size_t kRecentObservations = 256;
  // Appends `value` to `recent`, dropping the oldest beyond the bound.
  static void Keep(std::deque<double>* recent, double value) {
    recent->push_back(value);
    if (recent->size() > kRecentObservations) recent->pop_front();
  }
  std::deque<double> regroup_seconds;     // from forming a world to its last arrival
  uint64_t regroups_timed = 0;
  std::deque<double> checkpoint_seconds;  // from begin to commit
  std::deque<double> checkpoint_bytes;    // every file of the checkpoint
  uint64_t checkpoints_timed = 0;
};

class Coordinator {
 public:
  // How long after its Rendezvous wait ran out a waiting member still
  // counts as waiting: the time its renewal takes to arrive (a round trip,
  // through its agent), with room for a loaded host.
  static constexpr absl::Duration kRenewGrace = absl::Seconds(1);
  // RendezvousResult is in rendezvous_waiters.h.
  using RendezvousCallback = RendezvousWaiter::Callback;
  using KvCallback = KvStore::GetCallback;
  using DoneCallback = std::function<void(absl::Status)>;

  // Loads the stored world, catalog and generation from `store` (which must
  // outlive the coordinator). A stored world puts the job in kRecovering for
  // options.reattach_grace. Errors: INVALID_ARGUMENT (bad rules), and the
  // store's errors.
  static absl::StatusOr<std::unique_ptr<Coordinator>> Create(CoordinatorOptions options,
                                                             StateStore* store);
  ~Coordinator();

  // Registers a member (Membership::Join's errors, plus FAILED_PRECONDITION
  // while shutting down). A new incarnation of a member of the current world
  // counts as the old one's failure.
  absl::StatusOr<JoinResult> Join(const JoinSpec& spec);

  // Attaches the member's session; a previous session of the same member is
  // closed. Returns the session id. `node` non-empty (a node session): the
  // member must have joined on that node. While recovering after a restart,
  // a member of the stored world may attach without joining again. Errors:
  // as Membership::Live; INVALID_ARGUMENT (another node).
  absl::StatusOr<uint64_t> OpenSession(const MemberKey& key, std::shared_ptr<SessionSink> sink,
                                       const std::string& node = "");
  // Records a heartbeat on `session`; returns the newest generation on
  // disk (announced_generation_). Errors: NOT_FOUND (no such session),
  // ABORTED (the member was fenced), as CheckServing.
  absl::StatusOr<uint64_t> Heartbeat(uint64_t session, MemberProgress progress);
  // Heartbeat for many sessions (a node session's members) under one lock:
  // `progress[i]` for `sessions[i]`. Sets `ok[i]` to whether Heartbeat would
  // have succeeded; returns what Heartbeat returns. Errors: as CheckServing
  // (a coordinator that stopped serving acknowledges no node).
  absl::StatusOr<uint64_t> Heartbeats(const std::vector<uint64_t>& sessions,
                                      const std::vector<MemberProgress>& progress,
                                      std::vector<bool>* ok);
  // The transport lost the session: its member fails at once.
  void SessionClosed(uint64_t session, const std::string& why);
  // The session was lost between a relay and this coordinator (the relay
  // died or stopped: docs/relay.md), not by its member: the member stays
  // as it is, without a session, until it opens a new one (OpenSession)
  // or the heartbeat timeout fails it. Events for it meanwhile are dropped;
  // the acknowledgement of its new session names the newest generation.
  void SessionLost(uint64_t session);

  // Completes with the first world of generation > after_generation that
  // holds the member, once all of that world's members arrived; or with
  // DEADLINE_EXCEEDED after min(timeout, join_timeout); or ABORTED if the
  // member fails meanwhile; FAILED_PRECONDITION on shutdown. Errors of
  // Membership::Live complete it at once. `takes_delta`: the member takes
  // an answer that is a delta from the world it holds
  // (RendezvousRequest.takes_delta, RendezvousResult.delta).
  void Rendezvous(const MemberKey& key, uint64_t after_generation, int64_t step,
                  absl::Duration timeout, RendezvousCallback done, bool takes_delta = false);
  // One Rendezvous call, for RendezvousAll.
  struct RendezvousCall {
    MemberKey key;
    uint64_t after_generation = 0;
    int64_t step = 0;
    absl::Duration timeout;
    RendezvousCallback done;
    bool takes_delta = false;
  };
  // Rendezvous for each of `calls` in order (a node's members' calls sent
  // together), under one lock acquisition and one wait for the disk.
  void RendezvousAll(std::vector<RendezvousCall> calls);

  // A member of the live world reports that the world of
  // report.generation broke under it (a collective failed). Unless that
  // world was already regrouped (a newer one formed, or the job paused),
  // the next world forms now from the same members, with an abort notice
  // to all of them; a member of it that has not come to its rendezvous
  // within the report's deadline is fenced as hung (its agent restarts it)
  // and the world forms again without it. Idempotent per generation: the
  // first report regroups, later ones change nothing. Callers go on to
  // Rendezvous(after = report.generation) either way. Errors: ABORTED (an
  // older generation: already regrouped; nothing changes),
  // FAILED_PRECONDITION (a generation this coordinator has not formed), as
  // Membership::Live and CheckServing.
  absl::Status ReportBroken(const MemberKey& key, const BrokenWorldReport& report);

  // Leaves the job. kFinished: no regroup; kGraceful: the others regroup
  // without it (no abort); kStopped: no regroup (the others stop at the
  // same step), and once none of the world trains the world is forgotten
  // (ForgetIfStopped). Errors: as Membership::Live.
  absl::Status Leave(const MemberKey& key, LeaveReason reason, int64_t step);

  // Makes every live member on `node` leave at the next step boundary.
  // Returns how many were drained. Errors: INVALID_ARGUMENT (bad name),
  // NOT_FOUND (no live member on that node).
  absl::StatusOr<uint32_t> Drain(const std::string& node);

  // KV of generation `generation`: ABORTED when it is older than the
  // current one, FAILED_PRECONDITION when newer; otherwise KvStore's
  // errors. KvGet with wait > 0 waits for the keys (capped by limits).
  absl::Status KvSet(uint64_t generation, const std::string& key, std::string value);
  void KvGet(uint64_t generation, std::vector<std::string> keys, absl::Duration wait,
             KvCallback done);
  absl::StatusOr<int64_t> KvAdd(uint64_t generation, const std::string& key, int64_t delta);
  absl::StatusOr<CasResult> KvCompareAndSet(uint64_t generation, const std::string& key,
                                            const std::optional<std::string>& expected,
                                            std::string desired);
  // Completes when every member of `generation` reached barrier `name`.
  void Barrier(uint64_t generation, const MemberKey& key, const std::string& name,
               absl::Duration timeout, DoneCallback done);

  // Checkpoint catalog (CheckpointCatalog's errors; ABORTED for a stale
  // generation; PERMISSION_DENIED for a member outside the world).
  absl::StatusOr<uint64_t> BeginCheckpoint(uint64_t generation, const MemberKey& key,
                                           int64_t step);
  absl::StatusOr<bool> ReportShard(uint64_t id, const MemberKey& key, ShardReport report);
  absl::Status AbortCheckpoint(uint64_t id, const MemberKey& key, const std::string& reason);
  std::vector<CheckpointRecord> ListCheckpoints(bool all);

  // The newest world formed (its members may still be arriving), shared
  // and immutable; nullptr before the first.
  std::shared_ptr<const World> CurrentWorld();

  StatusSnapshot GetStatus();
  // Counters() walks every member; WorldsCompleted is its regroups_timed
  // alone, without the walk.
  CoordinatorCounters Counters();
  uint64_t WorldsCompleted();
  // The newest `limit` events, oldest first, once what is queued is written
  // (within a few seconds). Errors: the store's, or DEADLINE_EXCEEDED while
  // the event log cannot be written.
  absl::StatusOr<std::vector<JobEvent>> RecentEvents(size_t limit);

  // Stops every member and fails every pending call; later calls fail
  // FAILED_PRECONDITION. Returns once everything decided is on disk, or
  // with the error that kept it from getting there (a failed write, or
  // DEADLINE_EXCEEDED after 10 s); the state file is not written after it.
  // Idempotent (a second call returns OK).
  absl::Status Shutdown(const std::string& reason);
  // Stops serving because another coordinator took the lease over
  // (docs/failover.md): members are not stopped; every session and pending
  // call ends UNAVAILABLE, so clients go to the new holder. Nothing more is
  // written. Idempotent, and a no-op after Shutdown.
  void Abandon(const std::string& reason);
  bool shutting_down();

  // Enforces heartbeat timeouts, deadlines, last call, the reattach grace
  // and the pause timeout; flushes the event log.
  void Tick();
  // How long nobody has been heard from, while that silence says that this
  // coordinator is the one cut off rather than its members (a hold,
  // docs/failover.md): members are alive on two nodes or more (one node's
  // silence is that node's own), no stored world is waiting for its members
  // after a restart, no message of any session (a member's beat, a node's
  // beat with no member in it, a hello) and no join came for
  // IsolatedAfter, and the hold has lasted at most options().silence_hold.
  // Zero otherwise. During a hold Tick fails no member for missing
  // heartbeats, and once someone is heard again it fails none for the
  // hold's silence until a heartbeat timeout later: members reconnecting
  // at their own pace are not failed at the first one's return. Whoever
  // runs the coordinator lets its lease lapse during a hold, so that a
  // standby that still reaches the members takes over.
  absl::Duration Unheard();
  // A message arrived on a session stream (any kind): Unheard's sign that
  // this coordinator is still reached. Lock-free.
  void Heard() {
    last_heard_ns_.store(absl::ToUnixNanos(clock_->Now()), std::memory_order_relaxed);
  }
  // Why the job ended on its own (the pause timeout passed), or "" while it
  // has not. Whoever runs the coordinator then shuts it down with it.
  std::string JobEnded();

  // Constant after construction.
  const CoordinatorOptions& options() const { return options_; }
  // Session streams (a member's own or a node's) open on this coordinator,
  // counted for the heartbeat period it asks of each (HeartbeatInterval).
  void StreamOpened() { streams_.fetch_add(1, std::memory_order_relaxed); }
  void StreamClosed() { streams_.fetch_sub(1, std::memory_order_relaxed); }
  absl::Duration HeartbeatInterval() const {
    return HeartbeatIntervalFor(streams_.load(std::memory_order_relaxed), options_);
  }

 private:
  struct Session {
    MemberKey member;
    std::shared_ptr<SessionSink> sink;
  };

  Coordinator(CoordinatorOptions options, StateStore* store);
  absl::Status Load();

  // --- regrouping (coordinator_regroup.cc) ---
  // The generation's lifecycle is gen_'s and the regroup's regroup_'s;
  // these decide their transitions and act on them. Re-evaluates
  // membership: forms a new world, pauses, or waits.
  void Evaluate(bool urgent, bool abort, const std::string& reason, Actions* actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Who could be in the next world, with each one's record in `infos` (same
  // order): the seated members, and those waiting (kRenewGrace).
  std::vector<Candidate> Candidates(std::vector<MemberInfo*>* infos)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Form(std::vector<Candidate> candidates, std::vector<MemberInfo*> infos, uint32_t size,
            bool abort, const std::string& reason, Actions* actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Form's changes of state: the members of the new world are active, the
  // other active ones wait. `taken` is AssignWorld's (candidate by rank).
  void TakeSeats(const std::vector<MemberInfo*>& infos, const std::vector<uint32_t>& taken,
                 bool old_live) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tells the alive members of the old world `old` of the regroup: drained
  // ones to leave, the others to come to the rendezvous. `old_infos` holds
  // the incumbents' records by their old rank (null: look it up).
  void PushRegroup(const World& old, const std::vector<MemberInfo*>& old_infos,
                   uint64_t generation, bool abort, const std::string& reason,
                   Actions* actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Pause(const std::string& reason, Actions* actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `what` holds for a member of the current world (this very
  // incarnation of it).
  bool AnyOfTheWorld(absl::FunctionRef<bool(const MemberInfo&)> what) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a member of the live world finished: the world is ending.
  bool WorldFinishing() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a member of the live world stopped with the job.
  bool WorldStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets the live world when none of its members trains any more and
  // one of them stopped with the job: kNoWorld, an empty world stored at
  // the same generation, so that neither this coordinator nor a restarted
  // one waits for them and the next world forms as the job's first.
  void ForgetIfStopped(Actions* actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the job when no member of the live world trains any more (every
  // one finished, failed, or only waits for a world) and tells the waiters.
  void FinishIfDone(Actions* actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fails the KV and barrier waiters of generation `generation`.
  void ResetGenerationState(uint64_t generation, const std::string& reason, Actions* actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Rendezvous's work under the lock; what it answers goes to `actions`.
  void RendezvousLocked(RendezvousCall call, Actions* actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // True when a Rendezvous call cannot change the decision to wait (see the
  // definition); Evaluate is then skipped.
  bool StillWaiting() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The member at `rank` of the forming world arrived; true when it was the
  // last.
  bool Arrive(uint32_t rank, int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The forming world just completed: stores it and answers its waiters.
  void WorldCompleted(Actions* actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailMember(MemberInfo* info, const std::string& reason, Actions* actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FailMember's bookkeeping without the regroup: marks the member failed,
  // ends its session (`hung`: CloseHung) and its waits. Returns whether it
  // was an active member of the live world (whose loss needs a regroup).
  bool Fence(MemberInfo* info, const std::string& reason, bool hung, Actions* actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A broken-world report that names unreachable ranks: holds the side
  // to leave out (partition_holds.h) before the regroup. Whether it held any.
  bool LeaveOutUnreachable(const World& world, int reporter, const BrokenWorldReport& report)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A member of `world` whose training thread made no progress for about
  // `deadline` while its peers waited in a collective, and did not run
  // meanwhile, is stuck: fenced as hung (its agent restarts it) before the
  // regroup forms, not waited for. One whose thread ran is in the
  // program's own work: the regroup waits for it (InOwnWork).
  void FenceStuck(const World& world, absl::Duration deadline, Actions* actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `info`'s recent heartbeats say that its training thread is
  // stalled in the program's own work (outside muster's calls), running,
  // for less than options_.own_work_limit.
  bool InOwnWork(const MemberInfo& info, absl::Time now, absl::Duration window) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tick: the forming world's arrival deadline passed. Where every member
  // that has not arrived is InOwnWork, waits another window; else fences
  // the others and forms the world again without them.
  void FenceLateArrivals(Actions* actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropWaiters(const std::string& id, const absl::Status& status, Actions* actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CheckRecovered(Actions* actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // While recovering: `key`, unknown since the restart but a member of the
  // stored world (on `node`, when not empty), joins as that world recorded
  // it (a session that reopens needs no Join first). False when it is not
  // such a member.
  bool ReattachFromWorld(const MemberKey& key, const std::string& node)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Membership::Live, after ReattachFromWorld for a member unknown since a
  // restart: its first call after a takeover (a checkpoint, a rendezvous)
  // may come before its session.
  absl::StatusOr<MemberInfo*> LiveMember(const MemberKey& key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- helpers (coordinator.cc; members in coordinator_members.cc, KV,
  // barriers and the catalog in coordinator_kv.cc) ---
  // Whether gen_ or regroup_ took a transition; a refusal (a bug in the
  // checks before it) is logged, and the caller then leaves the rest of its
  // work undone.
  bool Accepted(const absl::Status& transition);
  // Heartbeat's and Heartbeats' work for one session.
  absl::Status Beat(uint64_t session, MemberProgress progress, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Record(const std::string& kind, const std::string& detail)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PushTo(const std::string& id, const MemberEvent& event, Actions* actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The sink of `info`'s open session; null when it has none.
  std::shared_ptr<SessionSink> SinkOf(const MemberInfo& info) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckServing() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Duration CapWait(absl::Duration d) const;
  void FlushEvents() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The catalog changes, under the lock; the public calls then wait until
  // they are durable.
  absl::StatusOr<uint64_t> DecideBeginCheckpoint(uint64_t generation, const MemberKey& key,
                                                 int64_t step);
  absl::StatusOr<bool> DecideReportShard(uint64_t id, const MemberKey& key, ShardReport report);
  // Shutdown's and Abandon's decisions under the lock (`tell_members`:
  // stop them; else end their sessions and calls UNAVAILABLE); false when
  // already shutting down.
  bool StopServing(const std::string& reason, bool tell_members = true);
  // After the lock: waits for the persister; a failed write shuts down
  // (or abandons, when fenced) and is returned as UNAVAILABLE: what waited
  // for it is not on disk, and a retry may reach a coordinator that works.
  absl::Status AwaitDurable();

  // Constant after construction.
  const CoordinatorOptions options_;
  std::atomic<int64_t> streams_{0};
  Clock* const clock_;
  const absl::Time started_;
  // The store, one caller at a time (the persister's thread and the
  // catalog), and its one writer: no world or event is written under mu_.
  SerializedStateStore store_;
  Persister persister_;
  std::atomic<bool> store_failed_{false};

  absl::Mutex mu_;
  // The gate of every decision's actions: they run once every decision
  // queued so far is durable (AwaitDurable).
  const std::function<bool()> durable_ = [this] { return AwaitDurable().ok(); };
  // The generation counter, the current world, its arrivals and the phase
  // of its lifecycle (generation_state.h).
  GenerationState gen_ ABSL_GUARDED_BY(mu_);
  // The regroup: last call, the Rendezvous calls waiting for a world, when
  // the current world formed and by when its members must arrive, when the
  // job paused, and the last completed world with its delta
  // (regroup_state.h).
  RegroupState regroup_ ABSL_GUARDED_BY(mu_);
  // The newest generation that is on disk, which heartbeat acknowledgements
  // carry: raised by gated actions only, so members never hear of a
  // generation that did not become durable (as one decided by a coordinator
  // whose lease was taken over meanwhile, which the successor never knew;
  // members told of it would wait for a world after theirs for ever).
  std::atomic<uint64_t> announced_generation_{0};
  // Raises announced_generation_ to `generation` (never lowers it).
  void Announce(uint64_t generation);
  // Why Abandon stopped this coordinator ("" unless it did).
  std::string abandoned_ ABSL_GUARDED_BY(mu_);
  Membership membership_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Session> sessions_ ABSL_GUARDED_BY(mu_);
  uint64_t next_session_ ABSL_GUARDED_BY(mu_) = 1;
  KvStore kv_ ABSL_GUARDED_BY(mu_);
  Barriers barriers_ ABSL_GUARDED_BY(mu_);
  CheckpointCatalog catalog_ ABSL_GUARDED_BY(mu_);
  std::vector<JobEvent> unflushed_events_ ABSL_GUARDED_BY(mu_);
  CoordinatorCounters counters_ ABSL_GUARDED_BY(mu_);
  // Tick's scans over every member run at most this often.
  absl::Time next_expiry_scan_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // Unheard at `now`, and its state kept: the hold begun, or ended (then
  // excused_until_).
  absl::Duration HoldLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a member's silence or lost stream fails nobody at `now`: this
  // coordinator holds through a silence of its own, or the timeout after
  // one has not passed (HoldLocked's state kept the same way).
  bool ExcusedLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Unheard's state: the hold's start (InfinitePast: none), and until when
  // the silence it held through fails nobody.
  absl::Time hold_since_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Time excused_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::atomic<int64_t> last_heard_ns_{absl::ToUnixNanos(absl::InfinitePast())};
  absl::Time next_prune_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // Nodes held out of the world after a lost link (partition_holds.h).
  PartitionHolds holds_ ABSL_GUARDED_BY(mu_);
  // Why the job ended on its own (JobEnded).
  std::string ended_ ABSL_GUARDED_BY(mu_);
  // A member finished since this coordinator started: only then can a world
  // be finishing (WorldFinishing looks at its members only then).
  bool any_finished_ ABSL_GUARDED_BY(mu_) = false;
  // The same for a member that stopped with the job (WorldStopping).
  bool any_stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace muster

#endif  // MUSTER_COORDINATOR_COORDINATOR_H_
