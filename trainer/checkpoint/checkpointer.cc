#include "trainer/checkpoint/checkpointer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "trainer/checkpoint/safetensors.h"
#include "trainer/checkpoint/state_tensors.h"

namespace muster {
namespace {

constexpr uint64_t kMaxFileBytes = uint64_t{64} << 30;

std::string BaseName(const std::string& path) { return path.substr(path.rfind('/') + 1); }

}  // namespace

Checkpointer::Checkpointer(std::string dir, torch::nn::Module& model,
                           torch::optim::Optimizer& optimizer, FileSystem* fs)
    : dir_(std::move(dir)), model_(model), optimizer_(optimizer), fs_(fs) {
  writer_ = std::thread([this] { WriterLoop(); });
}

Checkpointer::~Checkpointer() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return !busy_; });
    stop_ = true;
  }
  cv_.notify_all();
  writer_.join();
}

std::string Checkpointer::StepDir(int64_t step) const { return absl::StrCat(dir_, "/step-", step); }

void Checkpointer::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return !busy_; });
}

absl::Status Checkpointer::Snapshot(const CheckpointMeta& meta, Done done) {
  const absl::Time start = absl::Now();
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return !busy_; });
  torch::NoGradGuard no_grad;
  const std::vector<std::pair<std::string, std::vector<std::pair<std::string, torch::Tensor>>>> files = {
      {"model.safetensors", ModelTensors(model_)},
      {"optimizer.safetensors", OptimizerTensors(model_, optimizer_)}};
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
  if (arena_capacity_ < total) {  // grows once, then reused
    void* p = nullptr;
    if (::posix_memalign(&p, kDirectAlignment, total) != 0) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", total,
                                                       " bytes of checkpoint buffers"));
    }
    arena_.reset(static_cast<char*>(p));
    arena_capacity_ = total;
  }
  for (size_t f = 0; f < files.size(); ++f) {
    char* out = arena_.get() + images_[f].offset;
    std::memcpy(out, prefixes[f].data(), prefixes[f].size());
    out += prefixes[f].size();
    for (const auto& [tname, tensor] : files[f].second) {
      torch::Tensor t = tensor.detach();
      if (!t.device().is_cpu()) t = t.cpu();
      t = t.contiguous();
      const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
      std::memcpy(out, t.data_ptr(), bytes);
      out += bytes;
    }
  }
  meta_ = meta;
  if (meta_.rng_state.empty()) {
    torch::Tensor rng = at::detail::getDefaultCPUGenerator().get_state();
    meta_.rng_state = absl::BytesToHexString(
        absl::string_view(static_cast<const char*>(rng.data_ptr()), rng.numel()));
  }
  done_ = std::move(done);
  busy_ = true;
  has_job_ = true;
  blocking_seconds_ = absl::ToDoubleSeconds(absl::Now() - start);
  cv_.notify_all();
  return absl::OkStatus();
}

void Checkpointer::WriterLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stop_ || has_job_; });
    if (stop_) return;
    has_job_ = false;
    const CheckpointMeta meta = meta_;
    Done done = std::move(done_);
    CheckpointTiming timing;
    timing.blocking_seconds = blocking_seconds_;
    lock.unlock();
    const absl::Time start = absl::Now();
    absl::StatusOr<std::vector<FileReport>> files = Write(meta, &timing.bytes);
    timing.write_seconds = absl::ToDoubleSeconds(absl::Now() - start);
    if (!files.ok()) {
      MUSTER_LOG(WARNING) << "checkpoint of step " << meta.step << " failed: " << files.status();
      fs_->RemoveAll(StepDir(meta.step)).IgnoreError();
    }
    if (done) done(files, timing);
    lock.lock();
    busy_ = false;
    cv_.notify_all();
  }
}

absl::StatusOr<std::vector<FileReport>> Checkpointer::Write(const CheckpointMeta& meta,
                                                            uint64_t* bytes) {
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
  nlohmann::json manifest = {{"format", "muster-checkpoint-1"},
                             {"step", meta.step},
                             {"epoch", meta.epoch},
                             {"sample_offset", meta.sample_offset},
                             {"generation", meta.generation},
                             {"world_size", meta.world_size},
                             {"model", meta.model},
                             {"optimizer", meta.optimizer},
                             {"rng_state", meta.rng_state}};
  for (const FileReport& f : files) {
    manifest["files"][BaseName(f.path)] = {{"bytes", f.bytes}, {"xxh3", f.xxh3}};
  }
  const std::string text = manifest.dump(1);
  const std::string path = dir + "/manifest.json";
  MUSTER_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> out, fs_->NewWritableFile(path + ".tmp"));
  MUSTER_RETURN_IF_ERROR(out->Append(text.data(), text.size()));
  MUSTER_RETURN_IF_ERROR(out->Sync());
  MUSTER_RETURN_IF_ERROR(out->Close());
  MUSTER_RETURN_IF_ERROR(fs_->Rename(path + ".tmp", path));
  MUSTER_RETURN_IF_ERROR(fs_->SyncDir(dir));
  MUSTER_RETURN_IF_ERROR(fs_->SyncDir(dir_));
  files.push_back({path, text.size(), Xxh3Hex(text.data(), text.size())});
  *bytes += text.size();
  return files;
}

namespace {

absl::Status CheckAgainst(const SafetensorsFile& file, const std::string& path,
                          const std::string& name, const torch::Tensor& target) {
  auto it = file.tensors.find(name);
  if (it == file.tensors.end()) {
    return absl::DataLossError(absl::StrCat(path, ": tensor ", name, " is missing"));
  }
  MUSTER_ASSIGN_OR_RETURN(std::string dtype, DtypeName(target.scalar_type()));
  if (it->second.dtype != dtype || it->second.shape != target.sizes().vec()) {
    return absl::DataLossError(absl::StrCat(path, ": tensor ", name, " is ", it->second.dtype,
                                            " with another shape than the model's ", dtype));
  }
  return absl::OkStatus();
}

void CopyInto(const TensorData& d, torch::Tensor target) {
  torch::Tensor src = torch::from_blob(const_cast<char*>(d.data), target.sizes(),
                                       torch::TensorOptions().dtype(target.scalar_type()));
  target.copy_(src);
}

}  // namespace

absl::StatusOr<CheckpointMeta> LoadCheckpoint(const std::vector<FileReport>& files,
                                              torch::nn::Module& model,
                                              torch::optim::Optimizer& optimizer, FileSystem* fs) {
  std::map<std::string, SafetensorsFile> tensors;
  nlohmann::json manifest;
  std::string manifest_path;
  for (const FileReport& f : files) {
    MUSTER_ASSIGN_OR_RETURN(std::string bytes, fs->ReadFile(f.path, kMaxFileBytes));
    const std::string sum = Xxh3Hex(bytes.data(), bytes.size());
    if (sum != f.xxh3) {
      return absl::DataLossError(absl::StrCat(f.path, ": checksum ", sum, " but the catalog says ",
                                              f.xxh3, " (damaged file)"));
    }
    if (BaseName(f.path) == "manifest.json") {
      manifest = nlohmann::json::parse(bytes, nullptr, /*allow_exceptions=*/false);
      manifest_path = f.path;
      if (manifest.is_discarded() || !manifest.is_object()) {
        return absl::DataLossError(absl::StrCat(f.path, ": not a JSON object"));
      }
    } else {
      MUSTER_ASSIGN_OR_RETURN(tensors[BaseName(f.path)], ParseSafetensors(std::move(bytes), f.path));
    }
  }
  if (manifest_path.empty()) return absl::DataLossError("checkpoint has no manifest.json");
  for (const char* key : {"model.safetensors", "optimizer.safetensors"}) {
    if (tensors.count(key) == 0) return absl::DataLossError(absl::StrCat("checkpoint has no ", key));
  }
  CheckpointMeta meta;
  for (const char* field : {"step", "epoch", "sample_offset", "generation", "world_size"}) {
    if (!manifest.contains(field) || !manifest[field].is_number_integer()) {
      return absl::DataLossError(absl::StrCat(manifest_path, ": field ", field, " is missing or not an integer"));
    }
  }
  meta.step = manifest["step"].get<int64_t>();
  meta.epoch = manifest["epoch"].get<int64_t>();
  meta.sample_offset = manifest["sample_offset"].get<int64_t>();
  meta.generation = manifest["generation"].get<uint64_t>();
  meta.world_size = manifest["world_size"].get<int>();
  meta.model = manifest.value("model", "");
  meta.optimizer = manifest.value("optimizer", "");
  meta.rng_state = manifest.value("rng_state", "");

  // Check everything before changing anything.
  const SafetensorsFile& m = tensors["model.safetensors"];
  const std::string mpath = manifest_path.substr(0, manifest_path.rfind('/')) + "/model.safetensors";
  for (const auto& [name, t] : ModelTensors(model)) MUSTER_RETURN_IF_ERROR(CheckAgainst(m, mpath, name, t));
  const SafetensorsFile& o = tensors["optimizer.safetensors"];
  torch::NoGradGuard no_grad;
  for (const auto& [name, t] : ModelTensors(model)) CopyInto(m.tensors.at(name), t);
  for (const auto& p : model.named_parameters()) {
    const std::string base = p.key();
    auto make = [&](const std::string& field) -> const TensorData* {
      auto it = o.tensors.find(base + "." + field);
      return it == o.tensors.end() ? nullptr : &it->second;
    };
    auto tensor_of = [&](const TensorData* d) {
      torch::Tensor t = torch::empty(d->shape, p.value().options());
      CopyInto(*d, t);
      return t;
    };
    if (const TensorData* mb = make("momentum_buffer")) {
      auto s = std::make_unique<torch::optim::SGDParamState>();
      s->momentum_buffer(tensor_of(mb));
      PutOptimizerState(optimizer, p.value(), std::move(s));
    } else if (const TensorData* ea = make("exp_avg")) {
      auto s = std::make_unique<torch::optim::AdamWParamState>();
      const TensorData* step = make("step");
      const TensorData* eas = make("exp_avg_sq");
      if (step == nullptr || eas == nullptr || step->size != 8) {
        return absl::DataLossError(absl::StrCat("optimizer.safetensors: incomplete AdamW state of ", base));
      }
      int64_t steps = 0;
      std::memcpy(&steps, step->data, 8);
      s->step(steps);
      s->exp_avg(tensor_of(ea));
      s->exp_avg_sq(tensor_of(eas));
      if (const TensorData* mx = make("max_exp_avg_sq")) s->max_exp_avg_sq(tensor_of(mx));
      PutOptimizerState(optimizer, p.value(), std::move(s));
    }
  }
  if (!meta.rng_state.empty()) {
    std::string raw = absl::HexStringToBytes(meta.rng_state);
    torch::Tensor rng = torch::empty({static_cast<int64_t>(raw.size())}, torch::kUInt8);
    std::memcpy(rng.data_ptr(), raw.data(), raw.size());
    try {
      at::Generator gen = at::detail::getDefaultCPUGenerator();
      gen.set_state(rng);
    } catch (const std::exception& e) {
      MUSTER_LOG(WARNING) << manifest_path << ": RNG state not restored: " << e.what();
    }
  }
  return meta;
}

}  // namespace muster
