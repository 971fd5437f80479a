#include "coordinator/catalog_rebuild.h"

#include <sys/stat.h>
#include <xxhash.h>

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/file_system.h"
#include "nlohmann/json.hpp"

namespace muster {
namespace {

// Larger manifests are not ours.
constexpr uint64_t kMaxManifestBytes = 16 << 20;

// The record of DIR/step-S, or why it cannot be one.
absl::StatusOr<CheckpointRecord> FromStepDir(FileSystem* fs, const std::string& dir) {
  const std::string path = dir + "/manifest.json";
  absl::StatusOr<std::string> read = fs->ReadFile(path, kMaxManifestBytes);
  if (absl::IsNotFound(read.status())) return absl::NotFoundError("no manifest.json");
  if (absl::IsResourceExhausted(read.status())) {
    return absl::InvalidArgumentError("manifest.json is larger than 16 MiB");
  }
  if (!read.ok()) return read.status();
  const std::string& text = *read;
  const nlohmann::json m = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (m.is_discarded() || !m.is_object()) {
    return absl::DataLossError("manifest.json is not a JSON object");
  }
  if (m.value("format", "") != "muster-checkpoint-1") {
    return absl::InvalidArgumentError("manifest.json is not format muster-checkpoint-1");
  }
  for (const char* field : {"step", "generation", "world_size"}) {
    if (!m.contains(field) || !m[field].is_number_unsigned()) {
      return absl::DataLossError(absl::StrCat("manifest.json: ", field, " is missing"));
    }
  }
  if (!m.contains("files") || !m["files"].is_object() || m["files"].empty()) {
    return absl::DataLossError("manifest.json lists no files");
  }
  CheckpointRecord r;
  r.step = m["step"].get<int64_t>();
  r.generation = m["generation"].get<uint64_t>();
  const int world_size = std::max(1, m["world_size"].get<int>());
  for (int rank = 0; rank < world_size; ++rank) {
    r.expected.push_back(absl::StrCat("rebuilt/", rank));
    r.reported.insert(r.expected.back());
  }
  for (const auto& [name, file] : m["files"].items()) {
    if (name.find('/') != std::string::npos || name == ".." || !file.is_object() ||
        !file.contains("bytes") || !file["bytes"].is_number_unsigned() ||
        !file.contains("xxh3") || !file["xxh3"].is_string()) {
      return absl::DataLossError(absl::StrCat("manifest.json: bad entry for file ", name));
    }
    const std::string file_path = dir + "/" + name;
    struct stat st;
    if (::stat(file_path.c_str(), &st) != 0) {
      return absl::NotFoundError(absl::StrCat(name, " is missing"));
    }
    const uint64_t bytes = file["bytes"].get<uint64_t>();
    if (static_cast<uint64_t>(st.st_size) != bytes) {
      return absl::DataLossError(
          absl::StrCat(name, " has ", st.st_size, " bytes, the manifest says ", bytes));
    }
    r.files.push_back(ShardFileRecord{"rebuilt/0", file_path, bytes, file["xxh3"]});
  }
  r.files.push_back(ShardFileRecord{"rebuilt/0", path, text.size(),
                                    absl::StrFormat("%016x", XXH3_64bits(text.data(),
                                                                         text.size()))});
  r.state = CheckpointState::kCommitted;
  struct stat st;
  r.created = r.committed =
      ::stat(path.c_str(), &st) == 0 ? absl::FromUnixSeconds(st.st_mtime) : absl::Now();
  return r;
}

}  // namespace

absl::StatusOr<RebuiltCatalog> RebuildCatalog(const std::string& checkpoint_dir) {
  FileSystem* fs = DefaultFileSystem();
  absl::StatusOr<std::vector<std::string>> names = fs->ListDir(checkpoint_dir);
  if (!names.ok()) {
    return absl::NotFoundError(absl::StrCat("cannot read checkpoint directory ", checkpoint_dir,
                                            ": ", names.status().message()));
  }
  std::vector<std::pair<int64_t, std::string>> steps;
  for (const std::string& name : *names) {
    int64_t step = 0;
    if (absl::StartsWith(name, "step-") && absl::SimpleAtoi(name.substr(5), &step)) {
      steps.emplace_back(step, name);
    }
  }
  std::sort(steps.begin(), steps.end());
  RebuiltCatalog out;
  for (const auto& [step, name] : steps) {
    absl::StatusOr<CheckpointRecord> r = FromStepDir(fs, checkpoint_dir + "/" + name);
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
