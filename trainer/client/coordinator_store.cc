#include "trainer/client/coordinator_store.h"

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
  bool Over() const override { return client_->latest_generation() > generation_; }

 private:
  CoordinatorClient* const client_;
  const uint64_t generation_;
};

}  // namespace

std::unique_ptr<Store> NewCoordinatorStore(CoordinatorClient* client, uint64_t generation) {
  return std::make_unique<CoordinatorStore>(client, generation);
}

}  // namespace muster
