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
  return absl::OkStatus();
}

}  // namespace muster
