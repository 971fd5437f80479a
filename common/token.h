// Job tokens: the shared secret every rpc carries.
#ifndef MUSTER_COMMON_TOKEN_H_
#define MUSTER_COMMON_TOKEN_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace muster {

// Reads a token from `path`, trimming surrounding white space. Errors:
// NOT_FOUND (no such file), PERMISSION_DENIED (the file is readable by group
// or others: it must be 0600 or stricter), INVALID_ARGUMENT (empty, or longer
// than 4096 bytes).
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// The token from `flag_path` if set, else from the file named by
// $MUSTER_TOKEN_FILE, else "" (no token configured).
absl::StatusOr<std::string> ResolveToken(const std::string& flag_path);

// Compares in time that depends only on the lengths, not on where the
// strings first differ.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

}  // namespace muster

#endif  // MUSTER_COMMON_TOKEN_H_
