// Checkpointer: asynchronous, checksummed checkpoints of a model and its
// optimizer in safetensors files.
//
// A checkpoint of step S is the directory DIR/step-<S>/ holding
// model.safetensors (parameters "param.<name>" and buffers "buffer.<name>"),
// optimizer.safetensors ("<param name>.<field>", e.g. "fc1.weight.momentum_buffer"),
// extra.safetensors when the state has extras ("tensor.<name>", "blob.<name>")
// and manifest.json (step, epoch, sample offset, generation, world size,
// model and optimizer names, RNG state, and every file's bytes and xxh3).
// Every file is written under a temporary name, fsynced, renamed, and the
// directory fsynced; only then is the checkpoint reported.
//
// Snapshot() blocks only while the state is copied into host buffers that
// are reused from one checkpoint to the next; writing and checksumming run
// on a background thread. A new snapshot waits for the previous write. On the
// GPU, Snapshot only queues the copies: they run on a side stream into the
// same buffers, pinned (DeviceCopier), while training goes on; call
// BeforeUpdate() before every optimizer update so that the update waits (on
// the GPU) until the parameters it changes are copied.
//
// Thread-safety: Snapshot/Wait from the training thread; the callback runs on
// the writer thread.
#ifndef MUSTER_TRAINER_CHECKPOINT_CHECKPOINTER_H_
#define MUSTER_TRAINER_CHECKPOINT_CHECKPOINTER_H_

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdlib>
#include <memory>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/checkpoint_manifest.h"
#include "common/mutex.h"
#include "common/clock.h"
#include "common/file_system.h"
#include "trainer/checkpoint/device_copy.h"
#include "trainer/checkpoint/optimizer_shard_files.h"
#include "trainer/checkpoint/training_state.h"

namespace muster {

struct FileReport {
  std::string path;
  uint64_t bytes = 0;
  std::string xxh3;
};

struct CheckpointTiming {
  double blocking_seconds = 0;  // Snapshot() taking the state, until it returned
  double backlog_seconds = 0;   // Snapshot() first waiting for the previous write
  double copy_seconds = 0;      // GPU time of the device-to-host copies (0 on the CPU)
  double write_seconds = 0;     // background write of all files
  uint64_t bytes = 0;
  uint64_t device_bytes = 0;  // of them, copied from the GPU
};

class Checkpointer {
 public:
  using Done = std::function<void(absl::StatusOr<std::vector<FileReport>>, CheckpointTiming)>;

  // What `state` points to must outlive the checkpointer. `clock` times
  // the snapshots and the writes (CheckpointTiming); required, not owned,
  // must outlive the checkpointer.
  Checkpointer(std::string dir, TrainingState state, Clock* clock,
               FileSystem* fs = DefaultFileSystem());
  Checkpointer(std::string dir, torch::nn::Module& model, torch::optim::Optimizer& optimizer,
               Clock* clock, FileSystem* fs = DefaultFileSystem());
  ~Checkpointer();

  // Copies the state of `meta.step` to host memory and returns; `done` runs
  // on the writer thread with the written files or the error (the partial
  // files are then removed). Waits for a previous write first.
  absl::Status Snapshot(const CheckpointMeta& meta, Done done);
  // The same for sharded optimizer state: no optimizer.safetensors; the
  // shard files every rank wrote (optimizer_shard_files.h), already in the
  // step's directory, are named in the manifest and in `done`'s files.
  absl::Status Snapshot(const CheckpointMeta& meta, std::vector<FileReport> shard_files, Done done);
  // Waits until no write is running; the outcome of the last write (OK
  // when none was asked for): its error, or OK once its files are written.
  absl::Status Wait();
  // Before an optimizer update: on the GPU, the training stream waits for
  // the pending snapshot's copies (the host does not block). Cheap otherwise.
  void BeforeUpdate();

  // The bytes of the host copy checkpoints are written from: kept, once
  // made, for the next checkpoint. Training thread.
  int64_t staged_bytes() const { return static_cast<int64_t>(arena_capacity_); }
  // The directory of step `step`.
  std::string StepDir(int64_t step) const;
  const TrainingState& state() const { return state_; }

 private:
  // One file, laid out in the arena exactly as it will be on disk.
  struct Image {
    std::string name;
    size_t offset = 0;  // in the arena; aligned for direct I/O
    size_t size = 0;    // exact file size
  };
  // Each file's name and tensors, in file order.
  using FileTensors = std::vector<std::pair<std::string, NamedTensors>>;
  // Grows the arena to `total` bytes (unpinning the old one).
  absl::Status EnsureArena(size_t total);
  // Writes each file's prefix into its image and queues its tensors' copies
  // behind it (DeviceCopier: at once on the CPU, on a side stream from GPUs).
  void CopyIntoArena(const FileTensors& files, const std::vector<std::string>& prefixes);
  void WriterLoop();
  absl::StatusOr<std::vector<FileReport>> Write(const CheckpointMeta& meta,
                                                const std::vector<FileReport>& shard_files,
                                                uint64_t* bytes);

  const std::string dir_;
  const TrainingState state_;
  Clock* const clock_;
  FileSystem* const fs_;

  Mutex mu_;
  CondVar cv_;
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool has_job_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status last_write_ ABSL_GUARDED_BY(mu_);
  CheckpointMeta meta_ ABSL_GUARDED_BY(mu_);
  std::vector<FileReport> shard_files_ ABSL_GUARDED_BY(mu_);  // of the pending write
  Done done_ ABSL_GUARDED_BY(mu_);
  double blocking_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  double backlog_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  // Host copies, reused across checkpoints: the images of the model and the
  // optimizer files, page-aligned so that they go to disk without another
  // copy (O_DIRECT) where the file system allows it.
  std::unique_ptr<char, void (*)(void*)> arena_{nullptr, &std::free};
  size_t arena_capacity_ = 0;
  bool arena_pinned_ = false;
  DeviceCopier copier_;
  std::vector<Image> images_;
  std::thread writer_;
};

// Verifies `files` (path -> expected xxh3) of a checkpoint and loads it into
// `state`. Errors: DATA_LOSS naming the file and what is wrong (checksum,
// header, missing tensor, shape or dtype mismatch, a blob its load rejects),
// NOT_FOUND for a missing file. Every tensor is checked before any is
// changed; blobs are loaded last, after every tensor was written.
// `deferred` non-null: where the optimizer state was written sharded (shard
// files, no optimizer.safetensors), it is left out of the load (the shard
// files are verified against their checksums one at a time, not kept) and
// the shard files are put in `*deferred`, for LoadOptimizerFromShards or a
// sharded load (OptimizerShards::Load).
absl::StatusOr<CheckpointMeta> LoadCheckpoint(const std::vector<FileReport>& files,
                                              const TrainingState& state,
                                              FileSystem* fs = DefaultFileSystem(),
                                              std::vector<ShardFileRef>* deferred = nullptr);

// The optimizer state of `state` from a checkpoint's shard files, put
// together whole (ConsolidateShards) and loaded as LoadCheckpoint loads an
// unsharded file. Errors: as LoadCheckpoint's.
absl::Status LoadOptimizerFromShards(const std::vector<ShardFileRef>& files,
                                     const TrainingState& state, FileSystem* fs);

}  // namespace muster

#endif  // MUSTER_TRAINER_CHECKPOINT_CHECKPOINTER_H_
