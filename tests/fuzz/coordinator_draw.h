// Draws the fields of coordinator_fuzz's requests from FuzzedDataProvider:
// mostly values that make sense together (known member ids, the current
// generation), sometimes anything. Also reads an input's setup part
// (coordinator_input.h). Header-only; used by coordinator_fuzz.cc alone.
#ifndef MUSTER_TESTS_FUZZ_COORDINATOR_DRAW_H_
#define MUSTER_TESTS_FUZZ_COORDINATOR_DRAW_H_

#include <fuzzer/FuzzedDataProvider.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "coordinator/coordinator.h"
#include "muster/v1/coordinator.pb.h"
#include "tests/fuzz/coordinator_input.h"

namespace muster::fuzz {

// Request fields; `coordinator` gives the current generation.
class Draw {
 public:
  Draw(FuzzedDataProvider* in, Coordinator* coordinator) : in_(in), coordinator_(coordinator) {}

  uint8_t Choice(uint8_t n) { return in_->ConsumeIntegralInRange<uint8_t>(0, n - 1); }

  // ASCII only: a proto3 string must be UTF-8 (else gRPC drops the call
  // before the service sees it).
  std::string Text(size_t max) {
    std::string s = in_->ConsumeBytesAsString(in_->ConsumeIntegralInRange<size_t>(0, max));
    for (char& c : s) c = static_cast<char>(c & 0x7f);
    return s;
  }
  std::string Id() {
    const uint8_t c = Choice(5);
    return c < 3 ? absl::StrCat("m", c) : c == 3 ? std::string() : Text(160);
  }
  uint64_t Incarnation() {
    switch (Choice(4)) {
      case 0: return 1;
      case 1: return 2;
      case 2: return 0;
      default: return in_->ConsumeIntegral<uint64_t>();
    }
  }
  void Member(v1::MemberRef* ref) {
    ref->set_member_id(Id());
    ref->set_incarnation(Incarnation());
  }
  std::string Node() {
    switch (Choice(4)) {
      case 0: return "n0";
      case 1: return "n1";
      case 2: return "";
      default: return Text(160);
    }
  }
  uint64_t Generation() {
    const uint64_t current = coordinator_->GetStatus().generation;
    switch (Choice(5)) {
      case 0: case 1: return current;
      case 2: return current - 1;
      case 3: return current + 1;
      default: return in_->ConsumeIntegral<uint64_t>();
    }
  }
  int64_t Step() {
    switch (Choice(4)) {
      case 0: return 0;
      case 1: return in_->ConsumeIntegralInRange<int64_t>(1, 200);
      case 2: return -1;
      default: return in_->ConsumeIntegral<int64_t>();
    }
  }
  uint32_t Millis() {
    switch (Choice(4)) {
      case 0: return 0;
      case 1: return 50;
      case 2: return 5'000;
      default: return in_->ConsumeIntegral<uint32_t>();
    }
  }
  std::string Key() {
    switch (Choice(3)) {
      case 0: return "k0";
      case 1: return "k1";
      default: return Text(600);
    }
  }
  std::string Value() {
    switch (Choice(4)) {
      case 0: return Text(64);
      case 1: return std::to_string(in_->ConsumeIntegral<int64_t>());
      case 2: return std::string(in_->ConsumeIntegralInRange<size_t>(4'000, 4'200), 'v');
      default: return "";
    }
  }
  uint64_t CheckpointId() {
    const uint8_t c = Choice(4);
    return c < 3 ? c + 1 : in_->ConsumeIntegral<uint64_t>();
  }
  double Metric() {
    switch (Choice(5)) {
      case 0: return 0.25;
      case 1: return 2.5;
      case 2: return std::nan("");
      case 3: return -std::numeric_limits<double>::infinity();
      default: return static_cast<double>(in_->ConsumeIntegral<int64_t>());
    }
  }

 private:
  FuzzedDataProvider* const in_;
  Coordinator* const coordinator_;
};

// Reads the setup part of an input (coordinator_input.h).
inline CoordinatorOptions ReadOptions(FuzzedDataProvider* in) {
  CoordinatorOptions o;
  o.rules.min_members = in->ConsumeIntegralInRange<uint32_t>(1, 3);
  o.rules.max_members = o.rules.min_members + in->ConsumeIntegralInRange<uint32_t>(0, 2);
  o.rules.last_call = in->ConsumeBool() ? absl::Milliseconds(kLastCallMs) : absl::ZeroDuration();
  o.rules.world_size_multiple = in->ConsumeIntegralInRange<uint32_t>(1, 2);
  o.catalog.keep_last = in->ConsumeIntegralInRange<uint32_t>(0, 3);
  switch (in->ConsumeIntegralInRange<uint8_t>(0, 2)) {
    case 1: o.catalog.keep_best_metric = "loss"; break;
    case 2: o.catalog.keep_best_metric = "accuracy"; o.catalog.keep_best_larger = true; break;
    default: break;
  }
  // Small limits, so that inputs reach them (and the state stays small).
  o.limits.max_value_bytes = 4096;
  o.limits.max_keys_per_get = 8;
  o.limits.max_keys_per_generation = 64;
  o.limits.max_kv_bytes_per_generation = 64 << 10;
  o.limits.max_members = 32;
  o.limits.max_files_per_report = 8;
  o.limits.max_path_bytes = 512;
  o.limits.max_reason_bytes = 256;
  return o;
}

}  // namespace muster::fuzz

#endif  // MUSTER_TESTS_FUZZ_COORDINATOR_DRAW_H_
