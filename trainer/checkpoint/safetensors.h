// safetensors, the tensor file format readable by Python's safetensors and
// any language: an 8-byte little-endian header length N, N bytes of JSON
// ({"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]},
// ..., "__metadata__": {"key": "value"}}) padded with spaces to a multiple of
// 8, then the raw little-endian tensor data, offsets relative to its start.
//
// Pure functions on buffers and a FileSystem; no LibTorch. Thread-compatible.
#ifndef MUSTER_TRAINER_CHECKPOINT_SAFETENSORS_H_
#define MUSTER_TRAINER_CHECKPOINT_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/file_system.h"

namespace muster {

// Bytes per element of a safetensors dtype ("F32", "F16", "BF16", "F64",
// "I64", "I32", "I16", "I8", "U8", "BOOL"); 0 for an unknown one.
size_t SafetensorsDtypeSize(const std::string& dtype);

struct TensorRef {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // shape's product * dtype size bytes
};

// The first bytes of a safetensors file holding `tensors` (data pointers
// ignored) back to back in order: the 8-byte length and the padded JSON
// header. The data follows immediately. Errors: INVALID_ARGUMENT (dtype).
absl::StatusOr<std::string> SafetensorsPrefix(const std::vector<TensorRef>& tensors,
                                              const std::map<std::string, std::string>& metadata);

struct WrittenFile {
  uint64_t bytes = 0;
  std::string xxh3;  // 16 lower-case hex digits of XXH3-64 over the whole file
};

// Writes `tensors` (in order) and `metadata` to `path` through `fs`:
// streaming, checksummed; the caller handles temp names and renames.
absl::StatusOr<WrittenFile> WriteSafetensors(FileSystem* fs, const std::string& path,
                                             const std::vector<TensorRef>& tensors,
                                             const std::map<std::string, std::string>& metadata);

struct TensorData {
  std::string dtype;
  std::vector<int64_t> shape;
  const char* data = nullptr;  // into SafetensorsFile::bytes
  size_t size = 0;
};

struct SafetensorsFile {
  std::string bytes;  // the whole file
  std::map<std::string, TensorData> tensors;
  std::map<std::string, std::string> metadata;
};

// Parses a whole file. Errors are DATA_LOSS naming `path` and the field: a
// truncated or oversized header, invalid JSON, an unknown dtype, a negative
// dimension, offsets past the end or not matching the shape.
absl::StatusOr<SafetensorsFile> ParseSafetensors(std::string bytes, const std::string& path);

// XXH3-64 of `data` as 16 hex digits.
std::string Xxh3Hex(const void* data, size_t n);

// The largest checkpoint file read back (64 GiB).
inline constexpr uint64_t kMaxCheckpointFileBytes = uint64_t{64} << 30;

// The bytes of the checkpoint file `path`, whose XXH3-64 `source` ("its
// record": the catalog's or a manifest's; "the manifest") says is `xxh3`.
// DATA_LOSS naming the file and both checksums when they differ; the file
// system's errors.
absl::StatusOr<std::string> ReadChecked(FileSystem* fs, const std::string& path,
                                        const std::string& xxh3, const std::string& source);

}  // namespace muster

#endif  // MUSTER_TRAINER_CHECKPOINT_SAFETENSORS_H_
