#include "coordinator/limits.h"

#include "absl/strings/str_cat.h"

namespace muster {
namespace {

// Names and reasons end up in logs and the event log: a newline or an
// escape sequence would forge lines there.
bool IsControl(char c) {
  const unsigned char u = static_cast<unsigned char>(c);
  return u < 0x20 || u == 0x7f;
}

}  // namespace

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
  for (size_t i = 0; i < value.size(); ++i) {
    if (IsControl(value[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, " contains control character 0x",
          absl::Hex(static_cast<unsigned char>(value[i]), absl::kZeroPad2), " at byte ", i));
    }
  }
  return absl::OkStatus();
}

std::string Printable(absl::string_view value, size_t max) {
  std::string out(value.substr(0, max));
  for (char& c : out) {
    if (IsControl(c)) c = '?';
  }
  return out;
}

}  // namespace muster
