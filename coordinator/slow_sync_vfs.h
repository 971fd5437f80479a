// A SQLite VFS whose fsyncs are slow: the default VFS, with every xSync
// delayed, as on a shared file system under load. For benchmarks and tests
// (the coordinator's --state-sync-delay); production never uses it.
#ifndef MUSTER_COORDINATOR_SLOW_SYNC_VFS_H_
#define MUSTER_COORDINATOR_SLOW_SYNC_VFS_H_

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace muster {

// The name of a VFS (for sqlite3_open_v2) whose fsyncs each take `delay`
// longer; one is registered per distinct delay, so stores with different
// delays in one process keep their own. Thread-safe. Errors: INTERNAL when
// SQLite refuses the registration.
absl::StatusOr<const char*> SlowSyncVfs(absl::Duration delay);

}  // namespace muster

#endif  // MUSTER_COORDINATOR_SLOW_SYNC_VFS_H_
