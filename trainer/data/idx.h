// The IDX format of (Fashion-)MNIST: a big-endian magic number (0x00000803
// for uint8 images of 3 dimensions, 0x00000801 for uint8 labels), the
// dimension sizes as big-endian uint32, then the raw bytes. Files may be
// gzip-compressed.
#ifndef MUSTER_TRAINER_DATA_IDX_H_
#define MUSTER_TRAINER_DATA_IDX_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace muster {

struct IdxArray {
  std::vector<uint32_t> dims;
  std::vector<uint8_t> data;
};

// Reads an IDX file of uint8 with `expected_dims` dimensions. Errors:
// NOT_FOUND (no file), DATA_LOSS naming the file and what is wrong (magic,
// dimension count, truncated data), RESOURCE_EXHAUSTED (absurd sizes).
absl::StatusOr<IdxArray> ReadIdx(const std::string& path, int expected_dims);

}  // namespace muster

#endif  // MUSTER_TRAINER_DATA_IDX_H_
