#include "coordinator/kv_store.h"

#include <gtest/gtest.h>

namespace muster {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1000);

TEST(KvStoreTest, SetGetAndMissing) {
  KvStore kv{Limits{}};
  Actions actions;
  ASSERT_TRUE(kv.Set("a", "1", &actions).ok());
  ASSERT_TRUE(kv.Set("b", "2", &actions).ok());
  EXPECT_EQ(*kv.Get({"b", "a"}), (std::vector<std::string>{"2", "1"}));
  auto missing = kv.Get({"a", "zz"});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("zz"), std::string::npos);
  EXPECT_EQ(kv.Get({}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(KvStoreTest, WaitCompletesOnSetOrDeadlineOrReset) {
  KvStore kv{Limits{}};
  std::vector<absl::StatusOr<std::vector<std::string>>> results;
  auto record = [&](absl::StatusOr<std::vector<std::string>> r) { results.push_back(r); };
  {
    Actions actions;
    kv.Wait({"x", "y"}, kT0 + absl::Seconds(5), record, &actions);
    kv.Wait({"never"}, kT0 + absl::Seconds(1), record, &actions);
    kv.Wait({"later"}, kT0 + absl::Seconds(10), record, &actions);
  }
  EXPECT_TRUE(results.empty());
  {
    Actions actions;
    ASSERT_TRUE(kv.Set("x", "X", &actions).ok());
    ASSERT_TRUE(kv.Set("y", "Y", &actions).ok());
  }
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(*results[0], (std::vector<std::string>{"X", "Y"}));
  {
    Actions actions;
    kv.Expire(kT0 + absl::Seconds(1), &actions);
  }
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[1].status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(results[1].status().message().find("never"), std::string::npos);
  {
    Actions actions;
    kv.Reset("generation over", &actions);
  }
  ASSERT_EQ(results.size(), 3u);
  EXPECT_EQ(results[2].status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(kv.key_count(), 0u);
  EXPECT_EQ(kv.waiter_count(), 0u);
}

// A full mesh's bootstrap: every rank waits for every other rank's key. A
// Set completes exactly the waiters that now hold all their keys (waiters
// are filed under the key they miss, so a Set looks only at its own key's),
// whatever order the keys arrive in, and an expired waiter is gone for good.
TEST(KvStoreTest, ManyWaitersCompleteExactlyWhenTheirLastKeyArrives) {
  constexpr int kRanks = 50;
  KvStore kv{Limits{}};
  std::vector<int> completed(kRanks, 0);
  int expired = 0;
  {
    Actions actions;
    for (int r = 0; r < kRanks; ++r) {
      std::vector<std::string> keys;
      for (int p = kRanks - 1; p >= 0; --p) {
        if (p != r) keys.push_back("rank/" + std::to_string(p));
      }
      kv.Wait(keys, kT0 + absl::Seconds(10),
              [&, r](absl::StatusOr<std::vector<std::string>> v) {
                ASSERT_TRUE(v.ok()) << v.status();
                ASSERT_EQ(v->size(), static_cast<size_t>(kRanks - 1));
                ++completed[r];
              },
              &actions);
    }
    kv.Wait({"rank/0", "never"}, kT0 + absl::Seconds(1),
            [&](absl::StatusOr<std::vector<std::string>> v) {
              EXPECT_EQ(v.status().code(), absl::StatusCode::kDeadlineExceeded);
              ++expired;
            },
            &actions);
  }
  EXPECT_EQ(kv.waiter_count(), static_cast<size_t>(kRanks + 1));
  for (int r = 0; r < kRanks; ++r) {
    Actions actions;
    ASSERT_TRUE(kv.Set("rank/" + std::to_string(r), std::to_string(r), &actions).ok());
    actions.Run();
    // A rank's wait completes once every other rank's key is set: the last
    // rank's at the second-to-last Set, everyone else's at the last.
    for (int q = 0; q < kRanks; ++q) {
      const bool want = r == kRanks - 1 || (r == kRanks - 2 && q == kRanks - 1);
      EXPECT_EQ(completed[q], want ? 1 : 0) << "after rank " << r << ", waiter " << q;
    }
  }
  {
    Actions actions;
    kv.Expire(kT0 + absl::Seconds(2), &actions);
  }
  EXPECT_EQ(expired, 1);
  {
    Actions actions;
    ASSERT_TRUE(kv.Set("never", "late", &actions).ok());
  }
  EXPECT_EQ(expired, 1);
  EXPECT_EQ(kv.waiter_count(), 0u);
}

TEST(KvStoreTest, AddAndCompareAndSet) {
  KvStore kv{Limits{}};
  Actions actions;
  EXPECT_EQ(*kv.Add("n", 5, &actions), 5);
  EXPECT_EQ(*kv.Add("n", -7, &actions), -2);
  ASSERT_TRUE(kv.Set("s", "text", &actions).ok());
  EXPECT_EQ(kv.Add("s", 1, &actions).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(kv.Set("big", "9223372036854775807", &actions).ok());
  EXPECT_EQ(kv.Add("big", 1, &actions).status().code(), absl::StatusCode::kInvalidArgument);

  auto r = kv.CompareAndSet("c", std::nullopt, "v1", &actions);
  EXPECT_TRUE(r->swapped);
  r = kv.CompareAndSet("c", std::nullopt, "v2", &actions);
  EXPECT_FALSE(r->swapped);
  EXPECT_EQ(*r->current, "v1");
  r = kv.CompareAndSet("c", std::string("v1"), "v3", &actions);
  EXPECT_TRUE(r->swapped);
  EXPECT_EQ(*kv.Get({"c"}), std::vector<std::string>{"v3"});
}

TEST(KvStoreTest, LimitsNameWhatWasWrong) {
  Limits limits;
  limits.max_value_bytes = 8;
  limits.max_keys_per_generation = 2;
  KvStore kv{limits};
  Actions actions;
  auto s = kv.Set("k", std::string(9, 'v'), &actions);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("limit is 8"), std::string::npos);
  EXPECT_EQ(kv.Set(std::string(513, 'k'), "v", &actions).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kv.Set("", "v", &actions).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(kv.Set("a", "v", &actions).ok());
  ASSERT_TRUE(kv.Set("b", "v", &actions).ok());
  EXPECT_TRUE(kv.Set("a", "w", &actions).ok());  // overwrite: no new key
  EXPECT_EQ(kv.Set("c", "v", &actions).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(kv.key_count(), 2u);
}

}  // namespace
}  // namespace muster
