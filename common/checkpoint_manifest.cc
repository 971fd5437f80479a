#include "common/checkpoint_manifest.h"

#include <xxhash.h>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace muster {

std::string EncodeManifest(const CheckpointManifest& manifest) {
  const CheckpointMeta& m = manifest.meta;
  nlohmann::json j = {{"format", kCheckpointFormat},
                      {"step", m.step},
                      {"epoch", m.epoch},
                      {"sample_offset", m.sample_offset},
                      {"generation", m.generation},
                      {"world_size", m.world_size},
                      {"lr_world_size", m.lr_world_size},
                      {"model", m.model},
                      {"optimizer", m.optimizer},
                      {"rng_state", m.rng_state}};
  if (!m.returned_examples.empty()) {
    j["returned_epoch"] = m.returned_epoch;
    j["returned_examples"] = m.returned_examples;
  }
  j["files"] = nlohmann::json::object();
  for (const auto& [name, f] : manifest.files) {
    j["files"][name] = {{"bytes", f.bytes}, {"xxh3", f.xxh3}};
  }
  return j.dump(1);
}

absl::StatusOr<CheckpointManifest> DecodeManifest(std::string_view text, const std::string& path) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::DataLossError(absl::StrCat(path, ": not a JSON object"));
  }
  if (j.value("format", "") != kCheckpointFormat) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not format ", kCheckpointFormat, " (format ",
                     j.contains("format") ? j["format"].dump() : "missing", ")"));
  }
  // Every count is a non-negative integer.
  for (const char* field : {"step", "epoch", "sample_offset", "generation", "world_size"}) {
    if (!j.contains(field) || !j[field].is_number_unsigned()) {
      return absl::DataLossError(absl::StrCat(path, ": field ", field,
                                              " is missing or not a non-negative integer"));
    }
  }
  CheckpointManifest out;
  CheckpointMeta& m = out.meta;
  m.step = j["step"].get<int64_t>();
  m.epoch = j["epoch"].get<int64_t>();
  m.sample_offset = j["sample_offset"].get<int64_t>();
  m.generation = j["generation"].get<uint64_t>();
  m.world_size = j["world_size"].get<int>();
  m.lr_world_size = m.world_size;
  if (j.contains("lr_world_size")) {
    if (!j["lr_world_size"].is_number_unsigned()) {
      return absl::DataLossError(
          absl::StrCat(path, ": field lr_world_size is not a non-negative integer"));
    }
    m.lr_world_size = j["lr_world_size"].get<int>();
  }
  for (auto [field, into] : {std::pair<const char*, std::string*>{"model", &m.model},
                             {"optimizer", &m.optimizer},
                             {"rng_state", &m.rng_state}}) {
    if (!j.contains(field)) continue;
    if (!j[field].is_string()) {
      return absl::DataLossError(absl::StrCat(path, ": field ", field, " is not a string"));
    }
    *into = j[field].get<std::string>();
  }
  if (j.contains("returned_examples")) {
    const nlohmann::json& r = j["returned_examples"];
    if (!r.is_array() || !j.contains("returned_epoch") || !j["returned_epoch"].is_number_unsigned()) {
      return absl::DataLossError(absl::StrCat(
          path, ": returned_examples must be an array with an integer returned_epoch"));
    }
    for (const nlohmann::json& i : r) {
      if (!i.is_number_unsigned()) {
        return absl::DataLossError(
            absl::StrCat(path, ": returned_examples holds ", i.dump(), ", not an example index"));
      }
      m.returned_examples.push_back(i.get<int64_t>());
    }
    m.returned_epoch = j["returned_epoch"].get<int64_t>();
  }
  if (!j.contains("files") || !j["files"].is_object() || j["files"].empty()) {
    return absl::DataLossError(absl::StrCat(path, ": lists no files"));
  }
  for (const auto& [name, f] : j["files"].items()) {
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == ".." ||
        !f.is_object() || !f.contains("bytes") || !f["bytes"].is_number_unsigned() ||
        !f.contains("xxh3") || !f["xxh3"].is_string()) {
      return absl::DataLossError(absl::StrCat(path, ": bad entry for file ", name));
    }
    out.files[name] = ManifestFile{f["bytes"].get<uint64_t>(), f["xxh3"].get<std::string>()};
  }
  return out;
}

bool ParseStepDirName(std::string_view name, int64_t* step) {
  absl::string_view rest(name.data(), name.size());
  return absl::ConsumePrefix(&rest, "step-") && absl::SimpleAtoi(rest, step);
}

absl::StatusOr<CheckpointOnDisk> ReadCheckpointOnDisk(FileSystem* fs, const std::string& step_dir) {
  constexpr uint64_t kMaxManifestBytes = 16 << 20;  // larger manifests are not ours
  const std::string path = absl::StrCat(step_dir, "/", kManifestName);
  absl::StatusOr<std::string> read = fs->ReadFile(path, kMaxManifestBytes);
  if (absl::IsNotFound(read.status())) return absl::NotFoundError("no manifest.json");
  if (absl::IsResourceExhausted(read.status())) {
    return absl::InvalidArgumentError("manifest.json is larger than 16 MiB");
  }
  if (!read.ok()) return read.status();
  CheckpointOnDisk out;
  MUSTER_ASSIGN_OR_RETURN(out.manifest, DecodeManifest(*read, kManifestName));
  for (const auto& [name, file] : out.manifest.files) {
    const std::string file_path = absl::StrCat(step_dir, "/", name);
    absl::StatusOr<FileStat> st = fs->Stat(file_path);
    if (absl::IsNotFound(st.status())) {
      return absl::NotFoundError(absl::StrCat(name, " is missing"));
    }
    if (!st.ok()) return st.status();
    if (st->bytes != file.bytes) {
      return absl::DataLossError(
          absl::StrCat(name, " has ", st->bytes, " bytes, the manifest says ", file.bytes));
    }
    out.files.push_back({file_path, file.bytes, file.xxh3});
  }
  out.files.push_back(
      {path, read->size(), absl::StrFormat("%016x", XXH3_64bits(read->data(), read->size()))});
  const absl::StatusOr<FileStat> st = fs->Stat(path);
  out.written = st.ok() ? st->modified : absl::InfinitePast();
  return out;
}

}  // namespace muster
