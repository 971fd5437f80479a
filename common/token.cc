#include "common/token.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace muster {

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(
        absl::StrCat("token file ", path, ": ", std::strerror(errno)));
  }
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%03o", st.st_mode & 0777);
    return absl::PermissionDeniedError(absl::StrCat(
        "token file ", path, " is accessible by group or others (mode ", mode,
        "); chmod 600 it"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot open token file ", path));
  }
  std::ostringstream buf;
  buf << in.rdbuf();
  std::string token(absl::StripAsciiWhitespace(buf.str()));
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("token file ", path, " is empty"));
  }
  if (token.size() > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("token file ", path, " holds more than 4096 bytes"));
  }
  return token;
}

absl::StatusOr<std::string> ResolveToken(const std::string& flag_path) {
  if (!flag_path.empty()) return ReadTokenFile(flag_path);
  const char* env = std::getenv("MUSTER_TOKEN_FILE");
  if (env != nullptr && env[0] != '\0') return ReadTokenFile(env);
  return std::string();
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  volatile unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = diff | static_cast<unsigned char>(a[i] ^ b[i]);
  }
  return diff == 0;
}

}  // namespace muster
