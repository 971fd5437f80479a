#include "trainer/data/idx.h"

#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace muster {
namespace {

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};

// Reads exactly `n` bytes; false on a short read.
bool ReadExactly(gzFile f, void* out, size_t n) {
  char* p = static_cast<char*>(out);
  while (n > 0) {
    const unsigned chunk = static_cast<unsigned>(std::min<size_t>(n, 1u << 30));
    const int got = gzread(f, p, chunk);
    if (got <= 0) return false;
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

uint32_t BigEndian(const unsigned char b[4]) {
  return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | b[3];
}

}  // namespace

absl::StatusOr<IdxArray> ReadIdx(const std::string& path, int expected_dims) {
  std::unique_ptr<gzFile_s, GzCloser> f(gzopen(path.c_str(), "rb"));
  if (!f) {
    return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  unsigned char header[4];
  if (!ReadExactly(f.get(), header, 4)) {
    return absl::DataLossError(absl::StrCat(path, ": truncated before the magic number"));
  }
  const uint32_t magic = BigEndian(header);
  const uint32_t want = 0x0800u | static_cast<uint32_t>(expected_dims);
  if (magic != want) {
    return absl::DataLossError(absl::StrFormat(
        "%s: magic number is 0x%08x; expected 0x%08x (uint8, %d dimensions)", path, magic, want,
        expected_dims));
  }
  IdxArray out;
  uint64_t total = 1;
  for (int d = 0; d < expected_dims; ++d) {
    if (!ReadExactly(f.get(), header, 4)) {
      return absl::DataLossError(absl::StrCat(path, ": truncated in dimension ", d));
    }
    out.dims.push_back(BigEndian(header));
    total *= out.dims.back();
  }
  if (total > (uint64_t{1} << 34)) {
    return absl::ResourceExhaustedError(absl::StrCat(path, ": declares ", total, " bytes"));
  }
  out.data.resize(total);
  if (!ReadExactly(f.get(), out.data.data(), total)) {
    return absl::DataLossError(absl::StrCat(path, ": truncated: the header declares ", total,
                                            " data bytes"));
  }
  return out;
}

}  // namespace muster
