#include "trainer/ddp/world_statistics.h"

#include <utility>

#include "common/logging.h"
#include "trainer/comm/values.h"

namespace muster {

void WorldStatistics::SetWorld(Communicator* comm) {
  MutexLock lock(&mu_);
  comm_ = comm;
}

void WorldStatistics::SetPass(GradientSync* sync, absl::Duration timeout) {
  MutexLock lock(&mu_);
  pass_ = sync;
  timeout_ = timeout;
}

WorldStatistics::PassAccount WorldStatistics::EndPass() {
  MutexLock lock(&mu_);
  pass_ = nullptr;
  return std::exchange(account_, PassAccount{});
}

int WorldStatistics::world_size() const {
  MutexLock lock(&mu_);
  return comm_ == nullptr ? 1 : comm_->size();
}

void WorldStatistics::SumOverWorld(torch::Tensor& values) {
  MutexLock lock(&mu_);
  if (comm_ == nullptr || comm_->size() <= 1 || !account_.status.ok()) return;
  Communicator* const comm = comm_;
  GradientSync* const pass = pass_;
  const absl::Time deadline = clock_->Now() + timeout_;
  account_.reduced = true;
  lock.Unlock();
  const auto sum = [&values, deadline](Communicator* c) {
    return AllReduceValues(c, values.data_ptr<double>(), static_cast<size_t>(values.numel()),
                           DataType::kFloat64, ReduceOp::kSum, deadline);
  };
  absl::Status s = pass != nullptr ? pass->RunInOrder(sum) : sum(comm);
  if (s.ok()) return;
  MUSTER_LOG(WARNING) << "SyncBatchNorm's statistics could not be summed over the world (the "
                      << "rest of the pass is local, and the pass fails): " << s;
  lock.Lock();
  account_.status = std::move(s);
}

}  // namespace muster
