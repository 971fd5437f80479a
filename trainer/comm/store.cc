#include "trainer/comm/store.h"

#include <utility>

namespace muster {
namespace {

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
  bool Over() const override { return base_->Over(); }

 private:
  Store* const base_;
  const std::string prefix_;
};

}  // namespace

std::unique_ptr<Store> NewPrefixStore(Store* base, std::string prefix) {
  return std::make_unique<PrefixStore>(base, std::move(prefix));
}

}  // namespace muster
