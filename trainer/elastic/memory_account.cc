#include "trainer/elastic/memory_account.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace muster {

void StorageCounter::Add(const torch::Tensor& t, int64_t* into) {
  if (!t.defined() || !t.has_storage()) return;
  const c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  if (!seen_.insert(storage).second) return;
  *into += static_cast<int64_t>(storage->nbytes());
}

std::string DescribeMemory(const MemoryAccount& a) {
  const auto mb = [](int64_t bytes) { return absl::StrFormat("%.1f MB", bytes / 1e6); };
  return absl::StrCat("parameters ", mb(a.parameters), ", gradients ", mb(a.gradients),
                      ", optimizer state ", mb(a.optimizer_state), ", communication ",
                      mb(a.communication), ", staging ", mb(a.staging), ", transfer ",
                      mb(a.transfer), ", total ", mb(a.total()));
}

}  // namespace muster
