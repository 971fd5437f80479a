// manifest.json, the last file of a checkpoint directory (docs/checkpoints.md):
// where the checkpoint stands in training and the checksum of every other
// file. The trainer writes and loads it; the coordinator reads it to rebuild
// a lost catalog. Both go through this codec, so they accept the same
// manifests.
#ifndef MUSTER_COMMON_CHECKPOINT_MANIFEST_H_
#define MUSTER_COMMON_CHECKPOINT_MANIFEST_H_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/file_system.h"

namespace muster {

inline constexpr char kCheckpointFormat[] = "muster-checkpoint-1";
inline constexpr char kManifestName[] = "manifest.json";

// Where a checkpoint stands in training.
struct CheckpointMeta {
  int64_t step = 0;
  int64_t epoch = 0;
  int64_t sample_offset = 0;
  uint64_t generation = 0;
  int world_size = 0;
  int lr_world_size = 0;  // the world size the learning rate is scaled for
  // Examples a salvaged step handed back to the sampler (see sampler.h),
  // trained on next; of epoch `returned_epoch`.
  int64_t returned_epoch = 0;
  std::vector<int64_t> returned_examples;
  std::string model;
  std::string optimizer;  // the optimizer's codec name ("sgd", "adamw", ...)
  std::string rng_state;  // hex of the CPU generator's state
};

struct ManifestFile {
  uint64_t bytes = 0;
  std::string xxh3;  // 16 hex digits
};

struct CheckpointManifest {
  CheckpointMeta meta;
  std::map<std::string, ManifestFile> files;  // by name within the directory
};

std::string EncodeManifest(const CheckpointManifest& manifest);
// `path` names the file in errors. INVALID_ARGUMENT: JSON of another format;
// DATA_LOSS naming the field: not JSON, a field missing, negative or of the
// wrong type, no files, a file name with a '/'.
absl::StatusOr<CheckpointManifest> DecodeManifest(std::string_view text, const std::string& path);

// A checkpoint's directory is `step-<S>` in the checkpoint directory: true
// and `*step` = S for such a name.
bool ParseStepDirName(std::string_view name, int64_t* step);

// A finished checkpoint as its directory holds it, found by its manifest
// alone (no catalog): what a restore checks every file against.
struct CheckpointOnDisk {
  CheckpointManifest manifest;
  struct File {
    std::string path;
    uint64_t bytes = 0;
    std::string xxh3;  // 16 hex digits
  };
  // The manifest's files, then manifest.json with the checksum of the
  // bytes read.
  std::vector<File> files;
  absl::Time written;  // manifest.json's modification time
};

// Reads `step_dir`/manifest.json and checks that each file it names is
// there with the size it records (their checksums are for the restore to
// check). Errors: NOT_FOUND (no manifest, or a file it names is missing),
// INVALID_ARGUMENT (a manifest over 16 MiB, or of another format),
// DATA_LOSS (a damaged manifest, a file of another size).
absl::StatusOr<CheckpointOnDisk> ReadCheckpointOnDisk(FileSystem* fs, const std::string& step_dir);

}  // namespace muster

#endif  // MUSTER_COMMON_CHECKPOINT_MANIFEST_H_
