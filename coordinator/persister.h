// Persister: the coordinator's one writer, so that no disk write happens
// under the coordinator's mutex (LevelDB's pattern: decide under the lock,
// write outside it, one writer, group commit).
//
// The coordinator decides under its mutex and queues what must survive a
// restart: the world of a new generation (or its arrival steps), checkpoint
// records and the events. A thread writes them in the order they were queued, in groups:
// what was queued while one group was being written goes into the next, and
// of several worlds in a group only the last is written (each replaces the
// one before). Waiters learn when everything queued before their ticket is
// durable, so a generation is never announced before it is on disk: a
// coordinator restarted on the state dir can never hand out the same
// generation number for another world.
//
// A failed world or record write is sticky (like LevelDB's background error): later
// writes are not attempted, and Wait returns the error, which the
// coordinator turns into a shutdown with the reason. A failed event write is
// retried with the next group.
//
// Thread-safe.
#ifndef MUSTER_COORDINATOR_PERSISTER_H_
#define MUSTER_COORDINATOR_PERSISTER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "coordinator/state_store.h"
#include "coordinator/types.h"

namespace muster {

// A StateStore that lets one caller in at a time: the writer thread and the
// coordinator's reads (events, the catalog) share one SQLite connection.
class SerializedStateStore : public StateStore {
 public:
  explicit SerializedStateStore(StateStore* store) : store_(store) {}
  absl::Status SaveWorld(const World& world) override;
  absl::StatusOr<World> LoadWorld() override;
  absl::Status SaveCheckpoint(const CheckpointRecord& record) override;
  absl::StatusOr<std::vector<CheckpointRecord>> LoadCheckpoints() override;
  absl::Status AppendEvents(const std::vector<JobEvent>& events) override;
  absl::StatusOr<std::vector<JobEvent>> LoadEvents(size_t limit) override;
  absl::StatusOr<Lease> ReadLease() override;
  absl::StatusOr<Lease> TakeLease(const Lease& seen, const std::string& holder) override;
  absl::Status RenewLease(uint64_t epoch) override;
  absl::Status ReleaseLease(uint64_t epoch) override;
  void CompactJournal() override;

 private:
  StateStore* const store_;
  absl::Mutex mu_;
};

class Persister {
 public:
  // `clock` times the waits (Flush, the retry backoff); required, not owned.
  Persister(StateStore* store, Clock* clock);
  // Writes what is queued, then stops the writer.
  ~Persister();
  Persister(const Persister&) = delete;
  Persister& operator=(const Persister&) = delete;

  // Queues `world` (replacing any queued one); returns its ticket. The
  // world is shared, not copied: whoever changes it later copies it first
  // (GenerationState does); the writer lets go of it once written.
  uint64_t SaveWorld(std::shared_ptr<const World> world);
  // Queues a checkpoint record (replacing a queued one of the same id);
  // returns its ticket.
  uint64_t SaveCheckpoint(CheckpointRecord record);
  // Queues events; they carry no ticket (nothing waits for them).
  void AppendEvents(std::vector<JobEvent> events);
  // The ticket of the last world or record queued (0: none).
  uint64_t last_ticket();
  // Blocks until the write of `ticket` and every one before it is durable,
  // or a world or record write failed (that error, sticky).
  absl::Status Wait(uint64_t ticket);
  // Blocks until everything queued so far, events included, is written, or
  // `timeout` passes (DEADLINE_EXCEEDED, naming what is not written; the
  // writer retries a failing event log with backoff meanwhile). Errors: a
  // failed world or record write (sticky).
  absl::Status Flush(absl::Duration timeout = absl::InfiniteDuration());

  // After Close nothing more is queued (Save* return ticket 0, which is
  // always durable); what was queued before is still written.
  void Close();

  // Groups written so far (tests, metrics).
  uint64_t groups_written();

 private:
  void Loop();

  StateStore* const store_;
  Clock* const clock_;
  absl::Mutex mu_;
  std::shared_ptr<const World> world_ ABSL_GUARDED_BY(mu_);  // the newest queued world
  std::map<uint64_t, CheckpointRecord> records_ ABSL_GUARDED_BY(mu_);  // by id, newest
  uint64_t queued_ ABSL_GUARDED_BY(mu_) = 0;         // ticket of the newest queued write
  uint64_t durable_ ABSL_GUARDED_BY(mu_) = 0;        // every ticket up to it is on disk
  std::vector<JobEvent> events_ ABSL_GUARDED_BY(mu_);
  uint64_t events_queued_ ABSL_GUARDED_BY(mu_) = 0;   // event batches queued
  uint64_t events_written_ ABSL_GUARDED_BY(mu_) = 0;  // ... and written
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status event_error_ ABSL_GUARDED_BY(mu_);  // the event log's last failed write
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t groups_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace muster

#endif  // MUSTER_COORDINATOR_PERSISTER_H_
