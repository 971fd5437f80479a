#include "trainer/comm/store.h"

#include <utility>

#include "trainer/client/coordinator_client.h"

namespace muster {
namespace {

class CoordinatorStore : public Store {
 public:
  CoordinatorStore(CoordinatorClient* client, uint64_t generation)
      : client_(client), generation_(generation) {}

  absl::Status Set(const std::string& key, const std::string& value,
                   absl::Time deadline) override {
    return client_->KvSet(generation_, key, value, deadline);
  }
  absl::StatusOr<std::vector<std::string>> Wait(const std::vector<std::string>& keys,
                                                absl::Time deadline) override {
    return client_->KvWait(generation_, keys, deadline);
  }

 private:
  CoordinatorClient* const client_;
  const uint64_t generation_;
};

class PrefixStore : public Store {
 public:
  PrefixStore(Store* base, std::string prefix) : base_(base), prefix_(std::move(prefix)) {}

  absl::Status Set(const std::string& key, const std::string& value,
                   absl::Time deadline) override {
    return base_->Set(prefix_ + "/" + key, value, deadline);
  }
  absl::StatusOr<std::vector<std::string>> Wait(const std::vector<std::string>& keys,
                                                absl::Time deadline) override {
    std::vector<std::string> full;
    for (const std::string& k : keys) full.push_back(prefix_ + "/" + k);
    return base_->Wait(full, deadline);
  }

 private:
  Store* const base_;
  const std::string prefix_;
};

}  // namespace

std::unique_ptr<Store> NewCoordinatorStore(CoordinatorClient* client, uint64_t generation) {
  return std::make_unique<CoordinatorStore>(client, generation);
}

std::unique_ptr<Store> NewPrefixStore(Store* base, std::string prefix) {
  return std::make_unique<PrefixStore>(base, std::move(prefix));
}

}  // namespace muster
