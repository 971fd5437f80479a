#include "coordinator/rendezvous_waiters.h"

#include <algorithm>
#include <utility>

namespace muster {

void RendezvousWaiters::Add(RendezvousWaiter waiter) {
  earliest_deadline_ = std::min(earliest_deadline_, waiter.deadline);
  waiters_.push_back(std::move(waiter));
}

namespace {

// The waiter's rank in `world` when `world` answers it; -1 when not. A rank
// the waiter holds is tried first.
int AnsweringRank(const World& world, const RendezvousWaiter& waiter) {
  const int rank = waiter.rank >= 0
                       ? world.RankOf(waiter.member.id, static_cast<uint32_t>(waiter.rank))
                       : world.RankOf(waiter.member.id);
  const bool answers = rank >= 0 && waiter.after_generation < world.generation &&
                       world.members[rank].member.incarnation == waiter.member.incarnation;
  return answers ? rank : -1;
}

}  // namespace

bool RendezvousWaiters::Answers(const World& world, const RendezvousWaiter& waiter) {
  return AnsweringRank(world, waiter) >= 0;
}

std::vector<std::pair<const RendezvousWaiter*, uint32_t>> RendezvousWaiters::AnsweredBy(
    const World& world) const {
  std::vector<std::pair<const RendezvousWaiter*, uint32_t>> out;
  for (auto it = waiters_.rbegin(); it != waiters_.rend(); ++it) {
    if (const int rank = AnsweringRank(world, *it); rank >= 0) {
      out.emplace_back(&*it, static_cast<uint32_t>(rank));
    }
  }
  return out;
}

std::vector<RendezvousWaiter> RendezvousWaiters::TakeAnsweredBy(const World& world) {
  std::vector<RendezvousWaiter> out;
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (const int rank = AnsweringRank(world, *it); rank >= 0) {
      it->rank = rank;
      out.push_back(std::move(*it));
      it = waiters_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

std::vector<RendezvousWaiter> RendezvousWaiters::TakeExpired(absl::Time now) {
  std::vector<RendezvousWaiter> out;
  if (now < earliest_deadline_) return out;
  earliest_deadline_ = absl::InfiniteFuture();
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (it->deadline <= now) {
      out.push_back(std::move(*it));
      it = waiters_.erase(it);
    } else {
      earliest_deadline_ = std::min(earliest_deadline_, it->deadline);
      ++it;
    }
  }
  return out;
}

std::vector<RendezvousWaiter> RendezvousWaiters::TakeMember(const std::string& id) {
  std::vector<RendezvousWaiter> out;
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (it->member.id == id) {
      out.push_back(std::move(*it));
      it = waiters_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

std::vector<RendezvousWaiter> RendezvousWaiters::TakeAll() {
  std::vector<RendezvousWaiter> out;
  out.reserve(waiters_.size());
  for (RendezvousWaiter& w : waiters_) out.push_back(std::move(w));
  waiters_.clear();
  earliest_deadline_ = absl::InfiniteFuture();
  return out;
}

absl::flat_hash_set<absl::string_view> RendezvousWaiters::MemberIds() const {
  absl::flat_hash_set<absl::string_view> ids;
  ids.reserve(waiters_.size());
  for (const RendezvousWaiter& w : waiters_) ids.insert(w.member.id);
  return ids;
}

}  // namespace muster
