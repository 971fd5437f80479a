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
// Take and Wait say what failed; the engine skips a scheduled checkpoint
// that fails (training goes on) and retries the one a stop needs. Resume() restores the newest committed checkpoint whose
// files verify, falling back to older ones.
//
// Thread-safety: training thread, except the write callback, which runs on
// the checkpointer's writer thread and touches only the client (thread-safe)
// and the shared Outcome (its own mutex).
#ifndef MUSTER_TRAINER_ELASTIC_CATALOG_CHECKPOINTER_H_
#define MUSTER_TRAINER_ELASTIC_CATALOG_CHECKPOINTER_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/file_system.h"
#include "trainer/checkpoint/checkpointer.h"
#include "trainer/client/coordinator_client.h"
#include "trainer/comm/communicator.h"
#include "trainer/elastic/optimizer_shards.h"

namespace muster {

struct CatalogCheckpointerOptions {
  std::string dir;
  int64_t every_steps = 0;        // 0: not by steps
  double interval_seconds = 0;    // 0: not by time
  std::string model_name, optimizer_name;  // recorded in the manifest
  FileSystem* fs = nullptr;       // default: the real file system
  // Times interval_seconds and the writes (monotonic Now()); the catalog
  // calls' deadlines are times of it too, so it must be the client's
  // (ClientOptions::clock). Required, not owned, must outlive this.
  Clock* clock = nullptr;
};

class CatalogCheckpointer {
 public:
  CatalogCheckpointer(CatalogCheckpointerOptions options, TrainingState state);

  // The newest committed checkpoint that verifies, loaded into the state;
  // where none in the catalog does, the newest finished one of the
  // directory that verifies (its manifest names every file and checksum);
  // nullopt-like NOT_FOUND when there is none. Errors: the catalog's.
  // `deferred`: as LoadCheckpoint's (the optimizer state of a checkpoint
  // written sharded is left to the caller).
  absl::StatusOr<CheckpointMeta> Resume(CoordinatorClient* client,
                                        std::vector<ShardFileRef>* deferred = nullptr);
  // For a world that begins at step 0 (nothing resumed, no live peer
  // ahead): INVALID_ARGUMENT where the directory holds a finished
  // checkpoint all the same (a step-<S> with its manifest, which Resume
  // could not load), naming the newest and what to do: the run would
  // write its own checkpoints of the same steps over those, and retention
  // would remove the rest. OK where there is none.
  absl::Status RefuseCheckpointsNotOffered() const;
  FileSystem* fs() const { return fs_; }
  // Whether the step schedule (every_steps) asks for a checkpoint after
  // `step`: the same on every rank.
  bool DueAtStep(int64_t step) const;
  // Whether interval_seconds have passed on this rank's clock since the
  // last Take (or the start). Each rank's clock answers on its own: the
  // ranks agree through the step's control words (step_policy.h) first.
  bool DueByTime() const;
  // A checkpoint was due after a step whose boundary regrouped: a joiner of
  // that world began the next step at once, so the checkpoint's
  // collectives would have met its gradient all-reduce. It is taken after
  // the next step instead, by every rank: this rank says so in that step's
  // control words. Training thread.
  void set_deferred(bool deferred) { deferred_ = deferred; }
  bool deferred() const { return deferred_; }
  // Checkpoints the state after `meta.step` as rank `rank` (see the top);
  // the model and optimizer names come from the options; each call to the
  // catalog waits up to `call_timeout`. Errors: this rank's part could not
  // begin or be reported (the catalog's error), or rank 0's snapshot could
  // not be taken (host memory). A step the catalog already holds committed
  // counts as done.
  absl::Status Take(CoordinatorClient* client, int rank, CheckpointMeta meta,
                    absl::Duration call_timeout = absl::Seconds(30));
  // The checkpoint a stop needs, as every rank of `comm` agrees (a
  // collective): Take, then Wait, and the ranks sum their failures, which
  // is also a barrier (a departure would abort the checkpoint before it
  // commits). A failed attempt (the catalog unreachable, a full or
  // read-only file system) is tried once more. With `own` (sharded
  // optimizer state: OptimizerState::OwnShard) each attempt is TakeSharded's, a
  // file a rank, rather than Take's whole state from rank 0. Returns
  // whether it committed. Errors: the communicator's (`deadline` for each
  // agreement).
  absl::StatusOr<bool> TakeToStop(CoordinatorClient* client, Communicator* comm, int rank,
                                  const CheckpointMeta& meta, absl::Time deadline,
                                  const absl::StatusOr<OwnShardState>* own = nullptr);
  // Sharded optimizer state (docs/sharding.md, "Checkpoints"): a
  // collective over `comm`, every rank with the same `meta`. Each rank
  // writes the file of the shard it owns (`own`, OptimizerState::OwnShard) into
  // the step's directory, at once; the ranks then tell each other each
  // file's size and checksum (one all-reduce of 3 W words), and rank 0
  // snapshots the model and extras and writes them and the manifest, which
  // names every shard file, in the background as Take does, and reports
  // every file. Returns whether the checkpoint went ahead (false: a rank
  // could not begin it or write its file; every rank logs why, rank 0
  // aborts it, and Wait says so). Errors: the communicator's.
  absl::StatusOr<bool> TakeSharded(CoordinatorClient* client, Communicator* comm, int rank,
                                   CheckpointMeta meta, const absl::StatusOr<OwnShardState>& own,
                                   absl::Time deadline,
                                   absl::Duration call_timeout = absl::Seconds(30));
  // Waits until no write is running. The outcome of this rank's part of the
  // last Take: OK once it is written (rank 0) and reported, else what failed.
  absl::Status Wait();
  // Before an optimizer update (Checkpointer::BeforeUpdate).
  void BeforeUpdate() { checkpointer_.BeforeUpdate(); }
  // Checkpointer::staged_bytes.
  int64_t staged_bytes() const { return checkpointer_.staged_bytes(); }
  // Checkpoints this rank wrote and reported (rank 0).
  int committed() const;
  // The newest step this process knows to be committed: the one it resumed
  // from, or one whose commit its report completed; -1 when none.
  int64_t newest_committed() const;
  // The step of the newest committed checkpoint as the catalog says (this
  // rank's own reports need not have seen the last commit), else as this
  // rank knows; 0 when none.
  int64_t NewestInCatalog(CoordinatorClient* client) const;

 private:
  // The steps of the directory's step-<S> that hold a manifest, newest
  // first.
  std::vector<int64_t> FinishedSteps() const;
  // The finished checkpoint in `dir` (step `step`), verified and loaded as
  // Resume loads one of the catalog's.
  absl::StatusOr<CheckpointMeta> LoadOnDisk(const std::string& dir, int64_t step,
                                            std::vector<ShardFileRef>* deferred) const;
  absl::Status Write(CoordinatorClient* client, uint64_t id, CheckpointMeta meta,
                     std::vector<FileReport> shard_files, absl::Duration call_timeout);
  // TakeSharded's part before the exchange: this rank's file, written.
  absl::StatusOr<FileReport> WriteOwnShard(int64_t step, const absl::StatusOr<OwnShardState>& own,
                                           int rank, int world);

  // What the writer's callback and the training thread share.
  struct Outcome {
    mutable absl::Mutex mu;
    absl::Status last ABSL_GUARDED_BY(mu);  // of the last Take
    int committed ABSL_GUARDED_BY(mu) = 0;
    int64_t newest_committed ABSL_GUARDED_BY(mu) = -1;
    void Set(absl::Status s);
    void Committed(int64_t step);
  };

  const CatalogCheckpointerOptions options_;
  FileSystem* const fs_;
  Checkpointer checkpointer_;
  Clock* const clock_;
  absl::Time last_;  // the last Take, or the start
  bool deferred_ = false;
  const std::shared_ptr<Outcome> outcome_ = std::make_shared<Outcome>();
};

}  // namespace muster

#endif  // MUSTER_TRAINER_ELASTIC_CATALOG_CHECKPOINTER_H_
