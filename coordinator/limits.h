// Size limits on everything a client can send. Checked by the domain classes
// so that no input can exhaust memory; a violation is INVALID_ARGUMENT (bad
// shape) or RESOURCE_EXHAUSTED (too much) with a message naming the limit.
#ifndef MUSTER_COORDINATOR_LIMITS_H_
#define MUSTER_COORDINATOR_LIMITS_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace muster {

struct Limits {
  size_t max_id_bytes = 128;          // member ids, node names, barrier names
  size_t max_address_bytes = 256;     // state service address
  size_t max_key_bytes = 512;         // KV keys
  size_t max_value_bytes = 1 << 20;   // KV values
  size_t max_keys_per_get = 64;
  size_t max_keys_per_generation = 100'000;
  size_t max_kv_bytes_per_generation = 256u << 20;
  size_t max_members = 200'000;       // tracked members, all states
  size_t max_files_per_report = 64;
  size_t max_path_bytes = 4096;
  size_t max_reason_bytes = 1024;
  uint32_t max_wait_ms = 600'000;
  // Blocking calls (Rendezvous, Barrier, KvGet with a wait) one caller may
  // have waiting at once: per member, or per connection for KvGet, which
  // names no member.
  int max_waits_per_caller = 64;
};

// INVALID_ARGUMENT when `value` is empty or longer than `max` bytes; the
// message names `field`.
absl::Status CheckName(absl::string_view field, absl::string_view value, size_t max);
// Like CheckName but empty is allowed. Both reject control characters
// (bytes below 0x20 and 0x7f), which would forge log lines.
absl::Status CheckOptional(absl::string_view field, absl::string_view value, size_t max);
// For text that must be kept even when it fails CheckOptional (a detached
// member's cause): `value` cut to `max` bytes, each control character
// replaced by '?'.
std::string Printable(absl::string_view value, size_t max);

}  // namespace muster

#endif  // MUSTER_COORDINATOR_LIMITS_H_
