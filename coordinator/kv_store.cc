#include "coordinator/kv_store.h"

#include <algorithm>
#include <iterator>
#include <limits>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace muster {

void KvStore::Reset(const std::string& reason, Actions* actions) {
  Reset(absl::AbortedError(reason), actions);
}

void KvStore::Reset(const absl::Status& status, Actions* actions) {
  values_.clear();
  bytes_ = 0;
  for (Waiter& w : waiters_) {
    actions->Add([done = std::move(w.done), status] { done(status); });
  }
  waiters_.clear();
  waiting_on_.clear();
}

absl::Status KvStore::CheckKey(const std::string& key) const {
  return CheckName("key", key, limits_.max_key_bytes);
}

absl::Status KvStore::Store(const std::string& key, std::string value, Actions* actions) {
  if (value.size() > limits_.max_value_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "value of key ", key, " is ", value.size(), " bytes; the limit is ",
        limits_.max_value_bytes));
  }
  auto it = values_.find(key);
  const size_t old_bytes = it == values_.end() ? 0 : key.size() + it->second.size();
  const size_t new_bytes = key.size() + value.size();
  if (it == values_.end() && values_.size() >= limits_.max_keys_per_generation) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "this generation holds ", values_.size(), " keys; the limit is ",
        limits_.max_keys_per_generation));
  }
  if (bytes_ - old_bytes + new_bytes > limits_.max_kv_bytes_per_generation) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "this generation's keys and values would take ", bytes_ - old_bytes + new_bytes,
        " bytes; the limit is ", limits_.max_kv_bytes_per_generation));
  }
  bytes_ = bytes_ - old_bytes + new_bytes;
  values_[key] = std::move(value);
  Notify(key, actions);
  return absl::OkStatus();
}

absl::Status KvStore::Set(const std::string& key, std::string value, Actions* actions) {
  MUSTER_RETURN_IF_ERROR(CheckKey(key));
  return Store(key, std::move(value), actions);
}

absl::StatusOr<std::vector<std::string>> KvStore::Get(
    const std::vector<std::string>& keys) const {
  if (keys.empty()) return absl::InvalidArgumentError("keys is empty");
  if (keys.size() > limits_.max_keys_per_get) {
    return absl::InvalidArgumentError(absl::StrCat(
        "asked for ", keys.size(), " keys; the limit is ", limits_.max_keys_per_get));
  }
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const std::string& key : keys) {
    MUSTER_RETURN_IF_ERROR(CheckKey(key));
    auto it = values_.find(key);
    if (it == values_.end()) return absl::NotFoundError(absl::StrCat("no key ", key));
    out.push_back(it->second);
  }
  return out;
}

void KvStore::Wait(std::vector<std::string> keys, absl::Time deadline, GetCallback done,
                   Actions* actions) {
  absl::StatusOr<std::vector<std::string>> now = Get(keys);
  if (now.ok() || !absl::IsNotFound(now.status())) {
    actions->Add([done = std::move(done), now = std::move(now)] { done(now); });
    return;
  }
  waiters_.push_back(Waiter{std::move(keys), deadline, std::move(done), ""});
  File(std::prev(waiters_.end()));
}

bool KvStore::File(WaiterList::iterator w) {
  for (const std::string& key : w->keys) {
    if (values_.count(key) == 0) {
      w->missing = key;
      waiting_on_[key].push_back(w);
      return true;
    }
  }
  return false;
}

void KvStore::Unfile(WaiterList::iterator w) {
  auto bucket = waiting_on_.find(w->missing);
  if (bucket == waiting_on_.end()) return;
  std::vector<WaiterList::iterator>& ws = bucket->second;
  ws.erase(std::remove(ws.begin(), ws.end(), w), ws.end());
  if (ws.empty()) waiting_on_.erase(bucket);
}

absl::StatusOr<int64_t> KvStore::Add(const std::string& key, int64_t delta,
                                     Actions* actions) {
  MUSTER_RETURN_IF_ERROR(CheckKey(key));
  int64_t value = 0;
  auto it = values_.find(key);
  if (it != values_.end() && !absl::SimpleAtoi(it->second, &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("key ", key, " does not hold a decimal integer"));
  }
  if ((delta > 0 && value > std::numeric_limits<int64_t>::max() - delta) ||
      (delta < 0 && value < std::numeric_limits<int64_t>::min() - delta)) {
    return absl::InvalidArgumentError(absl::StrCat("adding ", delta, " to key ", key,
                                                   " overflows int64"));
  }
  value += delta;
  MUSTER_RETURN_IF_ERROR(Store(key, absl::StrCat(value), actions));
  return value;
}

absl::StatusOr<CasResult> KvStore::CompareAndSet(const std::string& key,
                                                 const std::optional<std::string>& expected,
                                                 std::string desired, Actions* actions) {
  MUSTER_RETURN_IF_ERROR(CheckKey(key));
  auto it = values_.find(key);
  std::optional<std::string> current;
  if (it != values_.end()) current = it->second;
  CasResult result;
  if (current != expected) {
    result.current = std::move(current);
    return result;
  }
  result.current = desired;
  MUSTER_RETURN_IF_ERROR(Store(key, std::move(desired), actions));
  result.swapped = true;
  return result;
}

void KvStore::Notify(const std::string& key, Actions* actions) {
  auto bucket = waiting_on_.find(key);
  if (bucket == waiting_on_.end()) return;
  std::vector<WaiterList::iterator> ws = std::move(bucket->second);
  waiting_on_.erase(bucket);
  for (WaiterList::iterator w : ws) {
    if (File(w)) continue;  // still misses another key
    absl::StatusOr<std::vector<std::string>> values = Get(w->keys);
    actions->Add([done = std::move(w->done), values = std::move(values)] { done(values); });
    waiters_.erase(w);
  }
}

void KvStore::Expire(absl::Time now, Actions* actions) {
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (it->deadline <= now) {
      std::string missing;
      for (const std::string& key : it->keys) {
        if (values_.count(key) == 0) {
          missing = key;
          break;
        }
      }
      actions->Add([done = std::move(it->done), missing] {
        done(absl::DeadlineExceededError(absl::StrCat("timed out waiting for key ", missing)));
      });
      Unfile(it);
      it = waiters_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace muster
