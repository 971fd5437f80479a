// CatalogCheckpointer: checkpoints bound to the coordinator's two-phase
// catalog. A checkpoint of step S goes
//
//   Begin (every rank, same S) ──> rank 0: Snapshot ──> write in background
//                                      │                    │ ok       │ error
//   other ranks: report no files       │                    v          v
//                                      │               ReportShard  AbortCheckpoint
//                                      │                    │ committed
//                                      v                    v
//                                                      retention (remove files of
//                                                      checkpoints the catalog retired)
//
// The state is replicated, so rank 0 writes it and the others only report.
// A checkpoint that cannot begin or be written is logged and skipped:
// training goes on. Resume() restores the newest committed checkpoint whose
// files verify, falling back to older ones.
//
// Thread-safety: training thread, except the write callback, which runs on
// the checkpointer's writer thread and touches only the client (thread-safe)
// and the committed counter (atomic).
#ifndef MUSTER_TRAINER_ELASTIC_CATALOG_CHECKPOINTER_H_
#define MUSTER_TRAINER_ELASTIC_CATALOG_CHECKPOINTER_H_

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/file_system.h"
#include "trainer/checkpoint/checkpointer.h"
#include "trainer/client/coordinator_client.h"

namespace muster {

struct CatalogCheckpointerOptions {
  std::string dir;
  int64_t every_steps = 0;        // 0: not by steps
  double interval_seconds = 0;    // 0: not by time
  std::string model_name, optimizer_name;  // recorded in the manifest
  FileSystem* fs = nullptr;       // default: the real file system
};

class CatalogCheckpointer {
 public:
  CatalogCheckpointer(CatalogCheckpointerOptions options, TrainingState state);

  // The newest committed checkpoint that verifies, loaded into the state;
  // nullopt-like NOT_FOUND when there is none. Errors: the catalog's.
  absl::StatusOr<CheckpointMeta> Resume(CoordinatorClient* client);
  // Whether the schedule asks for a checkpoint after `step`.
  bool Due(int64_t step) const;
  // Checkpoints the state after `meta.step` as rank `rank` (see the top);
  // the model and optimizer names come from the options. Errors only for a
  // snapshot that could not be taken (host memory).
  absl::Status Take(CoordinatorClient* client, int rank, CheckpointMeta meta);
  // Waits until no write is running.
  void Wait() { checkpointer_.Wait(); }
  // Before an optimizer update (Checkpointer::BeforeUpdate).
  void BeforeUpdate() { checkpointer_.BeforeUpdate(); }
  int committed() const { return committed_->load(); }

 private:
  const CatalogCheckpointerOptions options_;
  FileSystem* const fs_;
  Checkpointer checkpointer_;
  absl::Time last_ = absl::Now();
  // Shared with write callbacks.
  std::shared_ptr<std::atomic<int>> committed_ = std::make_shared<std::atomic<int>>(0);
};

}  // namespace muster

#endif  // MUSTER_TRAINER_ELASTIC_CATALOG_CHECKPOINTER_H_
