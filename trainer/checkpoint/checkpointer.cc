#include "trainer/checkpoint/checkpointer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "trainer/checkpoint/optimizer_shard_files.h"
#include "trainer/checkpoint/safetensors.h"
#include "trainer/checkpoint/state_tensors.h"

namespace muster {
namespace {

std::string BaseName(const std::string& path) { return path.substr(path.rfind('/') + 1); }

}  // namespace

Checkpointer::Checkpointer(std::string dir, TrainingState state, Clock* clock, FileSystem* fs)
    : dir_(std::move(dir)), state_(std::move(state)), clock_(clock), fs_(fs) {
  writer_ = std::thread([this] { WriterLoop(); });
}

Checkpointer::Checkpointer(std::string dir, torch::nn::Module& model,
                           torch::optim::Optimizer& optimizer, Clock* clock, FileSystem* fs)
    : Checkpointer(std::move(dir), TrainingState::Of(&model, &optimizer), clock, fs) {}

Checkpointer::~Checkpointer() {
  {
    MutexLock lock(&mu_);
    while (busy_) cv_.Wait(&mu_);
    stop_ = true;
  }
  cv_.NotifyAll();
  writer_.join();
}

std::string Checkpointer::StepDir(int64_t step) const { return absl::StrCat(dir_, "/step-", step); }

void Checkpointer::BeforeUpdate() { copier_.BeforeUpdate(); }

absl::Status Checkpointer::Wait() {
  MutexLock lock(&mu_);
  while (busy_) cv_.Wait(&mu_);
  return last_write_;
}

absl::Status Checkpointer::EnsureArena(size_t total) {
  if (arena_capacity_ >= total) return absl::OkStatus();  // grows once, then reused
  void* p = nullptr;
  if (::posix_memalign(&p, kDirectAlignment, total) != 0) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", total,
                                                     " bytes of checkpoint buffers"));
  }
  copier_.Unpin();
  arena_.reset(static_cast<char*>(p));
  arena_capacity_ = total;
  arena_pinned_ = false;
  return absl::OkStatus();
}

void Checkpointer::CopyIntoArena(const FileTensors& files,
                                 const std::vector<std::string>& prefixes) {
  // Where each tensor goes in the arena, and whether the next forward pass
  // may change it (buffers, extras: copied first, see DeviceCopier).
  struct Placed {
    char* at;
    torch::Tensor tensor;
    bool early;
  };
  std::vector<Placed> placed;
  std::optional<torch::Device> device;
  for (size_t f = 0; f < files.size(); ++f) {
    char* out = arena_.get() + images_[f].offset;
    std::memcpy(out, prefixes[f].data(), prefixes[f].size());
    out += prefixes[f].size();
    const bool extra = files[f].first == "extra.safetensors";
    for (const auto& [tname, tensor] : files[f].second) {
      torch::Tensor t = tensor.detach().contiguous();
      if (t.is_cuda() && !device) device = t.device();
      placed.push_back({out, t, extra || absl::StartsWith(tname, "buffer.")});
      out += static_cast<size_t>(t.numel()) * t.element_size();
    }
  }
  if (device && !arena_pinned_) {
    copier_.Pin(arena_.get(), arena_capacity_);
    arena_pinned_ = true;
  }
  copier_.Begin(device.value_or(torch::Device(torch::kCPU)));
  for (const Placed& p : placed) {
    if (p.early) copier_.Copy(p.at, p.tensor);
  }
  copier_.MarkEarly();
  for (const Placed& p : placed) {
    if (!p.early) copier_.Copy(p.at, p.tensor);
  }
  copier_.End();
}

absl::Status Checkpointer::Snapshot(const CheckpointMeta& meta, Done done) {
  return Snapshot(meta, {}, std::move(done));
}

absl::Status Checkpointer::Snapshot(const CheckpointMeta& meta,
                                    std::vector<FileReport> shard_files, Done done) {
  const absl::Time asked = clock_->Now();
  MutexLock lock(&mu_);
  while (busy_) cv_.Wait(&mu_);
  const absl::Time start = clock_->Now();
  backlog_seconds_ = absl::ToDoubleSeconds(start - asked);
  torch::NoGradGuard no_grad;
  FileTensors files = {{"model.safetensors", state_.Model()}};
  if (shard_files.empty()) files.emplace_back("optimizer.safetensors", state_.OptimizerState());
  if (state_.has_extra()) files.emplace_back("extra.safetensors", state_.Extra());
  shard_files_ = std::move(shard_files);
  // Lay out each file image: the safetensors prefix, then the tensors.
  std::vector<std::string> prefixes;
  images_.clear();
  size_t total = 0;
  for (const auto& [name, tensors] : files) {
    std::vector<TensorRef> refs;
    size_t data = 0;
    for (const auto& [tname, t] : tensors) {
      MUSTER_ASSIGN_OR_RETURN(std::string dtype, DtypeName(t.scalar_type()));
      refs.push_back({tname, dtype, t.sizes().vec(), nullptr});
      data += static_cast<size_t>(t.numel()) * t.element_size();
    }
    MUSTER_ASSIGN_OR_RETURN(std::string prefix, SafetensorsPrefix(refs, {{"format", "muster"}}));
    Image image{name, total, prefix.size() + data};
    total += (image.size + kDirectAlignment - 1) / kDirectAlignment * kDirectAlignment;
    images_.push_back(image);
    prefixes.push_back(std::move(prefix));
  }
  MUSTER_RETURN_IF_ERROR(EnsureArena(total));
  CopyIntoArena(files, prefixes);
  meta_ = meta;
  if (meta_.rng_state.empty()) {
    torch::Tensor rng = at::detail::getDefaultCPUGenerator().get_state();
    meta_.rng_state = absl::BytesToHexString(
        absl::string_view(static_cast<const char*>(rng.data_ptr()), rng.numel()));
  }
  done_ = std::move(done);
  busy_ = true;
  has_job_ = true;
  blocking_seconds_ = absl::ToDoubleSeconds(clock_->Now() - start);
  cv_.NotifyAll();
  return absl::OkStatus();
}

void Checkpointer::WriterLoop() {
  MutexLock lock(&mu_);
  while (true) {
    while (!stop_ && !has_job_) cv_.Wait(&mu_);
    if (stop_) return;
    has_job_ = false;
    const CheckpointMeta meta = meta_;
    const std::vector<FileReport> shard_files = shard_files_;
    Done done = std::move(done_);
    CheckpointTiming timing;
    timing.blocking_seconds = blocking_seconds_;
    timing.backlog_seconds = backlog_seconds_;
    lock.Unlock();
    const absl::Time start = clock_->Now();
    timing.copy_seconds = copier_.WaitCopied();
    timing.device_bytes = copier_.device_bytes();
    absl::StatusOr<std::vector<FileReport>> files = Write(meta, shard_files, &timing.bytes);
    timing.write_seconds = absl::ToDoubleSeconds(clock_->Now() - start);
    if (!files.ok()) {
      MUSTER_LOG(WARNING) << "checkpoint of step " << meta.step << " failed: " << files.status();
      fs_->RemoveAll(StepDir(meta.step)).IgnoreError();
    }
    if (done) done(files, timing);
    lock.Lock();
    last_write_ = files.status();
    busy_ = false;
    cv_.NotifyAll();
  }
}

absl::StatusOr<std::vector<FileReport>> Checkpointer::Write(
    const CheckpointMeta& meta, const std::vector<FileReport>& shard_files, uint64_t* bytes) {
  const std::string dir = StepDir(meta.step);
  MUSTER_RETURN_IF_ERROR(fs_->CreateDir(dir_));
  MUSTER_RETURN_IF_ERROR(fs_->CreateDir(dir));
  std::vector<FileReport> files;
  for (const Image& image : images_) {
    const char* data = arena_.get() + image.offset;
    const std::string path = dir + "/" + image.name;
    bool direct = false;
    MUSTER_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> out,
                            fs_->NewDirectFile(path + ".tmp", &direct));
    const std::string sum = Xxh3Hex(data, image.size);
    // Direct I/O writes whole blocks from the aligned image (the arena is
    // allocated in whole blocks), then the file is cut to its exact size.
    const size_t length =
        direct ? (image.size + kDirectAlignment - 1) / kDirectAlignment * kDirectAlignment
               : image.size;
    constexpr size_t kChunk = size_t{64} << 20;  // a multiple of the alignment
    for (size_t done = 0; done < length; done += kChunk) {
      MUSTER_RETURN_IF_ERROR(out->Append(data + done, std::min(kChunk, length - done)));
    }
    if (direct) MUSTER_RETURN_IF_ERROR(out->Truncate(image.size));
    MUSTER_RETURN_IF_ERROR(out->Sync());
    MUSTER_RETURN_IF_ERROR(out->Close());
    MUSTER_RETURN_IF_ERROR(fs_->Rename(path + ".tmp", path));
    files.push_back({path, image.size, sum});
    *bytes += image.size;
  }
  files.insert(files.end(), shard_files.begin(), shard_files.end());
  CheckpointManifest manifest{meta, {}};
  for (const FileReport& f : files) manifest.files[BaseName(f.path)] = {f.bytes, f.xxh3};
  const std::string text = EncodeManifest(manifest);
  const std::string path = absl::StrCat(dir, "/", kManifestName);
  MUSTER_RETURN_IF_ERROR(WriteFileAtomically(fs_, path, text));
  MUSTER_RETURN_IF_ERROR(fs_->SyncDir(dir_));
  files.push_back({path, text.size(), Xxh3Hex(text.data(), text.size())});
  *bytes += text.size();
  return files;
}

namespace {

// The tensor `name` of `file`, checked against the dtype and shape of the
// state tensor it will be copied into.
absl::StatusOr<const TensorData*> Find(const SafetensorsFile& file, const std::string& path,
                                       const std::string& name, const torch::Tensor& like) {
  auto it = file.tensors.find(name);
  if (it == file.tensors.end()) {
    return absl::DataLossError(absl::StrCat(path, ": tensor ", name, " is missing"));
  }
  MUSTER_ASSIGN_OR_RETURN(std::string dtype, DtypeName(like.scalar_type()));
  if (it->second.dtype != dtype || it->second.shape != like.sizes().vec()) {
    return absl::DataLossError(absl::StrCat(path, ": tensor ", name, " is ", it->second.dtype,
                                            " [", absl::StrJoin(it->second.shape, ","),
                                            "] where the state holds ", dtype, " [",
                                            absl::StrJoin(like.sizes().vec(), ","), "]"));
  }
  return &it->second;
}

void CopyInto(const TensorData& d, torch::Tensor target) {
  torch::Tensor src = torch::from_blob(const_cast<char*>(d.data), target.sizes(),
                                       torch::TensorOptions().dtype(target.scalar_type()));
  target.copy_(src);
}

// A new tensor like `like` holding `d` (already checked by Find).
torch::Tensor Copy(const TensorData& d, const torch::Tensor& like) {
  torch::Tensor t = torch::empty_like(like);
  CopyInto(d, t);
  return t;
}

struct PlannedState {
  torch::optim::Optimizer* optimizer = nullptr;
  torch::Tensor param;
  std::unique_ptr<torch::optim::OptimizerParamState> state;
};

// One parameter's optimizer state from `o`, built aside from the codec's
// Initial (which gives the fields' names, shapes and dtypes); null when the
// file holds none of its fields (a parameter never stepped).
absl::StatusOr<std::unique_ptr<torch::optim::OptimizerParamState>> StateFrom(
    const TrainingState::Optimizer& opt, const torch::optim::OptimizerParamGroup& group,
    const torch::Tensor& param, const std::string& base, const SafetensorsFile& o,
    const std::string& path) {
  std::unique_ptr<torch::optim::OptimizerParamState> s =
      opt.codec->Initial(param, group, *opt.optimizer);
  if (s == nullptr) return s;
  const OptimizerCodec::Fields like = opt.codec->Save(*s, group.options());
  const bool any = std::any_of(like.begin(), like.end(), [&](const auto& f) {
    return o.tensors.count(base + "." + f.first) > 0;
  });
  if (!any) return std::unique_ptr<torch::optim::OptimizerParamState>();
  std::map<std::string, torch::Tensor> fields;
  for (const auto& [field, t] : like) {
    MUSTER_ASSIGN_OR_RETURN(const TensorData* d, Find(o, path, base + "." + field, t));
    fields[field] = Copy(*d, t);
  }
  if (absl::Status l = opt.codec->Load(fields, group.options(), s.get()); !l.ok()) {
    return absl::DataLossError(absl::StrCat(path, ": ", base, ": ", l.message()));
  }
  return s;
}

// The optimizers' state in `o`, checked and built aside: nothing changes yet.
absl::StatusOr<std::vector<PlannedState>> PlanOptimizer(const TrainingState& state,
                                                        const SafetensorsFile& o,
                                                        const std::string& path) {
  std::vector<PlannedState> out;
  if (state.optimizers.empty()) return out;
  torch::NoGradGuard no_grad;
  const NamedTensors params = state.Parameters();
  for (const TrainingState::Optimizer& opt : state.optimizers) {
    for (const auto& named : params) {
      const std::string& name = named.first;
      const torch::Tensor& param = named.second;  // a lambda below captures it: clang 14
                                                  // cannot capture a structured binding
      for (const auto& group : opt.optimizer->param_groups()) {
        const bool in_group =
            std::any_of(group.params().begin(), group.params().end(),
                        [&](const torch::Tensor& q) { return q.is_same(param); });
        if (!in_group) continue;
        MUSTER_ASSIGN_OR_RETURN(auto s, StateFrom(opt, group, param, name, o, path));
        if (s != nullptr) out.push_back({opt.optimizer, param, std::move(s)});
        break;
      }
    }
  }
  return out;
}

void RestoreRng(const std::string& hex, const std::string& path) {
  if (hex.empty()) return;
  std::string raw = absl::HexStringToBytes(hex);
  try {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    gen.set_state(BytesTensor(raw));
  } catch (const std::exception& e) {
    MUSTER_LOG(WARNING) << path << ": RNG state not restored: " << e.what();
  }
}

// The extra tensors (into `copies`) and the blobs' bytes (into `blobs`) of
// `extra`, the checkpoint's extra.safetensors (null where it has none). A
// checkpoint older than kLearningRatesBlob has no rates: the program's
// stay. Errors: DATA_LOSS naming what is missing.
absl::Status PlanExtra(const TrainingState& state, const SafetensorsFile* extra,
                       const std::string& path,
                       std::vector<std::pair<const TensorData*, torch::Tensor>>* copies,
                       std::map<std::string, std::string>* blobs) {
  const SafetensorsFile none;
  const SafetensorsFile& e = extra == nullptr ? none : *extra;
  for (const auto& [name, t] : state.tensors) {
    if (extra == nullptr) return absl::DataLossError("checkpoint has no extra.safetensors");
    MUSTER_ASSIGN_OR_RETURN(const TensorData* d, Find(e, path, "tensor." + name, t));
    copies->emplace_back(d, t);
  }
  for (const Blob& b : state.blobs) {
    auto it = e.tensors.find("blob." + b.name);
    if (it == e.tensors.end() && b.name == kLearningRatesBlob) continue;
    if (it == e.tensors.end() || it->second.dtype != "U8") {
      return absl::DataLossError(absl::StrCat(path, ": blob ", b.name, " is missing"));
    }
    (*blobs)[b.name] = std::string(it->second.data, it->second.size);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CheckpointMeta> LoadCheckpoint(const std::vector<FileReport>& files,
                                              const TrainingState& state, FileSystem* fs,
                                              std::vector<ShardFileRef>* deferred) {
  std::map<std::string, SafetensorsFile> tensors;
  std::optional<CheckpointManifest> manifest;
  std::string manifest_path;
  const bool defer = deferred != nullptr && std::none_of(files.begin(), files.end(), [](auto& f) {
                       return BaseName(f.path) == "optimizer.safetensors";
                     });
  std::vector<ShardFileRef> shard_files;
  for (const FileReport& f : files) {
    MUSTER_ASSIGN_OR_RETURN(std::string bytes, ReadChecked(fs, f.path, f.xxh3, "its record"));
    if (defer && IsShardFileName(BaseName(f.path))) {  // verified; read again where kept
      shard_files.push_back({f.path, f.xxh3});
    } else if (BaseName(f.path) == kManifestName) {
      MUSTER_ASSIGN_OR_RETURN(manifest, DecodeManifest(bytes, f.path));
      manifest_path = f.path;
    } else {
      MUSTER_ASSIGN_OR_RETURN(tensors[BaseName(f.path)], ParseSafetensors(std::move(bytes), f.path));
    }
  }
  if (manifest_path.empty()) return absl::DataLossError("checkpoint has no manifest.json");
  const std::string dir = manifest_path.substr(0, manifest_path.rfind('/'));
  // Sharded optimizer state (optimizer_shard_files.h): put together whole;
  // the next step shards it for the world that resumes.
  if (shard_files.empty() && tensors.count("optimizer.safetensors") == 0) {
    absl::StatusOr<SafetensorsFile> whole = ConsolidateShards(tensors, dir);
    if (whole.ok()) {
      tensors["optimizer.safetensors"] = *std::move(whole);
    } else if (!absl::IsNotFound(whole.status())) {
      return whole.status();
    }
  }
  std::vector<std::string> wanted = {"model.safetensors"};
  if (shard_files.empty()) wanted.push_back("optimizer.safetensors");
  for (const std::string& key : wanted) {
    if (tensors.count(key) == 0) return absl::DataLossError(absl::StrCat("checkpoint has no ", key));
  }
  const CheckpointMeta& meta = manifest->meta;

  // Check everything before changing anything.
  std::vector<std::pair<const TensorData*, torch::Tensor>> copies;
  for (const auto& [name, t] : state.Model()) {
    MUSTER_ASSIGN_OR_RETURN(const TensorData* d,
                            Find(tensors["model.safetensors"], dir + "/model.safetensors", name, t));
    copies.emplace_back(d, t);
  }
  std::vector<PlannedState> optimizer_states;
  if (shard_files.empty()) {
    MUSTER_ASSIGN_OR_RETURN(optimizer_states,
                            PlanOptimizer(state, tensors["optimizer.safetensors"],
                                          dir + "/optimizer.safetensors"));
  }
  std::map<std::string, std::string> blobs;
  const auto extra = tensors.find("extra.safetensors");
  MUSTER_RETURN_IF_ERROR(PlanExtra(state, extra == tensors.end() ? nullptr : &extra->second,
                                   dir + "/extra.safetensors", &copies, &blobs));
  torch::NoGradGuard no_grad;
  for (auto& [d, t] : copies) CopyInto(*d, t);
  for (PlannedState& p : optimizer_states) {
    PutOptimizerState(*p.optimizer, p.param, std::move(p.state));
  }
  MUSTER_RETURN_IF_ERROR(state.LoadBlobs(blobs));
  RestoreRng(meta.rng_state, manifest_path);
  if (deferred != nullptr) *deferred = std::move(shard_files);
  return meta;
}

absl::Status LoadOptimizerFromShards(const std::vector<ShardFileRef>& files,
                                     const TrainingState& state, FileSystem* fs) {
  if (files.empty()) return absl::NotFoundError("no optimizer shard file");
  std::map<std::string, SafetensorsFile> tensors;
  for (const ShardFileRef& f : files) {
    MUSTER_ASSIGN_OR_RETURN(std::string bytes, ReadChecked(fs, f.path, f.xxh3, "its record"));
    MUSTER_ASSIGN_OR_RETURN(tensors[BaseName(f.path)], ParseSafetensors(std::move(bytes), f.path));
  }
  const std::string dir = files[0].path.substr(0, files[0].path.rfind('/'));
  MUSTER_ASSIGN_OR_RETURN(SafetensorsFile whole, ConsolidateShards(tensors, dir));
  tensors.clear();
  MUSTER_ASSIGN_OR_RETURN(std::vector<PlannedState> planned,
                          PlanOptimizer(state, whole, dir + "/optimizer.safetensors"));
  torch::NoGradGuard no_grad;
  for (PlannedState& p : planned) PutOptimizerState(*p.optimizer, p.param, std::move(p.state));
  return absl::OkStatus();
}

}  // namespace muster
