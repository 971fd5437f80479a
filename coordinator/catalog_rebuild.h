// Rebuilding the checkpoint catalog from the checkpoints on disk, for a
// coordinator whose state database was lost or damaged
// (muster-coordinator --rebuild-catalog=CHECKPOINT_DIR).
//
// Every CHECKPOINT_DIR/step-<S>/manifest.json (docs/checkpoints.md) whose
// data files are all present with the sizes it records becomes a committed
// record: its files with the manifest's sizes and XXH3 checksums, the
// manifest itself checksummed here. Trainers verify every checksum again
// before they restore, as for any catalog entry.
#ifndef MUSTER_COORDINATOR_CATALOG_REBUILD_H_
#define MUSTER_COORDINATOR_CATALOG_REBUILD_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "coordinator/checkpoint_record.h"

namespace muster {

struct RebuiltCatalog {
  // By step, ids 1, 2, ...
  std::vector<CheckpointRecord> records;
  // One line per step directory that was not taken, saying why.
  std::vector<std::string> skipped;
};

// A checkpoint whose manifest has no time of its own is dated by its
// manifest's mtime, else clock->WallNow().
// Errors: NOT_FOUND when `checkpoint_dir` cannot be read.
absl::StatusOr<RebuiltCatalog> RebuildCatalog(const std::string& checkpoint_dir, Clock* clock);

}  // namespace muster

#endif  // MUSTER_COORDINATOR_CATALOG_REBUILD_H_
