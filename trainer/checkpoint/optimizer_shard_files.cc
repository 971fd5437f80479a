#include "trainer/checkpoint/optimizer_shard_files.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/checkpoint_manifest.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace muster {
namespace {

constexpr char kPrefix[] = "optimizer-shard-";
constexpr char kSuffix[] = ".safetensors";
constexpr char kOptimizerFile[] = "optimizer.safetensors";
uint64_t Elements(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

// A shard file's name split into its shard and world; false when it is not one.
bool ParseShardFileName(const std::string& name, int* shard, int* world) {
  if (name.rfind(kPrefix, 0) != 0 || name.size() <= sizeof(kSuffix) ||
      name.compare(name.size() - (sizeof(kSuffix) - 1), std::string::npos, kSuffix) != 0) {
    return false;
  }
  const std::string middle =
      name.substr(sizeof(kPrefix) - 1, name.size() - (sizeof(kPrefix) - 1) - (sizeof(kSuffix) - 1));
  std::vector<std::string> parts = absl::StrSplit(middle, "-of-");
  return parts.size() == 2 && absl::SimpleAtoi(parts[0], shard) &&
         absl::SimpleAtoi(parts[1], world) && *world > 0 && *shard >= 0 && *shard < *world;
}

nlohmann::json LayoutJson(const std::vector<ShardFileGroup>& groups) {
  nlohmann::json layout = nlohmann::json::array();
  for (const ShardFileGroup& g : groups) {
    nlohmann::json params = nlohmann::json::array();
    for (const ShardFileParam& p : g.params)
      params.push_back({{"name", p.name}, {"shape", p.shape}});
    nlohmann::json fields = nlohmann::json::array();
    for (const ShardFileField& f : g.fields) {
      fields.push_back({{"name", f.name}, {"per_element", f.per_element}});
    }
    layout.push_back({{"elements", g.elements},
                      {"begin", g.begin},
                      {"end", g.end},
                      {"params", params},
                      {"fields", fields}});
  }
  return layout;
}

// One shard file as read back: its groups (fields' data into the file).
struct ReadShard {
  std::string path;
  std::vector<ShardFileGroup> groups;
};

absl::StatusOr<ReadShard> ReadShardFile(const SafetensorsFile& file, const std::string& path,
                                        int shard, int world) {
  auto bad = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat(path, ": ", what));
  };
  auto meta = [&](const char* key) -> std::string {
    auto it = file.metadata.find(key);
    return it == file.metadata.end() ? "" : it->second;
  };
  if (meta("format") != kShardFileFormat) {
    return bad(absl::StrCat("format \"", meta("format"), "\", not ", kShardFileFormat));
  }
  if (meta("shard") != absl::StrCat(shard) || meta("world") != absl::StrCat(world)) {
    return bad(absl::StrCat("its metadata says shard ", meta("shard"), " of ", meta("world")));
  }
  const nlohmann::json layout = nlohmann::json::parse(meta("layout"), nullptr, false);
  if (layout.is_discarded() || !layout.is_array()) return bad("its layout is not a JSON array");
  ReadShard out{path, {}};
  try {
    for (size_t g = 0; g < layout.size(); ++g) {
      const nlohmann::json& j = layout[g];
      ShardFileGroup group;
      group.elements = j.at("elements").get<int64_t>();
      group.begin = j.at("begin").get<int64_t>();
      group.end = j.at("end").get<int64_t>();
      for (const nlohmann::json& p : j.at("params")) {
        group.params.push_back(
            {p.at("name").get<std::string>(), p.at("shape").get<std::vector<int64_t>>()});
      }
      for (const nlohmann::json& f : j.at("fields")) {
        ShardFileField field{f.at("name").get<std::string>(), f.at("per_element").get<bool>(), {}};
        const std::string name = absl::StrCat(g, ".", field.name);
        auto it = file.tensors.find(name);
        if (it == file.tensors.end()) return bad(absl::StrCat("tensor ", name, " is missing"));
        if (field.per_element &&
            (it->second.shape.size() != 1 || it->second.shape[0] != group.end - group.begin)) {
          return bad(absl::StrCat("tensor ", name, " does not hold the ", group.end - group.begin,
                                  " elements of its range"));
        }
        field.data = {name, it->second.dtype, it->second.shape, it->second.data};
        group.fields.push_back(std::move(field));
      }
      out.groups.push_back(std::move(group));
    }
  } catch (const nlohmann::json::exception& e) {
    return bad(absl::StrCat("its layout: ", e.what()));
  }
  return out;
}

// Whether shard `s`'s groups name the parameters and sizes `first`'s do,
// and each of its ranges begins where the shards before it ended (`next`,
// by group, advanced to its ends).
absl::Status CheckFollows(const ReadShard& first, const ReadShard& s, std::vector<int64_t>* next) {
  if (s.groups.size() != first.groups.size()) {
    return absl::DataLossError(absl::StrCat(s.path, ": ", s.groups.size(), " groups where ",
                                            first.path, " has ", first.groups.size()));
  }
  next->resize(first.groups.size(), 0);
  for (size_t g = 0; g < first.groups.size(); ++g) {
    const ShardFileGroup& group = s.groups[g];
    bool same = group.elements == first.groups[g].elements &&
                group.params.size() == first.groups[g].params.size();
    for (size_t i = 0; same && i < group.params.size(); ++i) {
      same = group.params[i].name == first.groups[g].params[i].name &&
             group.params[i].shape == first.groups[g].params[i].shape;
    }
    if (!same || group.begin != (*next)[g] || group.end < group.begin) {
      return absl::DataLossError(absl::StrCat(s.path, ": group ", g, "'s layout (range ",
                                              group.begin, "-", group.end,
                                              ") does not follow the other shards'"));
    }
    (*next)[g] = group.end;
  }
  return absl::OkStatus();
}

// Whether the ranges `next` reached (CheckFollows over every shard) cover
// each group of `first`, whose parameters' elements they must be.
absl::Status CheckCovered(const ReadShard& first, const std::vector<int64_t>& next) {
  for (size_t g = 0; g < first.groups.size(); ++g) {
    uint64_t params = 0;
    for (const ShardFileParam& p : first.groups[g].params) params += Elements(p.shape);
    if (next[g] != first.groups[g].elements || params != static_cast<uint64_t>(next[g])) {
      return absl::DataLossError(absl::StrCat(first.path, ": the shards cover ", next[g],
                                              " of group ", g, "'s ", params, " elements"));
    }
  }
  return absl::OkStatus();
}

// The groups of every shard must name the same parameters and sizes, and
// their ranges must tile each group in shard order.
absl::Status CheckTiling(const std::vector<ReadShard>& shards) {
  std::vector<int64_t> next;
  for (const ReadShard& s : shards) MUSTER_RETURN_IF_ERROR(CheckFollows(shards[0], s, &next));
  return CheckCovered(shards[0], next);
}

// The bytes of `count` elements from element `from` of group `g`'s field
// `field`, taken from the shards whose ranges cover them, appended to `out`.
absl::Status AppendElements(const std::vector<ReadShard>& shards, size_t g,
                            const std::string& field, int64_t from, int64_t count,
                            std::string* out) {
  for (const ReadShard& s : shards) {
    const ShardFileGroup& group = s.groups[g];
    const int64_t lo = std::max(from, group.begin), hi = std::min(from + count, group.end);
    if (lo >= hi) continue;
    auto it = std::find_if(group.fields.begin(), group.fields.end(),
                           [&](const ShardFileField& f) { return f.name == field; });
    if (it == group.fields.end() || !it->per_element) {
      return absl::DataLossError(absl::StrCat(s.path, ": group ", g, " has no per-element field ",
                                              field, " where another shard has"));
    }
    const size_t es = SafetensorsDtypeSize(it->data.dtype);
    out->append(static_cast<const char*>(it->data.data) + (lo - group.begin) * es, (hi - lo) * es);
  }
  return absl::OkStatus();
}

// `named` (each a file's base name and what it names) in shard order, one
// per shard of one world; names that are not a shard file's are left out.
// DATA_LOSS naming `dir`: shard files of two world sizes, a shard missing;
// NOT_FOUND: no shard file.
template <typename T>
absl::StatusOr<std::vector<const T*>> InShardOrder(
    const std::vector<std::pair<std::string, const T*>>& named, const std::string& dir) {
  std::map<int, const T*> by_shard;
  int world = 0;
  for (const auto& [name, file] : named) {
    int shard = 0, w = 0;
    if (!ParseShardFileName(name, &shard, &w)) continue;
    if (world != 0 && w != world) {
      return absl::DataLossError(
          absl::StrCat(dir, ": shard files of worlds of ", world, " and ", w));
    }
    world = w;
    by_shard[shard] = file;
  }
  if (world == 0) return absl::NotFoundError(absl::StrCat(dir, ": no optimizer shard file"));
  std::vector<const T*> out;
  for (int r = 0; r < world; ++r) {
    auto it = by_shard.find(r);
    if (it == by_shard.end()) {
      return absl::DataLossError(absl::StrCat(dir, ": ", ShardFileName(r, world), " is missing"));
    }
    out.push_back(it->second);
  }
  return out;
}

}  // namespace

std::string ShardFileName(int shard, int world) {
  return absl::StrCat(kPrefix, shard, "-of-", world, kSuffix);
}

bool IsShardFileName(const std::string& base_name) {
  int shard = 0, world = 0;
  return ParseShardFileName(base_name, &shard, &world);
}

absl::StatusOr<WrittenFile> WriteShardFile(FileSystem* fs, const std::string& path, int shard,
                                           int world, const std::vector<ShardFileGroup>& groups) {
  std::vector<TensorRef> tensors;
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const ShardFileField& f : groups[g].fields) {
      if (f.per_element &&
          (f.data.shape.size() != 1 || f.data.shape[0] != groups[g].end - groups[g].begin)) {
        return absl::InvalidArgumentError(
            absl::StrCat("group ", g, "'s field ", f.name, " does not hold its range's elements"));
      }
      tensors.push_back({absl::StrCat(g, ".", f.name), f.data.dtype, f.data.shape, f.data.data});
    }
  }
  const std::map<std::string, std::string> metadata = {{"format", kShardFileFormat},
                                                       {"shard", absl::StrCat(shard)},
                                                       {"world", absl::StrCat(world)},
                                                       {"layout", LayoutJson(groups).dump()}};
  MUSTER_ASSIGN_OR_RETURN(WrittenFile written,
                          WriteSafetensors(fs, path + ".tmp", tensors, metadata));
  MUSTER_RETURN_IF_ERROR(fs->Rename(path + ".tmp", path));
  MUSTER_RETURN_IF_ERROR(fs->SyncDir(path.substr(0, path.rfind('/'))));
  return written;
}

absl::StatusOr<SafetensorsFile> ConsolidateShards(
    const std::map<std::string, SafetensorsFile>& files, const std::string& dir) {
  std::vector<std::pair<std::string, const SafetensorsFile*>> named;
  for (const auto& [name, file] : files) named.emplace_back(name, &file);
  MUSTER_ASSIGN_OR_RETURN(const std::vector<const SafetensorsFile*> in_order,
                          InShardOrder(named, dir));
  const int world = static_cast<int>(in_order.size());
  std::vector<ReadShard> shards;
  for (int r = 0; r < world; ++r) {
    MUSTER_ASSIGN_OR_RETURN(
        ReadShard s, ReadShardFile(*in_order[r], dir + "/" + ShardFileName(r, world), r, world));
    shards.push_back(std::move(s));
  }
  MUSTER_RETURN_IF_ERROR(CheckTiling(shards));

  // Every field of every parameter, laid out back to back in `data`; the
  // references are made once `data` stops growing.
  struct Out {
    std::string name, dtype;
    std::vector<int64_t> shape;
    size_t offset = 0;
  };
  std::vector<Out> outs;
  std::string data;
  for (size_t g = 0; g < shards[0].groups.size(); ++g) {
    // The group's fields as the first shard that holds its state names them.
    const ShardFileGroup* with_state = nullptr;
    for (const ReadShard& s : shards) {
      if (!s.groups[g].fields.empty()) {
        with_state = &s.groups[g];
        break;
      }
    }
    if (with_state == nullptr) continue;  // never stepped: no state, as unsharded
    int64_t offset = 0;
    for (const ShardFileParam& p : with_state->params) {
      const int64_t n = static_cast<int64_t>(Elements(p.shape));
      for (const ShardFileField& f : with_state->fields) {
        Out o{absl::StrCat(p.name, ".", f.name), f.data.dtype, p.shape, data.size()};
        if (f.per_element) {
          MUSTER_RETURN_IF_ERROR(AppendElements(shards, g, f.name, offset, n, &data));
        } else {
          o.shape = f.data.shape;
          data.append(static_cast<const char*>(f.data.data),
                      Elements(f.data.shape) * SafetensorsDtypeSize(f.data.dtype));
        }
        outs.push_back(std::move(o));
      }
      offset += n;
    }
  }
  std::vector<TensorRef> refs;
  for (const Out& o : outs) refs.push_back({o.name, o.dtype, o.shape, data.data() + o.offset});
  MUSTER_ASSIGN_OR_RETURN(std::string bytes, SafetensorsPrefix(refs, {}));
  bytes += data;
  return ParseSafetensors(std::move(bytes), dir + "/" + kOptimizerFile);
}

absl::Status VisitShardFiles(FileSystem* fs, const std::vector<ShardFileRef>& files,
                             const ShardFileVisitor& visit) {
  std::vector<std::pair<std::string, const ShardFileRef*>> named;
  std::string dir;
  for (const ShardFileRef& f : files) {
    const size_t slash = f.path.rfind('/');
    if (slash != std::string::npos) dir = f.path.substr(0, slash);
    named.emplace_back(f.path.substr(slash + 1), &f);
  }
  MUSTER_ASSIGN_OR_RETURN(const std::vector<const ShardFileRef*> in_order,
                          InShardOrder(named, dir));
  const int world = static_cast<int>(in_order.size());
  ReadShard first;  // its groups without their fields' data
  std::vector<int64_t> next;
  for (int r = 0; r < world; ++r) {
    const std::string& path = in_order[r]->path;
    MUSTER_ASSIGN_OR_RETURN(std::string bytes,
                            ReadChecked(fs, path, in_order[r]->xxh3, "its record"));
    MUSTER_ASSIGN_OR_RETURN(SafetensorsFile file, ParseSafetensors(std::move(bytes), path));
    MUSTER_ASSIGN_OR_RETURN(ReadShard s, ReadShardFile(file, path, r, world));
    if (r == 0) {
      first = s;
      for (ShardFileGroup& g : first.groups) g.fields.clear();
    }
    MUSTER_RETURN_IF_ERROR(CheckFollows(first, s, &next));
    MUSTER_RETURN_IF_ERROR(visit(path, s.groups));
  }
  return CheckCovered(first, next);
}

absl::StatusOr<std::string> ConsolidateCheckpointDir(FileSystem* fs, const std::string& dir) {
  const std::string manifest_path = absl::StrCat(dir, "/", kManifestName);
  MUSTER_ASSIGN_OR_RETURN(std::string text, fs->ReadFile(manifest_path, kMaxCheckpointFileBytes));
  MUSTER_ASSIGN_OR_RETURN(CheckpointManifest manifest, DecodeManifest(text, manifest_path));
  std::map<std::string, SafetensorsFile> files;
  for (const auto& [name, expected] : manifest.files) {
    if (!IsShardFileName(name)) continue;
    const std::string path = absl::StrCat(dir, "/", name);
    MUSTER_ASSIGN_OR_RETURN(std::string bytes,
                            ReadChecked(fs, path, expected.xxh3, "the manifest"));
    MUSTER_ASSIGN_OR_RETURN(files[name], ParseSafetensors(std::move(bytes), path));
  }
  if (files.empty()) {
    return absl::NotFoundError(absl::StrCat(manifest_path, " names no optimizer shard file (",
                                            "a checkpoint written whole has its ", kOptimizerFile,
                                            " already)"));
  }
  MUSTER_ASSIGN_OR_RETURN(SafetensorsFile whole, ConsolidateShards(files, dir));
  const std::string path = absl::StrCat(dir, "/", kOptimizerFile);
  MUSTER_RETURN_IF_ERROR(WriteFileAtomically(fs, path, whole.bytes));
  return path;
}

}  // namespace muster
