// CheckpointCatalog: the two-phase record of checkpoints.
//
// Every rank of a generation begins the same checkpoint (same step, same
// id), writes its files, then reports them; the checkpoint commits when
// every member of that generation's world has reported. Only committed
// checkpoints are offered for restore. Retention keeps the newest
// `keep_last` committed (plus the best by a metric, if asked) and retires the
// rest. Every change is written to the StateStore before it is visible; when
// the write fails, the catalog is unchanged and the call fails UNAVAILABLE.
// With a writer (set_writer) a change is handed to it instead and visible at
// once; the coordinator's writer queues it on the Persister and answers the
// caller only once it is durable (see persister.h).
//
// Not thread-safe: owned by Coordinator and used under its mutex.
#ifndef MUSTER_COORDINATOR_CHECKPOINT_CATALOG_H_
#define MUSTER_COORDINATOR_CHECKPOINT_CATALOG_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/checkpoint_record.h"
#include "coordinator/limits.h"
#include "coordinator/state_store.h"

namespace muster {

struct CatalogOptions {
  // Committed checkpoints kept; older ones are retired. 0 keeps all.
  uint32_t keep_last = 3;
  // Also keep the best committed checkpoint by this metric ("" = none).
  std::string keep_best_metric;
  // True: larger is better (accuracy); false: smaller is better (loss).
  bool keep_best_larger = false;
};

struct ShardReport {
  std::string member;
  std::vector<ShardFileRecord> files;
  std::string metric_name;
  double metric_value = 0;
};

class CheckpointCatalog {
 public:
  // `store` must outlive the catalog.
  CheckpointCatalog(StateStore* store, CatalogOptions options, Limits limits);

  // Reads every record from the store.
  absl::Status Load();
  // Changes go to `writer` (which must make them durable) instead of the
  // store.
  void set_writer(std::function<void(const CheckpointRecord&)> writer) {
    writer_ = std::move(writer);
  }

  // Starts (or joins) the checkpoint of `step` in `generation` whose world is
  // `members`. Every member naming the same generation and step gets the
  // same id. `wall_now` (Clock::WallNow: a record, stored) becomes its
  // created time. Errors: INVALID_ARGUMENT (negative step), ALREADY_EXISTS
  // (that step is already committed), UNAVAILABLE (store write failed).
  absl::StatusOr<uint64_t> Begin(uint64_t generation, int64_t step,
                                 const std::vector<std::string>& members, absl::Time wall_now);

  // Records one member's files; returns true when this report committed the
  // checkpoint, whose committed time is then `wall_now` (Clock::WallNow).
  // Reporting twice replaces the member's files. Errors:
  // NOT_FOUND (no such id), INVALID_ARGUMENT (bad file fields, too many
  // files), PERMISSION_DENIED (member not in that generation's world),
  // ABORTED (checkpoint aborted), FAILED_PRECONDITION (already committed or
  // retired), UNAVAILABLE (store write failed).
  absl::StatusOr<bool> Report(uint64_t id, const ShardReport& report, absl::Time wall_now);

  // Marks a pending checkpoint aborted. Errors: NOT_FOUND,
  // FAILED_PRECONDITION (already committed), UNAVAILABLE.
  absl::Status Abort(uint64_t id, const std::string& reason);

  // Aborts every pending checkpoint of generations before `generation`.
  absl::Status AbortBefore(uint64_t generation, const std::string& reason);

  // Newest first. `all` = false gives committed checkpoints only.
  std::vector<CheckpointRecord> List(bool all) const;
  // The newest committed checkpoint, or nullptr.
  const CheckpointRecord* LatestCommitted() const;
  size_t committed_count() const;

 private:
  absl::Status Save(CheckpointRecord record);
  absl::Status ApplyRetention();

  StateStore* store_;
  std::function<void(const CheckpointRecord&)> writer_;
  CatalogOptions options_;
  Limits limits_;
  std::map<uint64_t, CheckpointRecord> records_;
  uint64_t next_id_ = 1;
};

}  // namespace muster

#endif  // MUSTER_COORDINATOR_CHECKPOINT_CATALOG_H_
