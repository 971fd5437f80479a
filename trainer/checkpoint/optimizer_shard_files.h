// Sharded optimizer state in checkpoints (docs/sharding.md, "Checkpoints"):
// each rank of a world of W writes the state of the shard it owns as
// optimizer-shard-<r>-of-<W>.safetensors, and the W files consolidate into
// one optimizer.safetensors in the unsharded format ("<param>.<field>").
//
// A shard file holds, for each parameter group g of the layout, the
// group's fields over the shard's element range: "<g>.<field>", a 1-D
// tensor of the range's size for a per-element field, the field as saved
// for a scalar one (a step count). Its metadata says what a reader needs
// without the program that wrote it: the format, the shard and the world,
// and in "layout" (JSON) each group's elements, the shard's range, its
// parameters (names and shapes, in the group's order) and its fields
// (name, per element or not). No LibTorch: `muster checkpoints
// --consolidate` links it.
//
// Thread-safety: pure functions.
#ifndef MUSTER_TRAINER_CHECKPOINT_OPTIMIZER_SHARD_FILES_H_
#define MUSTER_TRAINER_CHECKPOINT_OPTIMIZER_SHARD_FILES_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/file_system.h"
#include "trainer/checkpoint/safetensors.h"

namespace muster {

inline constexpr char kShardFileFormat[] = "muster-optimizer-shard-1";

// "optimizer-shard-<shard>-of-<world>.safetensors".
std::string ShardFileName(int shard, int world);
// Whether `base_name` is a shard file's name (any shard, any world).
bool IsShardFileName(const std::string& base_name);

struct ShardFileParam {
  std::string name;  // as the unsharded file names it, without ".<field>"
  std::vector<int64_t> shape;
};

struct ShardFileField {
  std::string name;          // the codec's ("exp_avg", "step")
  bool per_element = false;  // true: `data` holds the range's elements
  TensorRef data;            // its name is ignored; "<g>.<name>" in the file
};

struct ShardFileGroup {
  int64_t elements = 0;        // the group's trained elements, all shards
  int64_t begin = 0, end = 0;  // this shard's range of them
  std::vector<ShardFileParam> params;
  // Empty: the shard has no state for the group (never stepped).
  std::vector<ShardFileField> fields;
};

// Writes shard `shard` of `world` to `path` (under a temporary name,
// synced, then renamed). Errors: the file system's; INVALID_ARGUMENT for a
// per-element field whose size is not the range's, or an unknown dtype.
absl::StatusOr<WrittenFile> WriteShardFile(FileSystem* fs, const std::string& path, int shard,
                                           int world, const std::vector<ShardFileGroup>& groups);

// The unsharded optimizer file, in memory, from the shard files of one
// checkpoint: `files` by base name (other names are ignored), `dir` for
// messages. Every per-element field of every parameter is put together
// from the shards' ranges; a scalar field is the first shard's that holds
// the group's state. DATA_LOSS naming the file and what is wrong: a shard
// missing, files of two world sizes, a layout that is not valid JSON or
// disagrees between shards, ranges that do not tile a group, a tensor
// missing or of the wrong size. NOT_FOUND when there is no shard file.
absl::StatusOr<SafetensorsFile> ConsolidateShards(
    const std::map<std::string, SafetensorsFile>& files, const std::string& dir);

// A shard file as a checkpoint's catalog names it, with its XXH3-64.
struct ShardFileRef {
  std::string path;
  std::string xxh3;
};

// One shard file's groups (fields' data into the file, valid during the
// call) and its path.
using ShardFileVisitor =
    std::function<absl::Status(const std::string& path, const std::vector<ShardFileGroup>&)>;

// The shard files of one checkpoint (`files`; other names are ignored)
// read one at a time, in shard order, each checked against its checksum
// and its layout against the shards before it as ConsolidateShards checks
// them, and handed to `visit`: a load that keeps some ranges holds one
// file, not the whole state. Errors: ConsolidateShards' DATA_LOSS (the
// ranges' cover is checked after the last file, so a visitor builds
// aside), NOT_FOUND for no shard file, `visit`'s, the file system's.
absl::Status VisitShardFiles(FileSystem* fs, const std::vector<ShardFileRef>& files,
                             const ShardFileVisitor& visit);

// Writes the consolidated file of the checkpoint directory `dir` (its
// manifest's shard files, checked against the manifest's checksums) to
// `dir`/optimizer.safetensors, under a temporary name then renamed; the
// manifest is left as it is. Returns the path. Errors: as
// ConsolidateShards, the manifest's, the file system's.
absl::StatusOr<std::string> ConsolidateCheckpointDir(FileSystem* fs, const std::string& dir);

}  // namespace muster

#endif  // MUSTER_TRAINER_CHECKPOINT_OPTIMIZER_SHARD_FILES_H_
