#include "trainer/checkpoint/safetensors.h"

#include <xxhash.h>

#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace muster {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100u << 20;

struct StateDeleter {
  void operator()(XXH3_state_t* s) const { XXH3_freeState(s); }
};

std::string Hex(uint64_t v) { return absl::StrFormat("%016x", v); }

}  // namespace

size_t SafetensorsDtypeSize(const std::string& dtype) {
  static const std::map<std::string, size_t> sizes = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8},
      {"I32", 4}, {"I16", 2}, {"I8", 1},  {"U8", 1},   {"BOOL", 1}};
  auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

std::string Xxh3Hex(const void* data, size_t n) { return Hex(XXH3_64bits(data, n)); }

absl::StatusOr<std::string> ReadChecked(FileSystem* fs, const std::string& path,
                                        const std::string& xxh3, const std::string& source) {
  MUSTER_ASSIGN_OR_RETURN(std::string bytes, fs->ReadFile(path, kMaxCheckpointFileBytes));
  if (const std::string sum = Xxh3Hex(bytes.data(), bytes.size()); sum != xxh3) {
    return absl::DataLossError(absl::StrCat(path, ": checksum ", sum, " but ", source, " says ",
                                            xxh3, " (damaged file)"));
  }
  return bytes;
}

absl::StatusOr<std::string> SafetensorsPrefix(const std::vector<TensorRef>& tensors,
                                              const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  for (const TensorRef& t : tensors) {
    const size_t es = SafetensorsDtypeSize(t.dtype);
    if (es == 0) return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name, ": dtype ", t.dtype));
    uint64_t n = 1;
    for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
    header[t.name] = {{"dtype", t.dtype},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + n * es}}};
    offset += n * es;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  const uint64_t len = json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(len >> (8 * i));
  return out + json;
}

absl::StatusOr<WrittenFile> WriteSafetensors(FileSystem* fs, const std::string& path,
                                             const std::vector<TensorRef>& tensors,
                                             const std::map<std::string, std::string>& metadata) {
  MUSTER_ASSIGN_OR_RETURN(std::string prefix, SafetensorsPrefix(tensors, metadata));
  std::unique_ptr<XXH3_state_t, StateDeleter> state(XXH3_createState());
  XXH3_64bits_reset(state.get());
  MUSTER_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, fs->NewWritableFile(path));
  auto put = [&](const void* p, size_t n) {
    XXH3_64bits_update(state.get(), p, n);
    return file->Append(p, n);
  };
  MUSTER_RETURN_IF_ERROR(put(prefix.data(), prefix.size()));
  uint64_t total = prefix.size();
  for (const TensorRef& t : tensors) {
    uint64_t n = SafetensorsDtypeSize(t.dtype);
    for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
    MUSTER_RETURN_IF_ERROR(put(t.data, n));
    total += n;
  }
  MUSTER_RETURN_IF_ERROR(file->Sync());
  MUSTER_RETURN_IF_ERROR(file->Close());
  return WrittenFile{total, Hex(XXH3_64bits_digest(state.get()))};
}

absl::StatusOr<SafetensorsFile> ParseSafetensors(std::string bytes, const std::string& path) {
  SafetensorsFile f;
  f.bytes = std::move(bytes);
  if (f.bytes.size() < 8) {
    return absl::DataLossError(absl::StrCat(path, ": ", f.bytes.size(),
                                            " bytes, too short for the header length"));
  }
  uint64_t len = 0;
  for (int i = 0; i < 8; ++i) len |= uint64_t{static_cast<unsigned char>(f.bytes[i])} << (8 * i);
  if (len > kMaxHeaderBytes || len > f.bytes.size() - 8) {
    return absl::DataLossError(absl::StrCat(path, ": header length ", len, " exceeds the file (",
                                            f.bytes.size(), " bytes) or the 100 MiB limit"));
  }
  nlohmann::json header =
      nlohmann::json::parse(f.bytes.begin() + 8, f.bytes.begin() + 8 + static_cast<int64_t>(len),
                            nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return absl::DataLossError(absl::StrCat(path, ": the header is not a JSON object"));
  }
  const size_t data_start = 8 + len;
  const uint64_t data_size = f.bytes.size() - data_start;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) return absl::DataLossError(absl::StrCat(path, ": __metadata__ is not an object"));
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) {
          return absl::DataLossError(absl::StrCat(path, ": __metadata__.", m.key(), " is not a string"));
        }
        f.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto field = [&](const char* what) { return absl::StrCat(path, ": tensor ", name, ": ", what); };
    if (!v.is_object() || !v.contains("dtype") || !v["dtype"].is_string() ||
        !v.contains("shape") || !v["shape"].is_array() || !v.contains("data_offsets") ||
        !v["data_offsets"].is_array() || v["data_offsets"].size() != 2) {
      return absl::DataLossError(field("needs dtype, shape and two data_offsets"));
    }
    TensorData t;
    t.dtype = v["dtype"].get<std::string>();
    const size_t es = SafetensorsDtypeSize(t.dtype);
    if (es == 0) return absl::DataLossError(field(absl::StrCat("unknown dtype ", t.dtype).c_str()));
    uint64_t n = 1;
    for (const nlohmann::json& d : v["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) {
        return absl::DataLossError(field("shape has a negative or non-integer dimension"));
      }
      t.shape.push_back(d.get<int64_t>());
      // Checked: a wrapped product would let a huge shape pass with few bytes.
      if (__builtin_mul_overflow(n, static_cast<uint64_t>(t.shape.back()), &n)) {
        return absl::DataLossError(field("shape's element count overflows 64 bits"));
      }
    }
    uint64_t need = 0;
    if (__builtin_mul_overflow(n, es, &need)) {
      return absl::DataLossError(field("shape's byte size overflows 64 bits"));
    }
    const nlohmann::json& off = v["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      return absl::DataLossError(field("data_offsets are not non-negative integers"));
    }
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (begin > end || end > data_size) {
      return absl::DataLossError(field(absl::StrCat("data_offsets [", begin, ", ", end,
                                                    ") are past the end of the data (", data_size,
                                                    " bytes)").c_str()));
    }
    if (end - begin != need) {
      return absl::DataLossError(field(absl::StrCat("data_offsets hold ", end - begin,
                                                    " bytes but the shape needs ", need).c_str()));
    }
    t.data = f.bytes.data() + data_start + begin;
    t.size = end - begin;
    f.tensors[name] = t;
  }
  return f;
}

}  // namespace muster
