#include "trainer/comm/gloo/reachability.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/clock.h"

namespace muster {
namespace {

// A numeric address and port as a sockaddr. False when `ip` is not one.
bool ToSockaddr(const std::string& ip, int port, sockaddr_storage* out, socklen_t* len) {
  addrinfo hints{};
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(ip.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return false;
  std::memcpy(out, found->ai_addr, found->ai_addrlen);
  *len = found->ai_addrlen;
  ::freeaddrinfo(found);
  return true;
}

int PortOf(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return -1;
  if (addr.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
}

// Whether a finished connect says the peer's host answered: a connection,
// or a refusal or reset (the network works; whether anyone listens there
// is the heartbeats' business).
bool Answered(int error) { return error == 0 || error == ECONNREFUSED || error == ECONNRESET; }

}  // namespace

absl::StatusOr<std::unique_ptr<ReachabilityProbe>> ReachabilityProbe::Start(
    Store* store, const std::string& ip, int rank, int size, int world_rank,
    absl::Time deadline, Clock* clock) {
  sockaddr_storage addr{};
  socklen_t len = 0;
  if (!ToSockaddr(ip, 0, &addr, &len)) {
    return absl::InvalidArgumentError(absl::StrCat("reachability probe: '", ip,
                                                   "' is not a numeric address"));
  }
  const int fd = ::socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      ::listen(fd, SOMAXCONN) != 0) {
    const std::string why = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    return absl::UnavailableError(absl::StrCat("reachability probe: cannot listen on ", ip,
                                               ": ", why));
  }
  int stop[2];
  if (::pipe2(stop, O_CLOEXEC) != 0) {
    ::close(fd);
    return absl::UnavailableError(absl::StrCat("reachability probe: pipe: ", std::strerror(errno)));
  }
  std::unique_ptr<ReachabilityProbe> probe(
      new ReachabilityProbe(fd, stop[0], stop[1], rank, clock));
  // "world_rank port ip": an IPv6 address holds colons.
  absl::Status set = store->Set(absl::StrCat("probe/", rank),
                                absl::StrCat(world_rank, " ", PortOf(fd), " ", ip), deadline);
  if (!set.ok()) return set;
  std::vector<std::string> keys;
  keys.reserve(size);
  for (int r = 0; r < size; ++r) keys.push_back(absl::StrCat("probe/", r));
  absl::StatusOr<std::vector<std::string>> values = store->Wait(keys, deadline);
  if (!values.ok()) return values.status();
  probe->peers_.resize(size);
  for (int r = 0; r < size; ++r) {
    std::vector<std::string> f = absl::StrSplit((*values)[r], ' ');
    Peer& p = probe->peers_[r];
    if (f.size() != 3 || !absl::SimpleAtoi(f[0], &p.world_rank) ||
        !absl::SimpleAtoi(f[1], &p.port)) {
      return absl::InternalError(absl::StrCat("reachability probe: rank ", r,
                                              " published '", (*values)[r], "'"));
    }
    p.ip = f[2];
  }
  return probe;
}

ReachabilityProbe::ReachabilityProbe(int listen_fd, int stop_fd_read, int stop_fd_write,
                                     int rank, Clock* clock)
    : listen_fd_(listen_fd),
      stop_read_(stop_fd_read),
      stop_write_(stop_fd_write),
      rank_(rank),
      clock_(clock) {
  acceptor_ = std::thread([this] { Accept(); });
}

ReachabilityProbe::~ReachabilityProbe() {
  const char byte = 0;
  while (::write(stop_write_, &byte, 1) < 0 && errno == EINTR) {
  }
  acceptor_.join();
  ::close(listen_fd_);
  ::close(stop_read_);
  ::close(stop_write_);
}

void ReachabilityProbe::Accept() {
  pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {stop_read_, POLLIN, 0}};
  for (;;) {
    if (::poll(fds, 2, -1) < 0 && errno != EINTR) return;
    if (fds[1].revents != 0) return;
    if (fds[0].revents & POLLIN) {
      const int c = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c >= 0) ::close(c);
    }
  }
}

std::vector<int> ReachabilityProbe::Unreachable(absl::Duration timeout) const {
  constexpr int kAttempts = 2;
  struct Attempt {
    int peer;
    int fd;
  };
  std::vector<Attempt> attempts;
  std::vector<bool> answered(peers_.size(), false);
  for (size_t i = 0; i < peers_.size(); ++i) {
    if (static_cast<int>(i) == rank_) {
      answered[i] = true;
      continue;
    }
    sockaddr_storage addr{};
    socklen_t len = 0;
    if (!ToSockaddr(peers_[i].ip, peers_[i].port, &addr, &len)) continue;
    for (int a = 0; a < kAttempts; ++a) {
      const int fd = ::socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (fd < 0) continue;
      if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), len) == 0 || Answered(errno)) {
        answered[i] = true;
        ::close(fd);
      } else if (errno == EINPROGRESS) {
        attempts.push_back({static_cast<int>(i), fd});
      } else {
        ::close(fd);
      }
    }
  }
  const absl::Time end = clock_->Now() + timeout;
  while (!attempts.empty()) {
    const absl::Duration left = end - clock_->Now();
    if (left <= absl::ZeroDuration()) break;
    std::vector<pollfd> fds;
    fds.reserve(attempts.size());
    for (const Attempt& a : attempts) fds.push_back({a.fd, POLLOUT, 0});
    const int n = ::poll(fds.data(), fds.size(),
                         static_cast<int>(std::max<int64_t>(1, absl::ToInt64Milliseconds(left))));
    if (n < 0 && errno != EINTR) break;
    std::vector<Attempt> pending;
    for (size_t k = 0; k < attempts.size(); ++k) {
      if (fds[k].revents == 0) {
        pending.push_back(attempts[k]);
        continue;
      }
      int error = 0;
      socklen_t elen = sizeof(error);
      ::getsockopt(attempts[k].fd, SOL_SOCKET, SO_ERROR, &error, &elen);
      if (Answered(error)) answered[attempts[k].peer] = true;
      ::close(attempts[k].fd);
    }
    // A peer one attempt reached needs no more waiting for.
    attempts.clear();
    for (const Attempt& a : pending) {
      if (answered[a.peer]) {
        ::close(a.fd);
      } else {
        attempts.push_back(a);
      }
    }
  }
  for (const Attempt& a : attempts) ::close(a.fd);
  std::vector<int> out;
  for (size_t i = 0; i < peers_.size(); ++i) {
    if (!answered[i]) out.push_back(peers_[i].world_rank);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string ReachabilityProbe::Describe(int world_rank) const {
  for (const Peer& p : peers_) {
    if (p.world_rank != world_rank) continue;
    const bool v6 = p.ip.find(':') != std::string::npos;
    return absl::StrCat(v6 ? "[" : "", p.ip, v6 ? "]" : "", ":", p.port, " (world rank ",
                        world_rank, ")");
  }
  return absl::StrCat("world rank ", world_rank);
}

}  // namespace muster
