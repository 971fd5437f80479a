#include "coordinator/persister.h"

#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/backoff.h"
#include "common/logging.h"
#include "common/monotonic_wait.h"

namespace muster {

absl::Status SerializedStateStore::SaveWorld(const World& world) {
  absl::MutexLock lock(&mu_);
  return store_->SaveWorld(world);
}
absl::StatusOr<World> SerializedStateStore::LoadWorld() {
  absl::MutexLock lock(&mu_);
  return store_->LoadWorld();
}
absl::Status SerializedStateStore::SaveCheckpoint(const CheckpointRecord& record) {
  absl::MutexLock lock(&mu_);
  return store_->SaveCheckpoint(record);
}
absl::StatusOr<std::vector<CheckpointRecord>> SerializedStateStore::LoadCheckpoints() {
  absl::MutexLock lock(&mu_);
  return store_->LoadCheckpoints();
}
void SerializedStateStore::CompactJournal() {
  absl::MutexLock lock(&mu_);
  store_->CompactJournal();
}
absl::Status SerializedStateStore::AppendEvents(const std::vector<JobEvent>& events) {
  absl::MutexLock lock(&mu_);
  return store_->AppendEvents(events);
}
absl::StatusOr<std::vector<JobEvent>> SerializedStateStore::LoadEvents(size_t limit) {
  absl::MutexLock lock(&mu_);
  return store_->LoadEvents(limit);
}

absl::StatusOr<Lease> SerializedStateStore::ReadLease() {
  absl::MutexLock lock(&mu_);
  return store_->ReadLease();
}

absl::StatusOr<Lease> SerializedStateStore::TakeLease(const Lease& seen,
                                                      const std::string& holder) {
  absl::MutexLock lock(&mu_);
  return store_->TakeLease(seen, holder);
}

absl::Status SerializedStateStore::RenewLease(uint64_t epoch) {
  absl::MutexLock lock(&mu_);
  return store_->RenewLease(epoch);
}

absl::Status SerializedStateStore::ReleaseLease(uint64_t epoch) {
  absl::MutexLock lock(&mu_);
  return store_->ReleaseLease(epoch);
}

Persister::Persister(StateStore* store, Clock* clock)
    : store_(store), clock_(clock), thread_([this] { Loop(); }) {}

Persister::~Persister() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void Persister::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

uint64_t Persister::SaveWorld(std::shared_ptr<const World> world) {
  absl::MutexLock lock(&mu_);
  if (closed_) return 0;
  world_ = std::move(world);
  return ++queued_;
}

uint64_t Persister::SaveCheckpoint(CheckpointRecord record) {
  absl::MutexLock lock(&mu_);
  if (closed_) return 0;
  const uint64_t id = record.id;
  records_[id] = std::move(record);
  return ++queued_;
}

void Persister::AppendEvents(std::vector<JobEvent> events) {
  if (events.empty()) return;
  absl::MutexLock lock(&mu_);
  if (closed_) return;
  for (JobEvent& e : events) events_.push_back(std::move(e));
  ++events_queued_;
}

uint64_t Persister::last_ticket() {
  absl::MutexLock lock(&mu_);
  return queued_;
}

absl::Status Persister::Wait(uint64_t ticket) {
  absl::MutexLock lock(&mu_);
  auto done = [this, ticket]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return durable_ >= ticket || !error_.ok();
  };
  mu_.Await(absl::Condition(&done));
  return durable_ >= ticket ? absl::OkStatus() : error_;
}

absl::Status Persister::Flush(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  const uint64_t worlds = queued_, events = events_queued_;
  auto done = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return (durable_ >= worlds && events_written_ >= events && !writing_) || !error_.ok();
  };
  if (!AwaitFor(&mu_, absl::Condition(&done), timeout, clock_)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "not written within ", absl::FormatDuration(timeout), ": ",
        durable_ >= worlds ? "" : "the world or checkpoint records, ",
        events_written_ >= events ? "nothing more" : "the event log",
        event_error_.ok() ? "" : absl::StrCat(" (", event_error_.message(), ")")));
  }
  return error_;
}

uint64_t Persister::groups_written() {
  absl::MutexLock lock(&mu_);
  return groups_;
}

void Persister::Loop() {
  Backoff backoff({absl::Milliseconds(100), absl::Seconds(5), 2.0});
  for (;;) {
    std::shared_ptr<const World> world;
    std::map<uint64_t, CheckpointRecord> records;
    std::vector<JobEvent> events;
    uint64_t ticket = 0, batches = 0;
    {
      absl::MutexLock lock(&mu_);
      auto work = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return stop_ || ((world_ != nullptr || !records_.empty()) && error_.ok()) ||
               !events_.empty();
      };
      mu_.Await(absl::Condition(&work));
      if (world_ == nullptr && records_.empty() && events_.empty()) return;  // stopping
      if (error_.ok()) {
        world.swap(world_);
        records.swap(records_);
      }
      world_.reset();
      records_.clear();
      events.swap(events_);
      ticket = queued_;
      batches = events_queued_;
      writing_ = true;
    }
    // The group, outside the lock: the last world and the records, made
    // known as durable at once (callers waiting for them go on), then the
    // events, which nobody waits for.
    absl::Status world_saved = world ? store_->SaveWorld(*world) : absl::OkStatus();
    world.reset();  // the coordinator may change it in place again
    for (auto it = records.begin(); world_saved.ok() && it != records.end(); ++it) {
      world_saved = store_->SaveCheckpoint(it->second);
    }
    if (world_saved.ok()) {
      absl::MutexLock lock(&mu_);
      durable_ = std::max(durable_, ticket);
    }
    absl::Status events_saved = events.empty() ? absl::OkStatus() : store_->AppendEvents(events);
    if (absl::IsAborted(events_saved)) {
      MUSTER_LOG(WARNING) << "event log write refused, dropped: " << events_saved;
    } else if (!events_saved.ok()) {
      MUSTER_LOG(WARNING) << "event log write failed (will retry): " << events_saved;
    }
    store_->CompactJournal();
    absl::MutexLock lock(&mu_);
    writing_ = false;
    ++groups_;
    if (!world_saved.ok() && error_.ok()) {
      MUSTER_LOG(ERROR) << "cannot persist the coordinator's state: " << world_saved;
      error_ = world_saved;
    }
    if (events_saved.ok() || absl::IsAborted(events_saved)) {
      // ABORTED: fenced by a coordinator that took the lease over; these
      // events are this one's and can never be written.
      events_written_ = batches;
      event_error_ = absl::OkStatus();
      backoff.Reset();
    } else {
      // Put them back ahead of newer ones, for the next group, after a
      // pause that grows while the log keeps failing (a full disk is not
      // retried in a tight loop); a world or record to write ends the
      // pause, since callers wait for those.
      events.insert(events.end(), std::make_move_iterator(events_.begin()),
                    std::make_move_iterator(events_.end()));
      events_.swap(events);
      event_error_ = events_saved;
      if (stop_) return;  // no endless retry on the way out
      auto more = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return stop_ || world_ != nullptr || !records_.empty();
      };
      AwaitFor(&mu_, absl::Condition(&more), backoff.Next(), clock_);
      if (stop_) return;
    }
  }
}

}  // namespace muster
