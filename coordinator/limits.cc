#include "coordinator/limits.h"

#include "absl/strings/str_cat.h"

namespace muster {

absl::Status CheckName(absl::string_view field, absl::string_view value, size_t max) {
  if (value.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(field, " is empty"));
  }
  return CheckOptional(field, value, max);
}

absl::Status CheckOptional(absl::string_view field, absl::string_view value, size_t max) {
  if (value.size() > max) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " is ", value.size(), " bytes; the limit is ", max));
  }
  // Names and reasons end up in logs and the event log: a newline or an
  // escape sequence would forge lines there.
  for (size_t i = 0; i < value.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(value[i]);
    if (c < 0x20 || c == 0x7f) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, " contains control character 0x", absl::Hex(c, absl::kZeroPad2),
          " at byte ", i));
    }
  }
  return absl::OkStatus();
}

}  // namespace muster
