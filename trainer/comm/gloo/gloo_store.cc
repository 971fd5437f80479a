#include "trainer/comm/gloo/gloo_store.h"

#include <gloo/common/error.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace muster {
namespace {

[[noreturn]] void Throw(const absl::Status& s) {
  throw gloo::IoException(absl::StrCat("store: ", s.ToString()));
}

}  // namespace

void GlooStore::set(const std::string& key, const std::vector<char>& data) {
  absl::Status s = store_->Set(key, std::string(data.begin(), data.end()), deadline_);
  if (!s.ok()) Throw(s);
}

std::vector<char> GlooStore::get(const std::string& key) {
  auto values = store_->Wait({key}, deadline_);
  if (!values.ok()) Throw(values.status());
  const std::string& v = (*values)[0];
  return std::vector<char>(v.begin(), v.end());
}

void GlooStore::wait(const std::vector<std::string>& keys) {
  auto values = store_->Wait(keys, deadline_);
  if (!values.ok()) Throw(values.status());
}

void GlooStore::wait(const std::vector<std::string>& keys,
                     const std::chrono::milliseconds& timeout) {
  const absl::Time d = std::min(deadline_, clock_->Now() + absl::FromChrono(timeout));
  auto values = store_->Wait(keys, d);
  if (!values.ok()) Throw(values.status());
}

}  // namespace muster
