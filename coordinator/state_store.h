// StateStore: what the coordinator must not forget across a restart — the
// current world (and with it the generation counter), the checkpoint
// catalog, the event log and the coordinators' lease.
//
// Every Save call is durable when it returns OK. Implementations must be
// safe to call from one thread at a time (the coordinator serialises calls
// through SerializedStateStore, coordinator/persister.h, and writes worlds
// and events from the Persister's thread, outside its mutex).
#ifndef MUSTER_COORDINATOR_STATE_STORE_H_
#define MUSTER_COORDINATOR_STATE_STORE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/checkpoint_record.h"
#include "coordinator/types.h"

namespace muster {

// The coordinators' lease on a state dir (docs/failover.md): which one may
// write the state, in which epoch, and where it serves.
struct Lease {
  uint64_t epoch = 0;  // 0: never taken
  std::string holder;  // the holder's advertised host:port
  uint64_t beats = 0;  // renewals in this epoch
};

class StateStore {
 public:
  virtual ~StateStore() = default;

  // Replaces the stored world (and generation). Errors: UNAVAILABLE / INTERNAL
  // when the write failed; the stored world is then unchanged.
  virtual absl::Status SaveWorld(const World& world) = 0;
  // The stored world; generation 0 and no members when none was saved.
  virtual absl::StatusOr<World> LoadWorld() = 0;

  // Inserts or replaces one checkpoint record with its files.
  virtual absl::Status SaveCheckpoint(const CheckpointRecord& record) = 0;
  // Every stored record, in id order.
  virtual absl::StatusOr<std::vector<CheckpointRecord>> LoadCheckpoints() = 0;

  // Appends to the event log.
  virtual absl::Status AppendEvents(const std::vector<JobEvent>& events) = 0;
  // The newest `limit` events, oldest first.
  virtual absl::StatusOr<std::vector<JobEvent>> LoadEvents(size_t limit) = 0;

  // The lease as stored.
  virtual absl::StatusOr<Lease> ReadLease() = 0;
  // Takes the lease for `holder` in epoch seen.epoch + 1, provided it is
  // still `seen` (ABORTED when another coordinator renewed or took it
  // meanwhile). From then on this store is fenced: each write commits only
  // while the lease is still in that epoch, and fails ABORTED otherwise.
  virtual absl::StatusOr<Lease> TakeLease(const Lease& seen, const std::string& holder) = 0;
  // One more beat of the lease taken in `epoch`; ABORTED naming the new
  // holder when it has moved on.
  virtual absl::Status RenewLease(uint64_t epoch) = 0;
  // Gives up the lease of `epoch` (a coordinator that stops): the next
  // coordinator takes it at once. A no-op when it has moved on.
  virtual absl::Status ReleaseLease(uint64_t epoch) = 0;
  // Work that no caller waits for, done after what they wait for is
  // durable: SQLite folds its write-ahead log into the file here rather
  // than inside the commit of a large write (a world of 100,000 members is
  // written twice, and folded twice, per regroup). Errors are logged.
  virtual void CompactJournal() {}
};

enum class JournalMode {
  kAuto,      // WAL on local file systems, the rollback journal on network ones
  kWal,       // WAL: needs shared memory between the processes (local only)
  kRollback,  // rollback journal (DELETE) with fsync: safe on NFS, Lustre, GPFS
};

// The name of a network or cluster file system ("nfs", "lustre", "gpfs",
// ...) for statfs(2)'s f_type, or "" for a local one.
std::string NetworkFileSystemName(int64_t f_type);

// Opens (creating if needed) the SQLite database `path` with synchronous
// commits, after PRAGMA quick_check; ":memory:" gives a private in-memory
// database. `sync_delay` > 0 (benchmarks, tests) makes every fsync of the
// database wait that long first, as on a slow shared file system
// (coordinator/slow_sync_vfs.h). Errors: UNAVAILABLE when the file cannot be
// opened, DATA_LOSS naming the file when it is damaged (or not a database),
// FAILED_PRECONDITION when it holds an unknown schema version.
absl::StatusOr<std::unique_ptr<StateStore>> OpenSqliteStateStore(
    const std::string& path, absl::Duration sync_delay = absl::ZeroDuration(),
    JournalMode journal = JournalMode::kAuto);

}  // namespace muster

#endif  // MUSTER_COORDINATOR_STATE_STORE_H_
