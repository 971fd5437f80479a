// OptimizerShards::Load: a rank's shards of a new world straight from a
// checkpoint's shard files (docs/sharding.md, "Checkpoints").
#include <torch/torch.h>

#include <cstring>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "trainer/checkpoint/state_tensors.h"
#include "trainer/elastic/optimizer_shards.h"

namespace muster {
namespace {

// Whether file group `file` lists `params` (named by `names`) in order,
// with their shapes: the file's group is then the optimizer's.
absl::Status SameParameters(const ShardFileGroup& file, const std::vector<torch::Tensor>& params,
                            const std::map<const c10::TensorImpl*, std::string>& names,
                            const std::string& where) {
  if (file.params.size() != params.size()) {
    return absl::DataLossError(absl::StrCat(where, " lists ", file.params.size(),
                                            " parameters where the optimizer trains ",
                                            params.size()));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    auto it = names.find(params[i].unsafeGetTensorImpl());
    const std::string name = it == names.end() ? "(unnamed)" : it->second;
    if (file.params[i].name != name || file.params[i].shape != params[i].sizes().vec()) {
      return absl::DataLossError(absl::StrCat(
          where, "'s parameter ", i, " is ", file.params[i].name, " [",
          absl::StrJoin(file.params[i].shape, ","), "] where the program has ", name, " [",
          absl::StrJoin(params[i].sizes().vec(), ","), "]"));
    }
  }
  return absl::OkStatus();
}

// The part of `field` (of a file range beginning at `file_begin`) that
// falls in `range`, into `kept` (over `range`; made at first use).
absl::Status CopyOverlap(const ShardFileField& field, int64_t file_begin, int64_t file_end,
                         ElementRange range, torch::Tensor* kept, const std::string& where) {
  const int64_t lo = std::max(range.begin, file_begin), hi = std::min(range.end, file_end);
  if (lo >= hi) return absl::OkStatus();
  absl::StatusOr<torch::ScalarType> dtype = DtypeFromName(field.data.dtype);
  if (!dtype.ok()) return absl::DataLossError(absl::StrCat(where, ": ", dtype.status().message()));
  if (!kept->defined()) {
    *kept = torch::empty({range.size()}, torch::TensorOptions().dtype(*dtype));
  } else if (kept->scalar_type() != *dtype) {
    return absl::DataLossError(absl::StrCat(where, "'s ", field.name, " is ", field.data.dtype,
                                            " where another shard's is not"));
  }
  const size_t es = kept->element_size();
  std::memcpy(static_cast<char*>(kept->data_ptr()) + (lo - range.begin) * es,
              static_cast<const char*>(field.data.data) + (lo - file_begin) * es,
              static_cast<size_t>(hi - lo) * es);
  return absl::OkStatus();
}

// A scalar field (a step count) as the file holds it.
absl::StatusOr<torch::Tensor> ScalarOf(const ShardFileField& field, const std::string& where) {
  absl::StatusOr<torch::ScalarType> dtype = DtypeFromName(field.data.dtype);
  if (!dtype.ok()) return absl::DataLossError(absl::StrCat(where, ": ", dtype.status().message()));
  return torch::from_blob(const_cast<void*>(field.data.data), field.data.shape,
                          torch::TensorOptions().dtype(*dtype))
      .clone();
}

}  // namespace

absl::StatusOr<std::unique_ptr<OptimizerShards>> OptimizerShards::Load(
    const std::vector<torch::optim::Optimizer*>& optimizers, const NamedTensors& named_params,
    int rank, const std::vector<int>& node_of_rank, int copies, FileSystem* fs,
    const std::vector<ShardFileRef>& files) {
  std::vector<Group> groups;
  std::vector<int64_t> elements;
  MUSTER_ASSIGN_OR_RETURN(ShardLayout layout,
                          Lay(optimizers, rank, node_of_rank, copies, &groups, &elements));
  std::map<const c10::TensorImpl*, std::string> names;
  for (const auto& [name, p] : named_params) names[p.unsafeGetTensorImpl()] = name;
  const std::vector<int> kept = layout.KeptBy(rank);
  // By group, by kept shard: its fields, built aside as the files come.
  std::vector<std::vector<KeptFields>> fields(groups.size());
  torch::NoGradGuard no_grad;
  MUSTER_RETURN_IF_ERROR(VisitShardFiles(
      fs, files,
      [&](const std::string& path, const std::vector<ShardFileGroup>& file) -> absl::Status {
        if (file.size() != groups.size()) {
          return absl::DataLossError(absl::StrCat(path, " holds ", file.size(),
                                                  " optimizer groups where the program has ",
                                                  groups.size()));
        }
        for (size_t g = 0; g < groups.size(); ++g) {
          const std::string where = absl::StrCat(path, ": group ", g);
          MUSTER_RETURN_IF_ERROR(SameParameters(file[g], groups[g].params, names, where));
          if (elements[g] == 0 || file[g].fields.empty()) continue;
          fields[g].resize(kept.size());
          for (size_t k = 0; k < kept.size(); ++k) {
            const ElementRange range = layout.Range(static_cast<int>(g), kept[k]);
            for (const ShardFileField& f : file[g].fields) {
              torch::Tensor& out = fields[g][k][f.name];
              if (f.per_element) {
                MUSTER_RETURN_IF_ERROR(
                    CopyOverlap(f, file[g].begin, file[g].end, range, &out, where));
              } else if (!out.defined()) {
                MUSTER_ASSIGN_OR_RETURN(out, ScalarOf(f, where));
              }
            }
          }
        }
        return absl::OkStatus();
      }));
  for (size_t g = 0; g < groups.size(); ++g) {
    if (elements[g] == 0) continue;  // nothing to shard: the group stays as it is
    // No state in any file (never stepped): masters without state.
    fields[g].resize(kept.size());
    const torch::Device device = groups[g].params.front().device();
    for (KeptFields& shard : fields[g]) {
      for (auto& [name, t] : shard) t = t.to(device);
    }
  }
  return Build(std::move(groups), std::move(layout), rank, fields);
}

}  // namespace muster
