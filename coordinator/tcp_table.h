// The kernel's TCP socket tables (/proc/self/net/tcp and tcp6), read to
// tell whether a listening socket of this process still accepts, and to shut
// one down from outside the library that owns it (coordinator/
// listener_watchdog.h says why); and a listening socket's own accept queue,
// read without the tables.
//
// Linux only. The parsing functions are pure; the others read /proc or ask
// the kernel about a descriptor and are safe to call from any thread.
#ifndef MUSTER_COORDINATOR_TCP_TABLE_H_
#define MUSTER_COORDINATOR_TCP_TABLE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace muster {

// The states /proc/net/tcp writes (include/net/tcp_states.h), in hex there.
inline constexpr int kTcpEstablished = 0x01;
inline constexpr int kTcpCloseWait = 0x08;
inline constexpr int kTcpListen = 0x0A;

// One row of a table.
struct TcpSocket {
  std::string local;   // "ADDR:PORT", in hex, as the table writes it
  std::string remote;  // the same for the peer
  int local_port = 0;
  int state = 0;
  // The socket file's inode: 0 when no process holds the socket, which for
  // an established connection means it waits in a listener's accept queue.
  uint64_t inode = 0;
};

// The rows of one table's text; the header and malformed rows are skipped.
std::vector<TcpSocket> ParseTcpTable(absl::string_view text);

// Connections to local port `port` that wait to be accepted (established or
// already closed by the peer, and held by no process), each named by its
// "LOCAL REMOTE" address pair.
std::vector<std::string> UnacceptedConnections(const std::vector<TcpSocket>& table, int port);

// Both tables of this process's network namespace, concatenated (tcp6 may
// be missing). Errors: UNAVAILABLE when a table cannot be opened or read,
// e.g. when this process has no free file descriptor.
absl::StatusOr<std::string> ReadTcpTables();

// A listening TCP socket of this process: its descriptor, and the inode
// that tells the same socket from another later given that descriptor.
struct ListeningSocket {
  int fd = -1;
  uint64_t inode = 0;
};

// The sockets this process holds listening on local port `port` (IPv4 and
// IPv6). Errors: UNAVAILABLE when /proc cannot be read, e.g. when this
// process has no free file descriptor.
absl::StatusOr<std::vector<ListeningSocket>> FindListeningSockets(int port);

// How many connections wait in `socket`'s accept queue, from the kernel's
// TCP_INFO of the listener itself (no descriptor is opened: it works when
// the process has none free). nullopt when `socket.fd` is no longer that
// socket, or it no longer listens. Reading the tables instead walks the
// kernel's whole connection hash, whose size grows with the host's memory
// (milliseconds on a small host), however few connections there are.
std::optional<uint32_t> AcceptQueueLength(const ListeningSocket& socket);

// Shuts down (shutdown(2)) every listening TCP socket this process holds on
// `port`: the kernel resets the connections in its accept queue and queues
// no more, and another socket may bind the port. The descriptors stay open;
// whoever owns them still closes them. Returns how many were shut down.
// Errors: UNAVAILABLE when /proc cannot be read.
absl::StatusOr<int> ShutDownListeningSockets(int port);

}  // namespace muster

#endif  // MUSTER_COORDINATOR_TCP_TABLE_H_
