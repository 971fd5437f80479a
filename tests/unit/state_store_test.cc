#include "coordinator/state_store.h"

#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace muster {
namespace {

std::string TempDb(const std::string& name) {
  std::string path = ::testing::TempDir() + "/" + name + std::to_string(::getpid()) + ".db";
  ::unlink(path.c_str());
  return path;
}

World SampleWorld() {
  World w;
  w.generation = 7;
  w.node_count = 2;
  w.state_source_rank = 1;
  w.state_step = 42;
  for (uint32_t r = 0; r < 3; ++r) {
    Assignment a;
    a.member = {"m" + std::to_string(r), 100 + r};
    a.node = r < 2 ? "a" : "b";
    a.rank = r;
    a.node_rank = r < 2 ? 0 : 1;
    a.local_rank = r % 2;
    a.local_world_size = r < 2 ? 2 : 1;
    a.step = 40 + r;
    a.state_address = "h:" + std::to_string(r);
    w.members.push_back(a);
  }
  return w;
}

// Every member of `got` is the one of `want` at the same rank, field by
// field.
void ExpectSameMembers(const World& got, const World& want) {
  ASSERT_EQ(got.members.size(), want.members.size());
  for (size_t i = 0; i < want.members.size(); ++i) {
    const Assignment& g = got.members[i];
    const Assignment& e = want.members[i];
    EXPECT_EQ(g.member, e.member) << "rank " << i;
    EXPECT_EQ(g.node, e.node) << "rank " << i;
    EXPECT_EQ(g.state_address, e.state_address) << "rank " << i;
    EXPECT_EQ(g.rank, i);
    EXPECT_EQ(g.node_rank, e.node_rank) << "rank " << i;
    EXPECT_EQ(g.local_rank, e.local_rank) << "rank " << i;
    EXPECT_EQ(g.local_world_size, e.local_world_size) << "rank " << i;
    EXPECT_EQ(g.step, e.step) << "rank " << i;
  }
}

TEST(SqliteStateStoreTest, EmptyStoreHasNoWorld) {
  auto store = OpenSqliteStateStore(":memory:");
  ASSERT_TRUE(store.ok()) << store.status();
  auto w = (*store)->LoadWorld();
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->generation, 0u);
  EXPECT_TRUE(w->members.empty());
}

TEST(SqliteStateStoreTest, SurvivesReopen) {
  const std::string path = TempDb("state");
  {
    auto store = OpenSqliteStateStore(path);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->SaveWorld(SampleWorld()).ok());
    CheckpointRecord r;
    r.id = 3;
    r.step = 200;
    r.generation = 7;
    r.expected = {"m0", "m1"};
    r.reported = {"m0"};
    r.state = CheckpointState::kCommitted;
    r.created = absl::FromUnixMillis(1000);
    r.committed = absl::FromUnixMillis(2000);
    r.files = {{"m0", "/ckpt/a.safetensors", 1234, "0123456789abcdef"}};
    r.metric_name = "val_loss";
    r.metric_value = 0.25;
    ASSERT_TRUE((*store)->SaveCheckpoint(r).ok());
    ASSERT_TRUE((*store)->AppendEvents({{absl::FromUnixMillis(5), "join", "m0 joined"}}).ok());
  }
  auto store = OpenSqliteStateStore(path);
  ASSERT_TRUE(store.ok());
  auto w = (*store)->LoadWorld();
  ASSERT_TRUE(w.ok());
  const World expected = SampleWorld();
  EXPECT_EQ(w->generation, 7u);
  EXPECT_EQ(w->state_source_rank, 1u);
  EXPECT_EQ(w->state_step, 42);
  ASSERT_EQ(w->members.size(), 3u);
  EXPECT_EQ(w->members[2].member, expected.members[2].member);
  EXPECT_EQ(w->members[2].node, "b");
  EXPECT_EQ(w->members[2].state_address, "h:2");
  auto cks = (*store)->LoadCheckpoints();
  ASSERT_TRUE(cks.ok());
  ASSERT_EQ(cks->size(), 1u);
  const CheckpointRecord& r = (*cks)[0];
  EXPECT_EQ(r.step, 200);
  EXPECT_EQ(r.state, CheckpointState::kCommitted);
  EXPECT_EQ(r.expected, (std::vector<std::string>{"m0", "m1"}));
  EXPECT_EQ(r.reported.count("m0"), 1u);
  ASSERT_EQ(r.files.size(), 1u);
  EXPECT_EQ(r.files[0].bytes, 1234u);
  EXPECT_EQ(r.metric_value, 0.25);
  auto events = (*store)->LoadEvents(10);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].detail, "m0 joined");
}

TEST(SqliteStateStoreTest, RejectsUnknownSchemaAndUnreadablePath) {
  const std::string path = TempDb("schema");
  ASSERT_TRUE(OpenSqliteStateStore(path).ok());
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "UPDATE meta SET value='99' WHERE key='schema_version'", nullptr,
                         nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  auto reopened = OpenSqliteStateStore(path);
  EXPECT_EQ(reopened.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(OpenSqliteStateStore("/nonexistent-dir/x.db").status().code(),
            absl::StatusCode::kUnavailable);
}

// Runs `sql` on the file at `path` outside the store.
void ExecOn(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  char* error = nullptr;
  EXPECT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &error), SQLITE_OK)
      << (error != nullptr ? error : "");
  sqlite3_free(error);
  sqlite3_close(db);
}

// The file a version 1 coordinator left at `path`: its world as rows.
void MakeVersion1File(const std::string& path) {
  ASSERT_TRUE(OpenSqliteStateStore(path).ok());
  ExecOn(path,
         "DROP TABLE world;"
         "UPDATE meta SET value='1' WHERE key='schema_version';"
         "INSERT OR REPLACE INTO meta(key, value) VALUES('generation', '7'), "
         "('node_count', '2'), ('state_source_rank', '1'), ('state_step', '42');"
         "INSERT INTO world_members VALUES(0, 'm0', 100, 'a', 'h:0', 0, 0, 2, 40), "
         "(1, 'm1', 101, 'a', 'h:1', 0, 1, 2, 41), (2, 'm2', 102, 'b', 'h:2', 1, 0, 1, 42);");
}

// What a query's first value is, read outside the store.
std::string FirstValue(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  std::string value;
  if (sqlite3_open(path.c_str(), &db) == SQLITE_OK) {
    sqlite3_exec(
        db, sql.c_str(),
        [](void* out, int, char** values, char**) {
          *static_cast<std::string*>(out) = values[0] != nullptr ? values[0] : "";
          return 0;
        },
        &value, nullptr);
  }
  sqlite3_close(db);
  return value;
}

TEST(SqliteStateStoreTest, AVersion1FileIsReadAsItIsAndBecomesVersion3AtTheFirstWorldWritten) {
  const std::string path = TempDb("v1");
  MakeVersion1File(path);
  auto store = OpenSqliteStateStore(path);
  ASSERT_TRUE(store.ok()) << store.status();
  // Opening it changes nothing: a version 1 primary may still be writing it.
  EXPECT_EQ(FirstValue(path, "SELECT value FROM meta WHERE key='schema_version'"), "1");
  auto w = (*store)->LoadWorld();
  ASSERT_TRUE(w.ok()) << w.status();
  const World expected = SampleWorld();
  EXPECT_EQ(w->generation, 7u);
  ASSERT_EQ(w->members.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(w->members[i].member, expected.members[i].member);
    EXPECT_EQ(w->members[i].node, expected.members[i].node);
    EXPECT_EQ(w->members[i].state_address, expected.members[i].state_address);
    EXPECT_EQ(w->members[i].node_rank, expected.members[i].node_rank);
    EXPECT_EQ(w->members[i].local_rank, expected.members[i].local_rank);
    EXPECT_EQ(w->members[i].local_world_size, expected.members[i].local_world_size);
    EXPECT_EQ(w->members[i].step, expected.members[i].step);
  }
  EXPECT_EQ(w->RankOf("m2"), 2);
  // The first world written makes it version 3: the value, no rows.
  World next = SampleWorld();
  next.generation = 8;
  next.members.pop_back();
  ASSERT_TRUE((*store)->SaveWorld(next).ok());
  EXPECT_EQ(FirstValue(path, "SELECT value FROM meta WHERE key='schema_version'"), "3");
  EXPECT_EQ(FirstValue(path, "SELECT count(*) FROM world_members"), "0");
  auto again = OpenSqliteStateStore(path);
  ASSERT_TRUE(again.ok()) << again.status();
  auto w2 = (*again)->LoadWorld();
  ASSERT_TRUE(w2.ok()) << w2.status();
  EXPECT_EQ(w2->generation, 8u);
  EXPECT_EQ(w2->members.size(), 2u);
}

// SampleWorld's members as a version 2 file holds them: every number 8
// bytes little-endian, a string its length and its bytes, rank first.
std::string Version2Value() {
  std::string out;
  auto number = [&out](uint64_t v) {
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  };
  auto text = [&](const std::string& v) {
    number(v.size());
    out += v;
  };
  for (const Assignment& a : SampleWorld().members) {
    number(a.rank);
    text(a.member.id);
    number(a.member.incarnation);
    text(a.node);
    text(a.state_address);
    number(a.node_rank);
    number(a.local_rank);
    number(a.local_world_size);
    number(static_cast<uint64_t>(a.step));
  }
  return out;
}

TEST(SqliteStateStoreTest, AVersion2FileIsReadAsItIsAndBecomesVersion3AtTheFirstWorldWritten) {
  const std::string path = TempDb("v2");
  ASSERT_TRUE(OpenSqliteStateStore(path).ok());
  std::string hex;
  for (const unsigned char c : Version2Value()) absl::StrAppend(&hex, absl::Hex(c, absl::kZeroPad2));
  ExecOn(path, absl::StrCat("UPDATE meta SET value='2' WHERE key='schema_version';"
                            "INSERT OR REPLACE INTO meta(key, value) VALUES('generation', '7'), "
                            "('node_count', '2'), ('state_source_rank', '1'), ('state_step', '42');"
                            "INSERT OR REPLACE INTO world(id, members) VALUES(1, X'", hex, "');"));
  auto store = OpenSqliteStateStore(path);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(FirstValue(path, "SELECT value FROM meta WHERE key='schema_version'"), "2");
  auto w = (*store)->LoadWorld();
  ASSERT_TRUE(w.ok()) << w.status();
  ExpectSameMembers(*w, SampleWorld());
  World next = SampleWorld();
  next.generation = 8;
  ASSERT_TRUE((*store)->SaveWorld(next).ok());
  EXPECT_EQ(FirstValue(path, "SELECT value FROM meta WHERE key='schema_version'"), "3");
  auto again = OpenSqliteStateStore(path);
  ASSERT_TRUE(again.ok()) << again.status();
  auto w2 = (*again)->LoadWorld();
  ASSERT_TRUE(w2.ok()) << w2.status();
  EXPECT_EQ(w2->generation, 8u);
  ExpectSameMembers(*w2, SampleWorld());
}

// Values at the edges of each field's range survive a write and a read, and
// a node's name is stored once per run of its members.
TEST(SqliteStateStoreTest, AWorldOfAwkwardValuesComesBackAsItWasWritten) {
  const std::string path = TempDb("awkward");
  World w;
  w.generation = (uint64_t{1} << 63) + 5;
  const std::vector<std::string> nodes = {"a", "a", "", "b", "a", "a"};
  for (uint32_t r = 0; r < nodes.size(); ++r) {
    Assignment a;
    a.member = {r == 2 ? std::string(300, 'x') : absl::StrCat("m", r),
                r == 1 ? ~uint64_t{0} : uint64_t{r} << (9 * r)};
    a.node = nodes[r];
    a.rank = r;
    a.node_rank = r == 0 ? 0 : r * 1000;
    a.local_rank = r;
    a.local_world_size = (uint32_t{1} << 31) + r;
    a.step = r == 3 ? -1 : r == 4 ? std::numeric_limits<int64_t>::min()
                                  : std::numeric_limits<int64_t>::max() - r;
    a.state_address = r == 5 ? "" : absl::StrCat("[::1]:", 60000 + r);
    w.members.push_back(a);
  }
  w.Index();
  {
    auto store = OpenSqliteStateStore(path);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->SaveWorld(w).ok());
  }
  auto store = OpenSqliteStateStore(path);
  ASSERT_TRUE(store.ok()) << store.status();
  auto loaded = (*store)->LoadWorld();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->generation, w.generation);
  ExpectSameMembers(*loaded, w);
  EXPECT_EQ(loaded->digest(), w.digest());
  // 1,000 members of 8 per node, ids of 6 bytes, no state address: about 16
  // bytes each (85 in version 2).
  World big;
  big.generation = 9;
  for (uint32_t r = 0; r < 1000; ++r) {
    Assignment a;
    a.member = {absl::StrCat("m", 10000 + r), 1000 + r};
    a.node = absl::StrCat("node", r / 8);
    a.rank = r;
    a.node_rank = r / 8;
    a.local_rank = r % 8;
    a.local_world_size = 8;
    a.step = 120;
    big.members.push_back(a);
  }
  ASSERT_TRUE((*store)->SaveWorld(big).ok());
  const std::string bytes = FirstValue(path, "SELECT length(members) FROM world");
  EXPECT_LE(std::stoul(bytes), 17'000u) << bytes << " bytes";
  auto big_loaded = (*store)->LoadWorld();
  ASSERT_TRUE(big_loaded.ok()) << big_loaded.status();
  ExpectSameMembers(*big_loaded, big);
}

// A newer standby opened the file while a version 1 primary kept writing
// its rows: taking over, it loads the primary's latest world.
TEST(SqliteStateStoreTest, AStandbyLoadsTheRowsAVersion1PrimaryWroteAfterItOpenedTheFile) {
  const std::string path = TempDb("v1_primary");
  MakeVersion1File(path);
  auto standby = OpenSqliteStateStore(path);
  ASSERT_TRUE(standby.ok()) << standby.status();
  ExecOn(path,
         "UPDATE meta SET value='9' WHERE key='generation';"
         "DELETE FROM world_members;"
         "INSERT INTO world_members VALUES(0, 'm5', 105, 'c', 'h:5', 0, 0, 1, 50);");
  auto w = (*standby)->LoadWorld();
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->generation, 9u);
  ASSERT_EQ(w->members.size(), 1u);
  EXPECT_EQ(w->members[0].member.id, "m5");
  EXPECT_EQ(w->members[0].step, 50);
}

// `n` members, eight to a node, with every field set.
World ManyMembers(uint32_t n) {
  World saved;
  saved.generation = 3;
  for (uint32_t r = 0; r < n; ++r) {
    Assignment a;
    a.member = {"node" + std::to_string(r / 8) + "/" + std::to_string(r % 8), 1000 + r};
    a.node = "node" + std::to_string(r / 8);
    a.rank = r;
    a.node_rank = r / 8;
    a.local_rank = r % 8;
    a.local_world_size = 8;
    a.step = -1 + static_cast<int64_t>(r) * 1000000007LL;
    a.state_address = r % 3 == 0 ? "" : "10.0.0." + std::to_string(r % 250) + ":29500";
    saved.members.push_back(a);
  }
  return saved;
}

TEST(SqliteStateStoreTest, AWorldOfManyMembersComesBackAsItWasSaved) {
  const std::string path = TempDb("many");
  const World saved = ManyMembers(5000);
  {
    auto store = OpenSqliteStateStore(path);
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->SaveWorld(saved).ok());
  }
  auto store = OpenSqliteStateStore(path);
  ASSERT_TRUE(store.ok());
  auto w = (*store)->LoadWorld();
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_EQ(w->members.size(), saved.members.size());
  for (size_t i = 0; i < saved.members.size(); ++i) {
    const Assignment& a = w->members[i];
    const Assignment& b = saved.members[i];
    ASSERT_TRUE(a.member == b.member && a.node == b.node && a.state_address == b.state_address &&
                a.rank == b.rank && a.node_rank == b.node_rank && a.local_rank == b.local_rank &&
                a.local_world_size == b.local_world_size && a.step == b.step)
        << "member " << i;
  }
}

TEST(SqliteStateStoreTest, TheLogIsFoldedByCompactJournalNotInsideTheCommit) {
  const std::string path = TempDb("compact");
  auto store = OpenSqliteStateStore(path);
  ASSERT_TRUE(store.ok());
  auto bytes = [](const std::string& file) {
    struct stat st;
    return ::stat(file.c_str(), &st) == 0 ? st.st_size : off_t{0};
  };
  // Over SQLite's 1,000 pages (4 MB): by default its commit would fold it
  // into the file at once.
  World w = ManyMembers(200'000);
  ASSERT_TRUE((*store)->SaveWorld(w).ok());
  EXPECT_LT(bytes(path), 1'000'000);  // durable in the log only
  const off_t log = bytes(path + "-wal");
  ASSERT_GT(log, 4'000'000);
  (*store)->CompactJournal();
  EXPECT_GT(bytes(path), 4'000'000);
  for (int i = 0; i < 8; ++i) {
    ++w.generation;
    ASSERT_TRUE((*store)->SaveWorld(w).ok());
    (*store)->CompactJournal();
  }
  // Folded each time, the log is reused, not grown by each of nine writes.
  EXPECT_LT(bytes(path + "-wal"), log * 4);
  auto loaded = (*store)->LoadWorld();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->generation, w.generation);
  EXPECT_EQ(loaded->members.size(), w.members.size());
}

TEST(SqliteStateStoreTest, ADamagedWorldIsRefusedNotReadAsASmallerOne) {
  const std::string path = TempDb("damaged_world");
  {
    auto store = OpenSqliteStateStore(path);
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->SaveWorld(SampleWorld()).ok());
  }
  // Cut short in the last member.
  ExecOn(path, "UPDATE world SET members = substr(members, 1, length(members) - 5)");
  auto store = OpenSqliteStateStore(path);
  ASSERT_TRUE(store.ok());
  auto w = (*store)->LoadWorld();
  EXPECT_EQ(w.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(w.status().message().find("member of rank 2"), std::string::npos) << w.status();
}

// What SQLite itself says the file's journal mode is.
std::string JournalModeOf(const std::string& path) {
  return FirstValue(path, "PRAGMA journal_mode");
}

TEST(SqliteStateStoreTest, NetworkFileSystemsGetTheRollbackJournal) {
  EXPECT_EQ(NetworkFileSystemName(0x6969), "nfs");
  EXPECT_EQ(NetworkFileSystemName(0x0bd00bd0), "lustre");
  EXPECT_EQ(NetworkFileSystemName(0x47504653), "gpfs");
  EXPECT_EQ(NetworkFileSystemName(0xef53), "");      // ext4
  EXPECT_EQ(NetworkFileSystemName(0x01021994), "");  // tmpfs
  EXPECT_EQ(NetworkFileSystemName(0x58465342), "");  // xfs

  const std::string path = TempDb("journal");
  {
    auto store = OpenSqliteStateStore(path);  // a local file system: WAL
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->SaveWorld(SampleWorld()).ok());
  }
  EXPECT_EQ(JournalModeOf(path), "wal");
  {
    // As on NFS: the same file turns to the rollback journal, and keeps its
    // contents.
    auto store = OpenSqliteStateStore(path, absl::ZeroDuration(), JournalMode::kRollback);
    ASSERT_TRUE(store.ok()) << store.status();
    EXPECT_EQ((*store)->LoadWorld()->members.size(), 3u);
    ASSERT_TRUE((*store)->SaveWorld(SampleWorld()).ok());
    EXPECT_NE(::access((path + "-wal").c_str(), F_OK), 0) << "a WAL file next to the database";
  }
  EXPECT_EQ(JournalModeOf(path), "delete");
}

TEST(SqliteStateStoreTest, ADamagedPageIsRefusedNotReadAsAShorterCatalog) {
  const std::string path = TempDb("damaged");
  {
    auto store = OpenSqliteStateStore(path, absl::ZeroDuration(), JournalMode::kRollback);
    ASSERT_TRUE(store.ok()) << store.status();
    for (uint64_t id = 1; id <= 200; ++id) {
      CheckpointRecord r;
      r.id = id;
      r.step = static_cast<int64_t>(id) * 100;
      r.expected = {"m0"};
      r.reported = {"m0"};
      r.state = CheckpointState::kCommitted;
      r.files = {{"m0", "/ckpt/step-" + std::to_string(id) + "/model.safetensors", 1234,
                  "0123456789abcdef"}};
      ASSERT_TRUE((*store)->SaveCheckpoint(r).ok());
    }
  }
  // One page in the middle of the file is overwritten.
  FILE* f = std::fopen(path.c_str(), "r+b");
  ASSERT_NE(f, nullptr);
  std::fseek(f, 0, SEEK_END);
  const long pages = std::ftell(f) / 4096;
  ASSERT_GT(pages, 6);
  std::fseek(f, (pages / 2) * 4096, SEEK_SET);
  const std::string garbage(4096, '\x5a');
  std::fwrite(garbage.data(), 1, garbage.size(), f);
  std::fclose(f);

  auto reopened = OpenSqliteStateStore(path);
  ASSERT_EQ(reopened.status().code(), absl::StatusCode::kDataLoss) << reopened.status();
  EXPECT_NE(reopened.status().message().find(path), std::string::npos) << reopened.status();
  EXPECT_NE(reopened.status().message().find("--rebuild-catalog"), std::string::npos)
      << reopened.status();
}

TEST(SqliteStateStoreTest, AFileThatIsNotADatabaseIsDamaged) {
  const std::string path = TempDb("garbled");
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  const std::string text(8192, 'x');
  std::fwrite(text.data(), 1, text.size(), f);
  std::fclose(f);
  auto opened = OpenSqliteStateStore(path);
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kDataLoss) << opened.status();
  EXPECT_NE(opened.status().message().find(path), std::string::npos) << opened.status();
}

}  // namespace
}  // namespace muster
