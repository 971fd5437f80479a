#include "coordinator/tcp_table.h"

#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace muster {
namespace {

// "sl local remote st tx:rx tr:when retrnsmt uid timeout inode ...".
std::optional<TcpSocket> ParseRow(absl::string_view line) {
  const std::vector<absl::string_view> f =
      absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
  if (f.size() < 10 || !absl::EndsWith(f[0], ":")) return std::nullopt;
  TcpSocket s;
  s.local = std::string(f[1]);
  s.remote = std::string(f[2]);
  const size_t colon = f[1].rfind(':');
  uint32_t port = 0, state = 0;
  if (colon == absl::string_view::npos ||
      !absl::SimpleHexAtoi(f[1].substr(colon + 1), &port) ||
      !absl::SimpleHexAtoi(f[3], &state) || !absl::SimpleAtoi(f[9], &s.inode)) {
    return std::nullopt;
  }
  s.local_port = static_cast<int>(port);
  s.state = static_cast<int>(state);
  return s;
}

// The whole file; "" when it is missing and `missing_ok`.
absl::StatusOr<std::string> ReadProcFile(const char* path, bool missing_ok) {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT && missing_ok) return std::string();
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  std::string text;
  char buf[1 << 16];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof(buf))) > 0) text.append(buf, static_cast<size_t>(n));
  const int err = errno;
  ::close(fd);
  if (n < 0) return absl::UnavailableError(absl::StrCat("cannot read ", path, ": ", std::strerror(err)));
  return text;
}

absl::flat_hash_set<uint64_t> ListeningInodes(const std::vector<TcpSocket>& table, int port) {
  absl::flat_hash_set<uint64_t> inodes;
  for (const TcpSocket& s : table) {
    if (s.state == kTcpListen && s.local_port == port && s.inode != 0) inodes.insert(s.inode);
  }
  return inodes;
}

// The inode of the socket open as `fd`; nullopt when `fd` is not an open
// socket.
std::optional<uint64_t> SocketInode(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return std::nullopt;
  return static_cast<uint64_t>(st.st_ino);
}

// The descriptor `name` (in /proc/self/fd) when it is a socket with one of
// `inodes`.
std::optional<ListeningSocket> SocketWithInode(const char* name,
                                               const absl::flat_hash_set<uint64_t>& inodes) {
  int fd = -1;
  if (!absl::SimpleAtoi(name, &fd)) return std::nullopt;
  const std::optional<uint64_t> inode = SocketInode(fd);
  if (!inode.has_value() || !inodes.contains(*inode)) return std::nullopt;
  return ListeningSocket{fd, *inode};
}

}  // namespace

std::vector<TcpSocket> ParseTcpTable(absl::string_view text) {
  std::vector<TcpSocket> rows;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    if (std::optional<TcpSocket> row = ParseRow(line)) rows.push_back(*std::move(row));
  }
  return rows;
}

std::vector<std::string> UnacceptedConnections(const std::vector<TcpSocket>& table, int port) {
  std::vector<std::string> waiting;
  for (const TcpSocket& s : table) {
    if (s.local_port == port && s.inode == 0 &&
        (s.state == kTcpEstablished || s.state == kTcpCloseWait)) {
      waiting.push_back(absl::StrCat(s.local, " ", s.remote));
    }
  }
  return waiting;
}

absl::StatusOr<std::string> ReadTcpTables() {
  MUSTER_ASSIGN_OR_RETURN(std::string v4, ReadProcFile("/proc/self/net/tcp", /*missing_ok=*/false));
  MUSTER_ASSIGN_OR_RETURN(std::string v6, ReadProcFile("/proc/self/net/tcp6", /*missing_ok=*/true));
  return absl::StrCat(v4, v6);
}

absl::StatusOr<std::vector<ListeningSocket>> FindListeningSockets(int port) {
  MUSTER_ASSIGN_OR_RETURN(const std::string tables, ReadTcpTables());
  const absl::flat_hash_set<uint64_t> inodes = ListeningInodes(ParseTcpTable(tables), port);
  std::vector<ListeningSocket> found;
  if (inodes.empty()) return found;
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cannot list /proc/self/fd: ", std::strerror(errno)));
  }
  while (const dirent* entry = ::readdir(dir)) {
    if (std::optional<ListeningSocket> s = SocketWithInode(entry->d_name, inodes)) {
      found.push_back(*s);
    }
  }
  ::closedir(dir);
  return found;
}

std::optional<uint32_t> AcceptQueueLength(const ListeningSocket& socket) {
  if (SocketInode(socket.fd) != socket.inode) return std::nullopt;
  tcp_info info{};
  socklen_t len = sizeof(info);
  if (::getsockopt(socket.fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0 ||
      info.tcpi_state != kTcpListen) {
    return std::nullopt;
  }
  // For a listener the kernel gives its accept queue's length here
  // (tcp_get_info: "tcpi_unacked -> Number of children ready for accept()").
  return info.tcpi_unacked;
}

absl::StatusOr<int> ShutDownListeningSockets(int port) {
  MUSTER_ASSIGN_OR_RETURN(const std::vector<ListeningSocket> sockets, FindListeningSockets(port));
  int shut = 0;
  for (const ListeningSocket& s : sockets) {
    if (::shutdown(s.fd, SHUT_RDWR) == 0) ++shut;
  }
  return shut;
}

}  // namespace muster
