// The listener watchdog's parts: the kernel's TCP tables parsed, waiting
// connections aged, a real listening socket that never accepts found, shut
// down and rebound, and the watchdog's rebuild retried until it succeeds.
#include "coordinator/listener_watchdog.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/time/clock.h"
#include "common/clock.h"
#include "coordinator/tcp_table.h"
#include "tests/integration/subprocess.h"

namespace muster {
namespace {

// Rows as Linux 6.1 writes them: a listener on 127.0.0.1:29777 (0x7451),
// one connection to it in its accept queue (inode 0), one accepted, one the
// peer closed before it was accepted, and a client's end of a connection.
constexpr char kTable[] =
    "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  "
    "timeout inode\n"
    "   0: 0100007F:7451 00000000:0000 0A 00000000:00000002 00:00000000 00000000     0  "
    "      0 39746 1 0000000050bceeab 100 0 0 10 0\n"
    "   1: 0100007F:7451 0100007F:A72A 01 00000000:00000000 00:00000000 00000000     0  "
    "      0 0 1 00000000c24cffe1 20 4 0 10 -1\n"
    "   2: 0100007F:7451 0100007F:A5E4 01 00000000:00000000 00:00000000 00000000     0  "
    "      0 41000 1 00000000363f3ac1 20 4 0 10 -1\n"
    "   3: 0100007F:7451 0100007F:A600 08 00000000:00000001 00:00000000 00000000     0  "
    "      0 0 1 00000000363f3ac2 20 4 0 10 -1\n"
    "   4: 0100007F:A72A 0100007F:7451 01 00000000:00000000 00:00000000 00000000     0  "
    "      0 41001 1 00000000363f3ac3 20 4 0 10 -1\n";

TEST(TcpTableTest, RowsAreParsedAndTheHeaderSkipped) {
  const std::vector<TcpSocket> rows = ParseTcpTable(kTable);
  ASSERT_EQ(rows.size(), 5u);
  EXPECT_EQ(rows[0].local, "0100007F:7451");
  EXPECT_EQ(rows[0].local_port, 29777);
  EXPECT_EQ(rows[0].state, kTcpListen);
  EXPECT_EQ(rows[0].inode, 39746u);
  EXPECT_EQ(rows[1].state, kTcpEstablished);
  EXPECT_EQ(rows[1].inode, 0u);
  EXPECT_EQ(rows[4].local_port, 0xA72A);
  EXPECT_TRUE(ParseTcpTable("garbage\n1: too short\n").empty());
}

TEST(TcpTableTest, OnlyConnectionsToThePortThatNoProcessHoldsAreUnaccepted) {
  const std::vector<std::string> waiting = UnacceptedConnections(ParseTcpTable(kTable), 29777);
  EXPECT_EQ(waiting, (std::vector<std::string>{"0100007F:7451 0100007F:A72A",
                                               "0100007F:7451 0100007F:A600"}));
  EXPECT_TRUE(UnacceptedConnections(ParseTcpTable(kTable), 29778).empty());
}

TEST(AcceptQueueAgesTest, AConnectionAgesWhileItWaitsAndIsForgottenOnceTaken) {
  AcceptQueueAges ages;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  EXPECT_EQ(ages.Observe({"a"}, t0), absl::ZeroDuration());
  EXPECT_EQ(ages.Observe({"a", "b"}, t0 + absl::Seconds(1)), absl::Seconds(1));
  // a was accepted; b has waited 1 s.
  EXPECT_EQ(ages.Observe({"b"}, t0 + absl::Seconds(2)), absl::Seconds(1));
  // a comes back (a new connection from the same port): new again.
  EXPECT_EQ(ages.Observe({"a"}, t0 + absl::Seconds(3)), absl::ZeroDuration());
  ages.Clear();
  EXPECT_EQ(ages.Observe({"a"}, t0 + absl::Seconds(4)), absl::ZeroDuration());
}

// A loopback listener that never accepts, with SO_REUSEADDR as gRPC sets it.
int Listen(int port, int* bound) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 16) != 0) {
    ::close(fd);
    return -1;
  }
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  *bound = ntohs(addr.sin_port);
  return fd;
}

TEST(TcpTableTest, ADeadListenerIsSeenShutDownAndItsPortBoundAgain) {
  int port = 0;
  const int listener = Listen(0, &port);
  ASSERT_GE(listener, 0);
  const int client = ConnectLoopback(port);
  ASSERT_GE(client, 0);
  absl::StatusOr<std::string> tables = ReadTcpTables();
  ASSERT_TRUE(tables.ok()) << tables.status();
  EXPECT_EQ(UnacceptedConnections(ParseTcpTable(*tables), port).size(), 1u);

  absl::StatusOr<int> shut = ShutDownListeningSockets(port);
  ASSERT_TRUE(shut.ok()) << shut.status();
  EXPECT_EQ(*shut, 1);
  // The connection in the queue is reset; the port can be bound again while
  // the old descriptor is still open.
  char byte;
  EXPECT_LE(::recv(client, &byte, 1, 0), 0);
  int again_port = 0;
  const int again = Listen(port, &again_port);
  EXPECT_GE(again, 0);
  EXPECT_EQ(again_port, port);
  for (int fd : {client, listener, again}) ::close(fd);
}

TEST(TcpTableTest, AListenersAcceptQueueIsReadFromTheSocketItself) {
  int port = 0;
  const int listener = Listen(0, &port);
  ASSERT_GE(listener, 0);
  absl::StatusOr<std::vector<ListeningSocket>> found = FindListeningSockets(port);
  ASSERT_TRUE(found.ok()) << found.status();
  ASSERT_EQ(found->size(), 1u);
  const ListeningSocket socket = found->front();
  EXPECT_EQ(socket.fd, listener);
  EXPECT_EQ(AcceptQueueLength(socket), 0u);

  std::vector<int> clients = {ConnectLoopback(port), ConnectLoopback(port)};
  // The handshake's last ACK may reach the listener just after connect returns.
  const absl::Time end = absl::Now() + absl::Seconds(5);
  while (AcceptQueueLength(socket) != 2u && absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(AcceptQueueLength(socket), 2u);
  const int accepted = ::accept(listener, nullptr, nullptr);
  EXPECT_EQ(AcceptQueueLength(socket), 1u);

  // Another socket under the same descriptor is not the listener, nor is a
  // listener that was shut down.
  ListeningSocket other = socket;
  other.inode += 1;
  EXPECT_EQ(AcceptQueueLength(other), std::nullopt);
  ASSERT_EQ(::shutdown(listener, SHUT_RDWR), 0);
  EXPECT_EQ(AcceptQueueLength(socket), std::nullopt);
  for (int fd : clients) ::close(fd);
  for (int fd : {accepted, listener}) ::close(fd);
}

TEST(ListenerWatchdogTest, AConnectionNobodyAcceptsAsksForARebuildUntilOneSucceeds) {
  int port = 0;
  const int listener = Listen(0, &port);
  ASSERT_GE(listener, 0);
  std::atomic<int> calls{0};
  std::atomic<int64_t> waited_ms{0};
  ListenerWatchdog watchdog(
      {port, absl::Milliseconds(20), absl::Milliseconds(200), RealClock::Get()},
      [&](absl::Duration waited) {
        waited_ms = absl::ToInt64Milliseconds(waited);
        // The first rebuild fails: it is tried again.
        return ++calls == 1 ? absl::UnavailableError("port busy") : absl::OkStatus();
      });
  const int client = ConnectLoopback(port);
  ASSERT_GE(client, 0);
  const absl::Time end = absl::Now() + absl::Seconds(20);
  while (calls < 2 && absl::Now() < end) absl::SleepFor(absl::Milliseconds(10));
  // Nothing was rebuilt for real: the connection goes on waiting, and ages
  // again from zero after the successful rebuild.
  absl::SleepFor(absl::Milliseconds(100));
  watchdog.Stop();
  EXPECT_EQ(calls, 2);
  EXPECT_GE(waited_ms, 200);
  for (int fd : {client, listener}) ::close(fd);
}

TEST(ListenerWatchdogTest, AListenerThatAcceptsIsLeftAlone) {
  int port = 0;
  const int listener = Listen(0, &port);
  ASSERT_GE(listener, 0);
  std::atomic<int> calls{0};
  ListenerWatchdog watchdog(
      {port, absl::Milliseconds(20), absl::Milliseconds(200), RealClock::Get()},
      [&](absl::Duration) {
        ++calls;
        return absl::OkStatus();
      });
  std::vector<int> fds;
  for (int i = 0; i < 5; ++i) {
    fds.push_back(ConnectLoopback(port));
    fds.push_back(::accept(listener, nullptr, nullptr));
    absl::SleepFor(absl::Milliseconds(100));
  }
  watchdog.Stop();
  EXPECT_EQ(calls, 0);
  for (int fd : fds) ::close(fd);
  ::close(listener);
}

}  // namespace
}  // namespace muster
