#include "coordinator/checkpoint_catalog.h"

#include <gtest/gtest.h>

namespace muster {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(5000);
const std::vector<std::string> kWorld = {"m0", "m1"};

ShardReport Report(const std::string& member, const std::string& path,
                   const std::string& metric = "", double value = 0) {
  ShardReport r;
  r.member = member;
  r.files = {{"", path, 100, "00000000000000ff"}};
  r.metric_name = metric;
  r.metric_value = value;
  return r;
}

class CatalogTest : public ::testing::Test {
 protected:
  void SetUp() override { store_ = std::move(OpenSqliteStateStore(":memory:")).value(); }
  std::unique_ptr<StateStore> store_;
};

TEST_F(CatalogTest, CommitsWhenEveryMemberReported) {
  CheckpointCatalog cat(store_.get(), {}, {});
  auto id = cat.Begin(1, 100, kWorld, kT0);
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(*cat.Begin(1, 100, kWorld, kT0), *id);  // the other rank gets the same id
  EXPECT_FALSE(*cat.Report(*id, Report("m0", "/c/0"), kT0));
  EXPECT_FALSE(*cat.Report(*id, Report("m0", "/c/0b"), kT0));  // replaces m0's files
  EXPECT_EQ(cat.LatestCommitted(), nullptr);
  EXPECT_TRUE(cat.List(false).empty());
  EXPECT_TRUE(*cat.Report(*id, Report("m1", "/c/1"), kT0));
  ASSERT_NE(cat.LatestCommitted(), nullptr);
  EXPECT_EQ(cat.LatestCommitted()->step, 100);
  EXPECT_EQ(cat.LatestCommitted()->files.size(), 2u);
  EXPECT_EQ(cat.LatestCommitted()->total_bytes(), 200u);
  EXPECT_EQ(cat.Begin(2, 100, kWorld, kT0).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(cat.Report(*id, Report("m1", "/c/1"), kT0).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(CatalogTest, RejectsBadReports) {
  CheckpointCatalog cat(store_.get(), {}, {});
  uint64_t id = *cat.Begin(1, 10, kWorld, kT0);
  EXPECT_EQ(cat.Report(99, Report("m0", "/x"), kT0).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(cat.Report(id, Report("stranger", "/x"), kT0).status().code(),
            absl::StatusCode::kPermissionDenied);
  ShardReport bad = Report("m0", "/x");
  bad.files[0].checksum = "XYZ";
  auto s = cat.Report(id, bad, kT0).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("checksum"), std::string::npos);
  bad = Report("m0", "");
  EXPECT_EQ(cat.Report(id, bad, kT0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cat.Begin(1, -1, kWorld, kT0).status().code(), absl::StatusCode::kInvalidArgument);
  // Nothing was recorded by the rejected calls.
  EXPECT_TRUE(cat.List(true)[0].reported.empty());
}

TEST_F(CatalogTest, AbortedCheckpointNeverCommits) {
  CheckpointCatalog cat(store_.get(), {}, {});
  uint64_t a = *cat.Begin(1, 10, kWorld, kT0);
  uint64_t b = *cat.Begin(2, 20, kWorld, kT0);
  ASSERT_TRUE(cat.Report(a, Report("m0", "/a0"), kT0).ok());
  ASSERT_TRUE(cat.AbortBefore(2, "member failed").ok());
  EXPECT_EQ(cat.Report(a, Report("m1", "/a1"), kT0).status().code(), absl::StatusCode::kAborted);
  ASSERT_TRUE(cat.Abort(b, "disk full").ok());
  EXPECT_EQ(cat.Report(b, Report("m0", "/b0"), kT0).status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(cat.LatestCommitted(), nullptr);
  EXPECT_EQ(cat.List(true).size(), 2u);
}

TEST_F(CatalogTest, RetentionKeepsLastKAndBest) {
  CatalogOptions options;
  options.keep_last = 2;
  options.keep_best_metric = "val_loss";
  CheckpointCatalog cat(store_.get(), options, {});
  const double losses[] = {0.9, 0.1, 0.5, 0.7, 0.6};
  for (int i = 0; i < 5; ++i) {
    uint64_t id = *cat.Begin(1, (i + 1) * 100, kWorld, kT0);
    ASSERT_TRUE(cat.Report(id, Report("m0", "/a", "val_loss", losses[i]), kT0).ok());
    ASSERT_TRUE(cat.Report(id, Report("m1", "/b", "val_loss", losses[i]), kT0).ok());
  }
  std::vector<int64_t> kept;
  for (const auto& r : cat.List(false)) kept.push_back(r.step);
  EXPECT_EQ(kept, (std::vector<int64_t>{500, 400, 200}));
  int retired = 0;
  for (const auto& r : cat.List(true)) retired += r.state == CheckpointState::kRetired;
  EXPECT_EQ(retired, 2);
}

TEST_F(CatalogTest, ReloadKeepsEverything) {
  {
    CheckpointCatalog cat(store_.get(), {}, {});
    uint64_t id = *cat.Begin(3, 30, kWorld, kT0);
    ASSERT_TRUE(cat.Report(id, Report("m0", "/a"), kT0).ok());
    ASSERT_TRUE(cat.Report(id, Report("m1", "/b"), kT0).ok());
    ASSERT_TRUE(cat.Begin(3, 40, kWorld, kT0).ok());
  }
  CheckpointCatalog cat(store_.get(), {}, {});
  ASSERT_TRUE(cat.Load().ok());
  ASSERT_NE(cat.LatestCommitted(), nullptr);
  EXPECT_EQ(cat.LatestCommitted()->step, 30);
  EXPECT_EQ(cat.List(true).size(), 2u);
  // Ids continue after the stored ones; the pending one is still open.
  uint64_t pending = cat.List(true)[0].id;
  EXPECT_EQ(*cat.Begin(3, 40, kWorld, kT0), pending);
  EXPECT_GT(*cat.Begin(3, 50, kWorld, kT0), pending);
}

}  // namespace
}  // namespace muster
