#include "coordinator/listener_watchdog.h"

#include <algorithm>
#include <utility>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/monotonic_wait.h"
#include "coordinator/tcp_table.h"

namespace muster {

absl::Duration AcceptQueueAges::Observe(const std::vector<std::string>& waiting,
                                        absl::Time now) {
  absl::flat_hash_map<std::string, absl::Time> seen;
  absl::Duration oldest = absl::ZeroDuration();
  for (const std::string& connection : waiting) {
    const auto it = first_seen_.find(connection);
    const absl::Time since = it == first_seen_.end() ? now : it->second;
    seen.emplace(connection, since);
    oldest = std::max(oldest, now - since);
  }
  first_seen_ = std::move(seen);
  return oldest;
}

ListenerWatchdog::ListenerWatchdog(ListenerWatchdogOptions options, Rebuild rebuild)
    : options_(options), rebuild_(std::move(rebuild)) {
  thread_ = std::thread([this] { Loop(); });
}

ListenerWatchdog::~ListenerWatchdog() { Stop(); }

void ListenerWatchdog::Stop() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (thread_.joinable()) thread_.join();
}

void ListenerWatchdog::Loop() {
  absl::Duration waited = absl::ZeroDuration();
  std::string last_error;
  while (!SleepUnlessNotified(stop_, options_.interval)) {
    // REBUILDING keeps its verdict until a rebuild succeeds.
    if (waited < options_.stuck_after) waited = OldestWait();
    if (waited < options_.stuck_after) continue;
    const absl::Status rebuilt = rebuild_(waited);
    if (rebuilt.ok()) {
      waited = absl::ZeroDuration();
      ages_.Clear();
      listeners_.clear();
      last_error.clear();
    } else if (rebuilt.ToString() != last_error) {
      last_error = rebuilt.ToString();
      MUSTER_LOG(ERROR) << "the listener on port " << options_.port
                        << " could not be rebuilt (trying again every "
                        << absl::FormatDuration(options_.interval) << "): " << rebuilt;
    }
  }
}

bool ListenerWatchdog::QueuesEmpty() {
  if (listeners_.empty()) {
    absl::StatusOr<std::vector<ListeningSocket>> found = FindListeningSockets(options_.port);
    if (!found.ok()) return false;
    listeners_ = *std::move(found);
    if (listeners_.empty()) return false;
  }
  for (const ListeningSocket& listener : listeners_) {
    const std::optional<uint32_t> queued = AcceptQueueLength(listener);
    if (!queued.has_value()) {
      listeners_.clear();  // closed or replaced: found again at the next look
      return false;
    }
    if (*queued > 0) return false;
  }
  return true;
}

absl::Duration ListenerWatchdog::OldestWait() {
  if (QueuesEmpty()) {
    ages_.Clear();
    return absl::ZeroDuration();
  }
  const absl::StatusOr<std::string> tables = ReadTcpTables();
  // No descriptor to look with: no verdict until the next look.
  if (!tables.ok()) return absl::ZeroDuration();
  return ages_.Observe(UnacceptedConnections(ParseTcpTable(*tables), options_.port),
                       options_.clock->Now());
}

}  // namespace muster
