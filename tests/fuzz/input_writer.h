// InputWriter: builds fuzz inputs that FuzzedDataProvider reads back as the
// given values, so the seed generator (write_seeds.cc) can spell valid call
// sequences in the targets' own input format.
//
// FuzzedDataProvider (LLVM 14) takes integers from the END of the data, most
// significant byte first, using as many bytes as the range needs, and byte
// strings from the FRONT. This class keeps the two streams apart and joins
// them in Finish(). It mirrors only the calls the targets use:
// ConsumeIntegralInRange, ConsumeBool and ConsumeBytesAsString.
//
// Thread-compatible; no gRPC, no fuzzer runtime.
#ifndef MUSTER_TESTS_FUZZ_INPUT_WRITER_H_
#define MUSTER_TESTS_FUZZ_INPUT_WRITER_H_

#include <cstdint>
#include <string>
#include <vector>

namespace muster::fuzz {

class InputWriter {
 public:
  // What ConsumeIntegralInRange<T>(min, max) returns as `value`
  // (min <= value <= max; values of signed T passed as int64_t).
  void Int(int64_t value, int64_t min, int64_t max) {
    Raw(static_cast<uint64_t>(value) - static_cast<uint64_t>(min),
        static_cast<uint64_t>(max) - static_cast<uint64_t>(min));
  }
  void Uint(uint64_t value, uint64_t min, uint64_t max) { Raw(value - min, max - min); }
  // What ConsumeBool() returns.
  void Bool(bool value) { tail_.push_back(value ? 1 : 0); }
  // What ConsumeBytesAsString(bytes.size()) returns.
  void Bytes(const std::string& bytes) { front_ += bytes; }

  // The input: the front stream, then the integers in reverse order of use.
  std::string Finish() const {
    std::string out = front_;
    out.append(tail_.rbegin(), tail_.rend());
    return out;
  }

 private:
  // `offset` = value - min, `range` = max - min: FuzzedDataProvider reads a
  // byte while range >> (8 * bytes read) is non-zero.
  void Raw(uint64_t offset, uint64_t range) {
    int bytes = 0;
    while (bytes < 8 && (range >> (8 * bytes)) != 0) ++bytes;
    for (int i = bytes - 1; i >= 0; --i) tail_.push_back(static_cast<char>(offset >> (8 * i)));
  }

  std::string front_;
  std::vector<char> tail_;  // in the order FuzzedDataProvider consumes it
};

}  // namespace muster::fuzz

#endif  // MUSTER_TESTS_FUZZ_INPUT_WRITER_H_
