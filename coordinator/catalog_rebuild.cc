#include "coordinator/catalog_rebuild.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/checkpoint_manifest.h"
#include "common/clock.h"
#include "common/file_system.h"
#include "common/status_macros.h"

namespace muster {
namespace {

// The record of DIR/step-S, or why it cannot be one.
absl::StatusOr<CheckpointRecord> FromStepDir(FileSystem* fs, const std::string& dir,
                                             Clock* clock) {
  MUSTER_ASSIGN_OR_RETURN(const CheckpointOnDisk found, ReadCheckpointOnDisk(fs, dir));
  CheckpointRecord r;
  r.step = found.manifest.meta.step;
  r.generation = found.manifest.meta.generation;
  const int world_size = std::max(1, found.manifest.meta.world_size);
  for (int rank = 0; rank < world_size; ++rank) {
    r.expected.push_back(absl::StrCat("rebuilt/", rank));
    r.reported.insert(r.expected.back());
  }
  for (const CheckpointOnDisk::File& f : found.files) {
    r.files.push_back(ShardFileRecord{"rebuilt/0", f.path, f.bytes, f.xxh3});
  }
  r.state = CheckpointState::kCommitted;
  r.created = r.committed =
      found.written == absl::InfinitePast() ? clock->WallNow() : found.written;
  return r;
}

}  // namespace

absl::StatusOr<RebuiltCatalog> RebuildCatalog(const std::string& checkpoint_dir, Clock* clock) {
  FileSystem* fs = DefaultFileSystem();
  absl::StatusOr<std::vector<std::string>> names = fs->ListDir(checkpoint_dir);
  if (!names.ok()) {
    return absl::NotFoundError(absl::StrCat("cannot read checkpoint directory ", checkpoint_dir,
                                            ": ", names.status().message()));
  }
  std::vector<std::pair<int64_t, std::string>> steps;
  for (const std::string& name : *names) {
    int64_t step = 0;
    if (ParseStepDirName(name, &step)) {
      steps.emplace_back(step, name);
    }
  }
  std::sort(steps.begin(), steps.end());
  RebuiltCatalog out;
  for (const auto& [step, name] : steps) {
    absl::StatusOr<CheckpointRecord> r = FromStepDir(fs, checkpoint_dir + "/" + name, clock);
    if (!r.ok()) {
      out.skipped.push_back(absl::StrCat(name, ": ", r.status().message()));
      continue;
    }
    if (r->step != step) {
      out.skipped.push_back(
          absl::StrCat(name, ": its manifest says step ", r->step, " (moved or renamed?)"));
      continue;
    }
    r->id = out.records.size() + 1;
    out.records.push_back(*std::move(r));
  }
  return out;
}

}  // namespace muster
