// CoordinatorClient: a trainer's connection to the coordinator — join, the
// session stream (heartbeats carrying the step, events pushed down),
// rendezvous, leave, and the KV store and barriers of a generation.
//
// Every call has a deadline, a time of ClientOptions::clock's Now(): the
// monotonic clock (common/clock.h), not the wall clock. Calls answered UNAVAILABLE (the coordinator is
// restarting or unreachable) are retried with exponential backoff until their
// deadline; other errors are returned as they are (see the proto for who
// retries what). The session reconnects by itself after a coordinator
// restart and re-registers with the same member id and incarnation. Under
// muster-agent the session stream and Rendezvous go through the agent
// (session_via), which carries them on its node's one stream and holds them
// while that stream is down; every other call goes to the coordinator.
// There a lost session is reopened at once and re-registers only when the
// coordinator answers that it does not know the member.
//
// Thread-safe: any method may be called from any thread. Event callbacks run
// on the session thread and must not block for long.
#ifndef MUSTER_TRAINER_CLIENT_COORDINATOR_CLIENT_H_
#define MUSTER_TRAINER_CLIENT_COORDINATOR_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/backoff.h"
#include "common/clock.h"
#include "muster/memory_account.h"
#include "rpc/tls_files.h"
#include "trainer/client/training_progress.h"
#include "trainer/comm/world_info.h"

namespace grpc {
class ClientContext;
}  // namespace grpc

namespace muster {

namespace v1 {
class RendezvousResponse;
class World;
class SessionEvent;
}  // namespace v1

struct ClientOptions {
  std::string target;  // host:port of the coordinator
  std::string token;
  TlsFiles tls;
  std::string member_id;
  uint64_t incarnation = 0;  // 0: pick a random one
  std::string node;
  uint32_t local_rank = 0;
  bool spare = false;  // started as a hot spare (JoinRequest.spare)
  // host:port of this member's parameter service; ":port" when this member
  // does not know its address (the coordinator fills in observed_host()).
  std::string state_address;
  // "unix:PATH" of the node's muster-agent ($MUSTER_AGENT_SESSION), which
  // holds one session with the coordinator for the node's trainers: the
  // session stream and Rendezvous go there instead (same protocol). Empty:
  // this member holds its own session with the coordinator.
  std::string session_via;
  BackoffOptions backoff;
  // The training thread's progress, which heartbeats report
  // (Heartbeat.stalled_ms); null reports none. It outlives the client: a
  // fenced member replaces its client while the training thread is inside
  // a call that marks it.
  const TrainingProgress* progress = nullptr;
  // Deadlines are times of its Now(); it also times the heartbeats' silence
  // limit. Required, not owned, must outlive the client.
  Clock* clock = nullptr;
};

// A session event, as the trainer sees it.
struct SessionNotice {
  enum class Kind { kRegroup, kStop, kSessionLost };
  Kind kind = Kind::kRegroup;
  uint64_t generation = 0;
  bool abort = false;
  bool leave = false;
  bool paused = false;  // no new world: below min_members
  std::string reason;
};

// Why a member leaves the job (LeaveRequest.reason).
enum class Departure {
  kLeaving,   // it leaves a running job: the others regroup without it
  kFinished,  // training completed
  kStopping,  // the job stops at a step every member agreed on (a checkpoint
              // to stop): no regroup, and the world is forgotten once none
              // of it trains
};

// A file of a checkpoint as the catalog records it.
struct CatalogFile {
  std::string path;
  uint64_t bytes = 0;
  std::string xxh3;
};

struct CatalogEntry {
  uint64_t id = 0;
  int64_t step = 0;
  std::vector<CatalogFile> files;
};

// Why this member's world broke, as it reports it with its rendezvous: what
// failed, and its collective timeout (the regroup's members must arrive
// within it, or are fenced as hung). It names no culprit: a failed
// collective's status names none, and the coordinator tells a dead or hung
// member by who does not come to the regroup in time.
struct BrokenWorld {
  std::string reason;
  absl::Duration deadline;
  // Ranks of the broken world this member could not reach (Communicator::
  // Unreachable), ascending.
  std::vector<int> unreachable;

  // The report: the one place one is made (a collective failed, a world did
  // not start).
  static BrokenWorld Because(std::string reason, absl::Duration deadline,
                             std::vector<int> unreachable = {}) {
    return BrokenWorld{std::move(reason), deadline, std::move(unreachable)};
  }
};

class CoordinatorClient {
 public:
  // Errors: INVALID_ARGUMENT (bad TLS files, no clock).
  static absl::StatusOr<std::unique_ptr<CoordinatorClient>> Create(ClientOptions options);
  ~CoordinatorClient();

  uint64_t incarnation() const { return options_.incarnation; }
  const std::string& member_id() const { return options_.member_id; }

  // Registers this member (retrying UNAVAILABLE until `deadline`).
  absl::Status Join(int64_t step, absl::Time deadline);
  // This member's address as the coordinator saw its last Join arrive
  // (JoinResponse.observed_host): an IP address, "" before a Join or when
  // the coordinator could not tell. Thread-safe.
  std::string observed_host() const ABSL_LOCKS_EXCLUDED(observed_mu_);

  // Starts the session thread: heartbeats every interval (from Join's
  // answer) with the latest SetStep value; `on_notice` receives regroup and
  // stop events and kSessionLost when the coordinator fenced this member.
  absl::Status StartSession(std::function<void(const SessionNotice&)> on_notice);
  // `samples`: the samples every completed step took, over all ranks
  // (Heartbeat.samples).
  void SetStep(int64_t step, int64_t samples) {
    step_ = step;
    samples_ = samples;
  }
  // The memory account the heartbeats report from now on
  // (Heartbeat.memory). Any thread.
  void SetMemory(const MemoryAccount& memory) {
    absl::MutexLock lock(&memory_mu_);
    memory_ = memory;
  }
  // The highest generation any event or acknowledgement mentioned.
  uint64_t latest_generation() const { return latest_generation_.load(); }

  // Blocks until a world newer than `after` forms with this member in it.
  // `broken`, when given: this member's world (generation `after`) broke
  // under it; the coordinator regroups it unless a regroup is under way
  // (RendezvousRequest.broken).
  absl::StatusOr<WorldInfo> Rendezvous(uint64_t after, int64_t step, absl::Time deadline,
                                       const BrokenWorld* broken = nullptr);
  // Leaves the job, saying why (LeaveRequest.reason).
  absl::Status Leave(Departure departure, int64_t step);
  // How many times Rendezvous fetched the whole world (GetWorld) because
  // its answer was a delta from a world this member did not hold.
  uint64_t worlds_fetched() const { return worlds_fetched_.load(); }
  // How many answers were deltas this member derived its place from.
  uint64_t deltas_applied() const { return deltas_applied_.load(); }

  absl::Status KvSet(uint64_t generation, const std::string& key, const std::string& value,
                     absl::Time deadline);
  // Waits for every key until `deadline` (DEADLINE_EXCEEDED naming a key).
  absl::StatusOr<std::vector<std::string>> KvWait(uint64_t generation,
                                                  const std::vector<std::string>& keys,
                                                  absl::Time deadline);
  absl::StatusOr<int64_t> KvAdd(uint64_t generation, const std::string& key, int64_t delta,
                                absl::Time deadline);
  absl::Status Barrier(uint64_t generation, const std::string& name, absl::Time deadline);

  // Checkpoint catalog (see the proto). Begin returns the id every rank of
  // the generation shares for `step`.
  absl::StatusOr<uint64_t> BeginCheckpoint(uint64_t generation, int64_t step,
                                           absl::Time deadline);
  // Returns true when this report committed the checkpoint.
  absl::StatusOr<bool> ReportShard(uint64_t id, const std::vector<CatalogFile>& files,
                                   absl::Time deadline);
  absl::Status AbortCheckpoint(uint64_t id, const std::string& reason, absl::Time deadline);
  // Committed checkpoints, newest first.
  absl::StatusOr<std::vector<CatalogEntry>> ListCommitted(absl::Time deadline);

 private:
  explicit CoordinatorClient(ClientOptions options);
  struct OpenSession;
  // Sessions until this incarnation is over or Stop: reconnects (with
  // backoff) when the coordinator goes away, rejoining if it forgot us.
  void SessionLoop(std::function<void(const SessionNotice&)> on_notice);
  // One session stream: hello, heartbeats, events to `on_notice` until it
  // ends; its status. `heard`: an event of the current epoch arrived.
  absl::Status RunSession(const std::function<void(const SessionNotice&)>& on_notice,
                          Backoff* backoff, bool* heard);
  // The session's heartbeat thread; cancels `ctx` when the coordinator is
  // silent (common/session_liveness.h).
  void Heartbeats(OpenSession* session, grpc::ClientContext* ctx);
  // The notice an event carries; none for an acknowledgement.
  std::optional<SessionNotice> Notice(const v1::SessionEvent& event);
  // This member's view of the world `resp` answers (its own step `step`):
  // the answer itself, or the delta applied to held_, or, when the delta
  // is not from held_, the whole world fetched. UNAVAILABLE when that world
  // is gone by then (ask again).
  absl::StatusOr<WorldInfo> WorldOf(const v1::RendezvousResponse& resp, int64_t step,
                                    absl::Time deadline);
  // Every member of the world `answered` summarises, paged by GetWorld, as
  // this member's view. UNAVAILABLE when the pages are of another world.
  absl::StatusOr<WorldInfo> FetchWorld(const v1::World& answered, absl::Time deadline);
  // Runs `call` until it returns something other than UNAVAILABLE or the
  // deadline passes.
  absl::Status Retry(absl::Time deadline, const std::function<absl::Status(absl::Time)>& call);

  struct Impl;
  ClientOptions options_;
  std::unique_ptr<Impl> impl_;
  std::atomic<int64_t> step_{0};
  std::atomic<int64_t> samples_{0};
  absl::Mutex memory_mu_;
  MemoryAccount memory_ ABSL_GUARDED_BY(memory_mu_);
  std::atomic<uint64_t> latest_generation_{0};
  // The newest lease epoch any event or answer carried since the session
  // stream last opened; older ones are dropped (SessionEvent.epoch). Raises
  // it to `epoch`; false when `epoch` is older. Under muster-agent always
  // true: the agent filters its node's one connection.
  std::atomic<uint64_t> epoch_{0};
  bool FromCurrentEpoch(uint64_t epoch);
  std::atomic<int64_t> heartbeat_ms_{1000};
  mutable absl::Mutex observed_mu_;
  std::string observed_host_ ABSL_GUARDED_BY(observed_mu_);
  std::atomic<bool> stopping_{false};
  std::thread session_thread_;
  // The world the last Rendezvous answered (a delta's base).
  absl::Mutex held_mu_;
  WorldInfo held_ ABSL_GUARDED_BY(held_mu_);
  std::atomic<uint64_t> worlds_fetched_{0};
  std::atomic<uint64_t> deltas_applied_{0};
};

}  // namespace muster

#endif  // MUSTER_TRAINER_CLIENT_COORDINATOR_CLIENT_H_
