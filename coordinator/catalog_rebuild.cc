#include "coordinator/catalog_rebuild.h"

#include <xxhash.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/checkpoint_manifest.h"
#include "common/clock.h"
#include "common/file_system.h"
#include "common/status_macros.h"

namespace muster {
namespace {

// Larger manifests are not ours.
constexpr uint64_t kMaxManifestBytes = 16 << 20;

// The record of DIR/step-S, or why it cannot be one.
absl::StatusOr<CheckpointRecord> FromStepDir(FileSystem* fs, const std::string& dir,
                                             Clock* clock) {
  const std::string path = absl::StrCat(dir, "/", kManifestName);
  absl::StatusOr<std::string> read = fs->ReadFile(path, kMaxManifestBytes);
  if (absl::IsNotFound(read.status())) return absl::NotFoundError("no manifest.json");
  if (absl::IsResourceExhausted(read.status())) {
    return absl::InvalidArgumentError("manifest.json is larger than 16 MiB");
  }
  if (!read.ok()) return read.status();
  const std::string& text = *read;
  MUSTER_ASSIGN_OR_RETURN(const CheckpointManifest m, DecodeManifest(text, kManifestName));
  CheckpointRecord r;
  r.step = m.meta.step;
  r.generation = m.meta.generation;
  const int world_size = std::max(1, m.meta.world_size);
  for (int rank = 0; rank < world_size; ++rank) {
    r.expected.push_back(absl::StrCat("rebuilt/", rank));
    r.reported.insert(r.expected.back());
  }
  for (const auto& [name, file] : m.files) {
    const std::string file_path = dir + "/" + name;
    absl::StatusOr<FileStat> st = fs->Stat(file_path);
    if (absl::IsNotFound(st.status())) return absl::NotFoundError(absl::StrCat(name, " is missing"));
    if (!st.ok()) return st.status();
    if (st->bytes != file.bytes) {
      return absl::DataLossError(
          absl::StrCat(name, " has ", st->bytes, " bytes, the manifest says ", file.bytes));
    }
    r.files.push_back(ShardFileRecord{"rebuilt/0", file_path, file.bytes, file.xxh3});
  }
  r.files.push_back(ShardFileRecord{"rebuilt/0", path, text.size(),
                                    absl::StrFormat("%016x", XXH3_64bits(text.data(),
                                                                         text.size()))});
  r.state = CheckpointState::kCommitted;
  const absl::StatusOr<FileStat> st = fs->Stat(path);
  r.created = r.committed = st.ok() ? st->modified : clock->WallNow();
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
