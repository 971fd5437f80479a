// libFuzzer target over ParseSafetensors: any bytes, as a checkpoint file or
// a peer's state could hold them. Invariants (abort() on violation):
//   - it never crashes and sanitizers stay quiet;
//   - when it parses, every tensor has a known dtype, its data lies inside
//     the file after the header, and its size is exactly the product of its
//     shape times the dtype's size (computed without overflow);
//   - what it parsed, written again with SafetensorsPrefix, parses back to
//     the same tensors and metadata.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "trainer/checkpoint/safetensors.h"

namespace muster {
namespace {

// Re-encoding is skipped beyond this many bytes of tensor data (tensors may
// overlap, so the sum can exceed the input).
constexpr uint64_t kMaxRewriteBytes = 8 << 20;

[[noreturn]] void Fail(const std::string& name, const char* what) {
  std::fprintf(stderr, "\n==== safetensors_fuzz: tensor \"%s\": %s ====\n", name.c_str(), what);
  std::abort();
}

// The product of `shape` times `element` bytes; false when it does not fit
// in 64 bits (exact: a zero dimension makes it 0 whatever the others).
bool ExpectedBytes(const std::vector<int64_t>& shape, size_t element, uint64_t* bytes) {
  for (int64_t d : shape) {
    if (d == 0) {
      *bytes = 0;
      return true;
    }
  }
  uint64_t n = element;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return false;
  }
  *bytes = n;
  return true;
}

void CheckTensors(const SafetensorsFile& f) {
  uint64_t header = 0;
  for (int i = 0; i < 8; ++i) {
    header |= uint64_t{static_cast<unsigned char>(f.bytes[i])} << (8 * i);
  }
  const char* data_begin = f.bytes.data() + 8 + header;
  const char* file_end = f.bytes.data() + f.bytes.size();
  for (const auto& [name, t] : f.tensors) {
    const size_t element = SafetensorsDtypeSize(t.dtype);
    if (element == 0) Fail(name, "unknown dtype accepted");
    uint64_t expected = 0;
    if (!ExpectedBytes(t.shape, element, &expected)) {
      Fail(name, "accepted although shape x dtype size overflows 64 bits");
    }
    if (expected != t.size) Fail(name, "size differs from shape x dtype size");
    if (t.data < data_begin || t.data > file_end ||
        t.size > static_cast<uint64_t>(file_end - t.data)) {
      Fail(name, "data outside the file's data section");
    }
  }
}

// Writes `f`'s tensors (in name order, back to back) and metadata again and
// parses the result.
void CheckRewrite(const SafetensorsFile& f) {
  std::vector<TensorRef> refs;
  uint64_t total = 0;
  for (const auto& [name, t] : f.tensors) {
    refs.push_back(TensorRef{name, t.dtype, t.shape, t.data});
    total += t.size;
  }
  if (total > kMaxRewriteBytes) return;
  absl::StatusOr<std::string> prefix = SafetensorsPrefix(refs, f.metadata);
  if (!prefix.ok()) Fail("*", "SafetensorsPrefix rejected what ParseSafetensors accepted");
  std::string file = *prefix;
  for (const auto& [name, t] : f.tensors) file.append(t.data, t.size);
  absl::StatusOr<SafetensorsFile> again = ParseSafetensors(std::move(file), "rewritten");
  if (!again.ok()) {
    std::fprintf(stderr, "%s\n", again.status().ToString().c_str());
    Fail("*", "a rewritten file does not parse");
  }
  if (again->metadata != f.metadata) Fail("*", "metadata changed by a rewrite");
  if (again->tensors.size() != f.tensors.size()) Fail("*", "tensor count changed by a rewrite");
  for (const auto& [name, t] : f.tensors) {
    auto it = again->tensors.find(name);
    if (it == again->tensors.end()) Fail(name, "lost by a rewrite");
    const TensorData& u = it->second;
    if (u.dtype != t.dtype || u.shape != t.shape || u.size != t.size ||
        std::string(u.data, u.size) != std::string(t.data, t.size)) {
      Fail(name, "changed by a rewrite");
    }
  }
}

}  // namespace
}  // namespace muster

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<muster::SafetensorsFile> f = muster::ParseSafetensors(
      std::string(reinterpret_cast<const char*>(data), size), "fuzz.safetensors");
  if (!f.ok()) return 0;
  muster::CheckTensors(*f);
  muster::CheckRewrite(*f);
  return 0;
}
