// Persister over a real SQLite file whose fsyncs are slow (the state
// store's slow-sync VFS): worlds queued during a write go out together, the
// newest wins, and a waiter hears only once its world is on disk.
#include "coordinator/persister.h"

#include <unistd.h>

#include <memory>

#include <gtest/gtest.h>
#include <sqlite3.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace muster {
namespace {

std::shared_ptr<const World> WorldOf(uint64_t generation) {
  World w;
  w.generation = generation;
  Assignment a;
  a.member = {"m", generation};
  w.members.push_back(a);
  w.Index();
  return std::make_shared<const World>(std::move(w));
}

TEST(PersisterTest, WorldsQueuedDuringASlowWriteGoInOneGroupAndTheNewestWins) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/persister", ::getpid(), ".db");
  std::remove(path.c_str());
  OpenSqliteStateStore(path).value();  // the schema, at full speed
  auto store = OpenSqliteStateStore(path, absl::Milliseconds(100));
  ASSERT_TRUE(store.ok()) << store.status();
  SerializedStateStore serialized(store->get());
  Persister p(&serialized, RealClock::Get());
  const uint64_t first = p.SaveWorld(WorldOf(1));
  absl::SleepFor(absl::Milliseconds(30));  // the writer is inside the first write's fsyncs
  uint64_t last = 0;
  for (uint64_t g = 2; g <= 6; ++g) last = p.SaveWorld(WorldOf(g));
  p.AppendEvents({JobEvent{absl::Now(), "test", "an event"}});
  ASSERT_TRUE(p.Wait(first).ok());
  ASSERT_TRUE(p.Wait(last).ok());
  EXPECT_LE(p.groups_written(), 2u) << "five worlds queued during a write take one more group";
  // What another connection reads: the newest world, and the event.
  auto reader = OpenSqliteStateStore(path);
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ((*reader)->LoadWorld()->generation, 6u);
  ASSERT_TRUE(p.Flush().ok());
  auto events = (*reader)->LoadEvents(10);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].detail, "an event");
}

// The coordinator hands its world over shared (a copy of 100,000 members
// under its lock took milliseconds) and changes it in place only while no
// one else holds it: the writer must let go of it once it is written.
TEST(PersisterTest, TheWriterLetsGoOfAWorldOnceItIsWritten) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/letgo", ::getpid(), ".db");
  std::remove(path.c_str());
  auto store = OpenSqliteStateStore(path);
  ASSERT_TRUE(store.ok()) << store.status();
  SerializedStateStore serialized(store->get());
  Persister p(&serialized, RealClock::Get());
  const std::shared_ptr<const World> world = WorldOf(3);
  ASSERT_TRUE(p.Wait(p.SaveWorld(world)).ok());
  ASSERT_TRUE(p.Flush().ok());
  EXPECT_EQ(world.use_count(), 1);
  auto reader = OpenSqliteStateStore(path);
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ((*reader)->LoadWorld()->generation, 3u);
}

// An event log that cannot be written (another process holds the
// database's write lock) does not hang a Flush with a timeout: it says what
// is not written. The events are written once the lock is gone.
TEST(PersisterTest, AFlushWithATimeoutNamesAnEventLogThatCannotBeWritten) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/locked", ::getpid(), ".db");
  std::remove(path.c_str());
  auto store = OpenSqliteStateStore(path);
  ASSERT_TRUE(store.ok()) << store.status();
  SerializedStateStore serialized(store->get());
  Persister p(&serialized, RealClock::Get());
  sqlite3* other = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &other), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(other, "BEGIN EXCLUSIVE", nullptr, nullptr, nullptr), SQLITE_OK);
  p.AppendEvents({JobEvent{absl::Now(), "test", "held up"}});
  const absl::Time start = absl::Now();
  const absl::Status s = p.Flush(absl::Milliseconds(300));
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_NE(s.message().find("event log"), std::string::npos) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  ASSERT_EQ(sqlite3_exec(other, "COMMIT", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(other);
  EXPECT_TRUE(p.Flush(absl::Seconds(30)).ok());
  auto events = (*store)->LoadEvents(10);
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].detail, "held up");
}

}  // namespace
}  // namespace muster
