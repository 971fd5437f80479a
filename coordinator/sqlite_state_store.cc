// SQLite implementation of StateStore. Schema version 3:
//   meta(key TEXT PRIMARY KEY, value TEXT)            generation, source rank...
//   world(id = 1, members BLOB)                       the current world's members
//   world_members(rank INTEGER PRIMARY KEY, ...)      version 1's world (empty)
//   checkpoints(id INTEGER PRIMARY KEY, ...)          the catalog
//   checkpoint_files(checkpoint_id, member, path, bytes, checksum)
//   events(id INTEGER PRIMARY KEY, unix_ms, kind, detail)
//   lease(id = 1, epoch, holder, ...)                 who may write (docs/failover.md)
// Version 1 kept a row per member; a regroup rewrote them all, 0.2 s at
// 100,000 members, twice per regroup and before anyone hears of it. Version
// 2 keeps them as one value (EncodeMembers), written in about 90 ms. A
// version 1 file is read as it is and becomes version 2 when this coordinator
// first writes a world (as the lease holder); a coordinator that knows only
// version 1 refuses a version 2 file. Version 3 writes that value with
// variable-length numbers and each node's name once (EncodeMembers): 9.0 MB
// in the benchmark's 100,000-member world in version 2, 2.2 MB in version 3,
// and a regroup waits for two such writes. Versions 1 and 2 are read as they
// are and become 3 the same way.
#include <sqlite3.h>
#include <sys/vfs.h>

#include <algorithm>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "coordinator/lease.h"
#include "coordinator/slow_sync_vfs.h"
#include "coordinator/state_store.h"

namespace muster {
namespace {

constexpr int kSchemaVersion = 3;

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS world_members(
  rank INTEGER PRIMARY KEY, member_id TEXT NOT NULL, incarnation INTEGER NOT NULL,
  node TEXT NOT NULL, state_address TEXT NOT NULL, node_rank INTEGER NOT NULL,
  local_rank INTEGER NOT NULL, local_world_size INTEGER NOT NULL, step INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS world(id INTEGER PRIMARY KEY CHECK(id = 1), members BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS checkpoints(
  id INTEGER PRIMARY KEY, step INTEGER NOT NULL, generation INTEGER NOT NULL,
  expected TEXT NOT NULL, reported TEXT NOT NULL, state INTEGER NOT NULL,
  created_ms INTEGER NOT NULL, committed_ms INTEGER NOT NULL,
  metric_name TEXT NOT NULL, metric_value REAL NOT NULL, reason TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS checkpoint_files(
  checkpoint_id INTEGER NOT NULL, member TEXT NOT NULL, path TEXT NOT NULL,
  bytes INTEGER NOT NULL, checksum TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS checkpoint_files_id ON checkpoint_files(checkpoint_id);
CREATE TABLE IF NOT EXISTS events(
  id INTEGER PRIMARY KEY AUTOINCREMENT, unix_ms INTEGER NOT NULL,
  kind TEXT NOT NULL, detail TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS lease(
  id INTEGER PRIMARY KEY CHECK(id = 1), epoch INTEGER NOT NULL, holder TEXT NOT NULL,
  beats INTEGER NOT NULL);
)sql";

// One prepared statement; finalized on destruction.
class Statement {
 public:
  Statement(sqlite3* db, const char* sql) : db_(db) {
    rc_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr);
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  absl::Status status() const {
    if (rc_ == SQLITE_OK) return absl::OkStatus();
    return absl::InternalError(absl::StrCat("sqlite prepare: ", sqlite3_errmsg(db_)));
  }
  void Bind(int i, int64_t v) { sqlite3_bind_int64(stmt_, i, v); }
  void Bind(int i, double v) { sqlite3_bind_double(stmt_, i, v); }
  void Bind(int i, const std::string& v) {
    sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
  }
  // `v` must outlive the statement's next Run.
  void BindBlob(int i, const std::string& v) {
    sqlite3_bind_blob64(stmt_, i, v.data(), v.size(), SQLITE_STATIC);
  }
  // SQLITE_ROW: a row is ready; SQLITE_DONE: finished; else an error.
  int Step() { return sqlite3_step(stmt_); }
  absl::Status Run() {
    int rc = Step();
    if (rc == SQLITE_DONE || rc == SQLITE_ROW) {
      sqlite3_reset(stmt_);
      sqlite3_clear_bindings(stmt_);
      return absl::OkStatus();
    }
    sqlite3_reset(stmt_);
    return absl::UnavailableError(absl::StrCat("sqlite: ", sqlite3_errmsg(db_)));
  }
  int64_t Int(int col) { return sqlite3_column_int64(stmt_, col); }
  double Real(int col) { return sqlite3_column_double(stmt_, col); }
  std::string Blob(int col) {
    const void* p = sqlite3_column_blob(stmt_, col);
    return p == nullptr ? std::string()
                        : std::string(static_cast<const char*>(p),
                                      static_cast<size_t>(sqlite3_column_bytes(stmt_, col)));
  }
  std::string Text(int col) {
    const unsigned char* p = sqlite3_column_text(stmt_, col);
    return p == nullptr ? std::string()
                        : std::string(reinterpret_cast<const char*>(p),
                                      sqlite3_column_bytes(stmt_, col));
  }

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
  int rc_;
};

int64_t ToMs(absl::Time t) { return absl::ToUnixMillis(t); }
absl::Time FromMs(int64_t ms) { return absl::FromUnixMillis(ms); }

// The world table's value (schema 3): the members in rank order, each as its
// id, incarnation, node, state address, node rank, local rank, local world
// size and step. A number is unsigned LEB128 (the step zigzag-encoded
// first), a string its length and its bytes; the node is a number, 1 for the
// node of the member before, 0 followed by the node's name otherwise.
void PutNumber(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}
void PutString(const std::string& v, std::string* out) {
  PutNumber(v.size(), out);
  out->append(v);
}
uint64_t ZigZag(int64_t v) {
  return (static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63);
}
int64_t UnZigZag(uint64_t v) {
  return static_cast<int64_t>(v >> 1) ^ -static_cast<int64_t>(v & 1);
}

std::string EncodeMembers(const std::vector<Assignment>& members) {
  std::string out;
  size_t bytes = 0;
  for (const Assignment& a : members) {
    bytes += 16 + a.member.id.size() + a.state_address.size();
  }
  out.reserve(bytes);
  const std::string* node = nullptr;
  for (const Assignment& a : members) {
    PutString(a.member.id, &out);
    PutNumber(a.member.incarnation, &out);
    if (node != nullptr && *node == a.node) {
      PutNumber(1, &out);
    } else {
      PutNumber(0, &out);
      PutString(a.node, &out);
    }
    node = &a.node;
    PutString(a.state_address, &out);
    PutNumber(a.node_rank, &out);
    PutNumber(a.local_rank, &out);
    PutNumber(a.local_world_size, &out);
    PutNumber(ZigZag(a.step), &out);
  }
  return out;
}

// Reads a world value of schema 2 (numbers of 8 bytes, little-endian) or 3
// (EncodeMembers); a value cut short, or with a string longer than what is
// left or a number longer than 64 bits, is damaged.
class MemberReader {
 public:
  MemberReader(absl::string_view data, bool fixed) : data_(data), fixed_(fixed) {}
  bool done() const { return at_ == data_.size(); }
  bool ok() const { return ok_; }
  uint64_t Number() { return fixed_ ? Fixed() : Varint(); }
  std::string String() {
    const uint64_t n = Number();
    if (!ok_ || data_.size() - at_ < n) {
      Fail();
      return std::string();
    }
    std::string v(data_.substr(at_, n));
    at_ += n;
    return v;
  }

 private:
  uint64_t Fixed() {
    if (!ok_ || data_.size() - at_ < 8) return Fail();
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) {
      v |= static_cast<uint64_t>(static_cast<unsigned char>(data_[at_ + i])) << (8 * i);
    }
    at_ += 8;
    return v;
  }
  uint64_t Varint() {
    uint64_t v = 0;
    for (int shift = 0; ok_ && shift < 64; shift += 7) {
      if (at_ == data_.size()) break;
      const auto byte = static_cast<unsigned char>(data_[at_++]);
      v |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) return v;
    }
    return Fail();
  }
  uint64_t Fail() {
    ok_ = false;
    return 0;
  }
  const absl::string_view data_;
  const bool fixed_;
  size_t at_ = 0;
  bool ok_ = true;
};

// One member of a schema 2 value: its rank first, every number 8 bytes.
Assignment ReadVersion2Member(MemberReader* in) {
  Assignment a;
  a.rank = static_cast<uint32_t>(in->Number());
  a.member.id = in->String();
  a.member.incarnation = in->Number();
  a.node = in->String();
  a.state_address = in->String();
  a.node_rank = static_cast<uint32_t>(in->Number());
  a.local_rank = static_cast<uint32_t>(in->Number());
  a.local_world_size = static_cast<uint32_t>(in->Number());
  a.step = static_cast<int64_t>(in->Number());
  return a;
}

// One member of a schema 3 value (EncodeMembers), after `before` (null for
// rank 0), whose node a member may name as its own.
Assignment ReadVersion3Member(MemberReader* in, const Assignment* before, bool* damaged) {
  Assignment a;
  a.member.id = in->String();
  a.member.incarnation = in->Number();
  if (in->Number() == 0) {
    a.node = in->String();
  } else if (before != nullptr) {
    a.node = before->node;
  } else {
    *damaged = true;  // the first member has no node before it
  }
  a.state_address = in->String();
  a.node_rank = static_cast<uint32_t>(in->Number());
  a.local_rank = static_cast<uint32_t>(in->Number());
  a.local_world_size = static_cast<uint32_t>(in->Number());
  a.step = UnZigZag(in->Number());
  return a;
}

// The world value of schema `version` (2 or 3).
absl::StatusOr<std::vector<Assignment>> DecodeMembers(absl::string_view data, int version) {
  std::vector<Assignment> members;
  MemberReader in(data, /*fixed=*/version == 2);
  bool damaged = false;
  while (in.ok() && !in.done() && !damaged) {
    Assignment a = version == 2
                       ? ReadVersion2Member(&in)
                       : ReadVersion3Member(&in, members.empty() ? nullptr : &members.back(),
                                            &damaged);
    if (!in.ok() || damaged) break;
    if (version == 2 && a.rank != members.size()) {
      return absl::DataLossError(
          absl::StrCat("the world's members are damaged: the member of rank ", members.size(),
                       " says rank ", a.rank));
    }
    a.rank = static_cast<uint32_t>(members.size());
    members.push_back(std::move(a));
  }
  if (damaged) {
    return absl::DataLossError(
        "the world's members are damaged: the member of rank 0 names the node of a member "
        "before it");
  }
  if (!in.ok()) {
    return absl::DataLossError(
        absl::StrCat("the world's members are damaged: cut short in the member of rank ",
                     members.size(), " (", data.size(), " bytes)"));
  }
  return members;
}

class SqliteStateStore : public StateStore {
 public:
  explicit SqliteStateStore(sqlite3* db) : db_(db) {}
  ~SqliteStateStore() override { sqlite3_close(db_); }

  // `rollback`: a rollback journal instead of WAL (network file systems).
  absl::Status Init(bool rollback) {
    MUSTER_RETURN_IF_ERROR(QuickCheck());
    MUSTER_RETURN_IF_ERROR(
        Exec(rollback ? "PRAGMA journal_mode=DELETE" : "PRAGMA journal_mode=WAL"));
    // The log is folded into the file by CompactJournal, after the callers
    // waiting for a write have gone on, not inside a commit: the hook only
    // counts the log's pages (it replaces SQLite's own, which folds).
    if (!rollback) {
      sqlite3_wal_hook(
          db_,
          [](void* store, sqlite3*, const char*, int pages) {
            static_cast<SqliteStateStore*>(store)->log_pages_ = pages;
            return SQLITE_OK;
          },
          this);
    }
    // In WAL mode a commit leaves the log unsynced and InTransaction syncs
    // it once SQLite's write lock is given back (SyncLog); the rollback
    // journal keeps its syncs inside the commit, where they must be.
    // (An in-memory database has neither.)
    {
      Statement mode(db_, "PRAGMA journal_mode");
      MUSTER_RETURN_IF_ERROR(mode.status());
      log_synced_apart_ = mode.Step() == SQLITE_ROW && mode.Text(0) == "wal";
    }
    MUSTER_RETURN_IF_ERROR(
        Exec(log_synced_apart_ ? "PRAGMA synchronous=NORMAL" : "PRAGMA synchronous=FULL"));
    MUSTER_RETURN_IF_ERROR(Exec(kSchema));
    std::string version;
    MUSTER_RETURN_IF_ERROR(GetMeta("schema_version", &version));
    if (version.empty()) {
      return SetMeta("schema_version", absl::StrCat(kSchemaVersion));
    }
    // A version 1 or 2 file is read as it is and becomes version 3 at the
    // first world written (WriteMembers), by the lease holder: a standby
    // that opens it next to an older primary must not change it under that
    // primary, which still writes its own format.
    if (version == "1" || version == "2") return absl::OkStatus();
    if (version != absl::StrCat(kSchemaVersion)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "state database has schema version ", version, "; this coordinator knows ",
          kSchemaVersion));
    }
    return absl::OkStatus();
  }

  absl::Status SaveWorld(const World& world) override {
    const std::string members = EncodeMembers(world.members);
    absl::MutexLock lock(&mu_);
    return InTransaction([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
      MUSTER_RETURN_IF_ERROR(WriteMembers(members));
      MUSTER_RETURN_IF_ERROR(SetMeta("generation", absl::StrCat(world.generation)));
      MUSTER_RETURN_IF_ERROR(SetMeta("node_count", absl::StrCat(world.node_count)));
      MUSTER_RETURN_IF_ERROR(
          SetMeta("state_source_rank", absl::StrCat(world.state_source_rank)));
      MUSTER_RETURN_IF_ERROR(SetMeta("paused", world.paused ? "1" : "0"));
      return SetMeta("state_step", absl::StrCat(world.state_step));
    });
  }

  absl::StatusOr<World> LoadWorld() override {
    absl::MutexLock lock(&mu_);
    World world;
    MUSTER_RETURN_IF_ERROR(GetMetaInt("generation", &world.generation));
    uint64_t v = 0;
    MUSTER_RETURN_IF_ERROR(GetMetaInt("node_count", &v));
    world.node_count = static_cast<uint32_t>(v);
    MUSTER_RETURN_IF_ERROR(GetMetaInt("state_source_rank", &v));
    world.state_source_rank = static_cast<uint32_t>(v);
    MUSTER_RETURN_IF_ERROR(GetMetaInt("state_step", &v));
    world.state_step = static_cast<int64_t>(v);
    MUSTER_RETURN_IF_ERROR(GetMetaInt("paused", &v));  // absent before it was stored: 0
    world.paused = v != 0;
    MUSTER_ASSIGN_OR_RETURN(world.members, ReadMembers());
    world.Index();
    return world;
  }

  absl::Status SaveCheckpoint(const CheckpointRecord& r) override {
    absl::MutexLock lock(&mu_);
    return InTransaction([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
      Statement up(db_,
                   "INSERT OR REPLACE INTO checkpoints(id, step, generation, expected, "
                   "reported, state, created_ms, committed_ms, metric_name, metric_value, "
                   "reason) VALUES(?,?,?,?,?,?,?,?,?,?,?)");
      MUSTER_RETURN_IF_ERROR(up.status());
      up.Bind(1, static_cast<int64_t>(r.id));
      up.Bind(2, r.step);
      up.Bind(3, static_cast<int64_t>(r.generation));
      up.Bind(4, absl::StrJoin(r.expected, "\n"));
      up.Bind(5, absl::StrJoin(r.reported, "\n"));
      up.Bind(6, static_cast<int64_t>(r.state));
      up.Bind(7, ToMs(r.created));
      up.Bind(8, ToMs(r.committed));
      up.Bind(9, r.metric_name);
      up.Bind(10, r.metric_value);
      up.Bind(11, r.reason);
      MUSTER_RETURN_IF_ERROR(up.Run());
      Statement del(db_, "DELETE FROM checkpoint_files WHERE checkpoint_id = ?");
      MUSTER_RETURN_IF_ERROR(del.status());
      del.Bind(1, static_cast<int64_t>(r.id));
      MUSTER_RETURN_IF_ERROR(del.Run());
      Statement ins(db_,
                    "INSERT INTO checkpoint_files(checkpoint_id, member, path, bytes, "
                    "checksum) VALUES(?,?,?,?,?)");
      MUSTER_RETURN_IF_ERROR(ins.status());
      for (const ShardFileRecord& f : r.files) {
        ins.Bind(1, static_cast<int64_t>(r.id));
        ins.Bind(2, f.member);
        ins.Bind(3, f.path);
        ins.Bind(4, static_cast<int64_t>(f.bytes));
        ins.Bind(5, f.checksum);
        MUSTER_RETURN_IF_ERROR(ins.Run());
      }
      return absl::OkStatus();
    });
  }

  absl::StatusOr<std::vector<CheckpointRecord>> LoadCheckpoints() override {
    absl::MutexLock lock(&mu_);
    std::vector<CheckpointRecord> out;
    Statement q(db_,
                "SELECT id, step, generation, expected, reported, state, created_ms, "
                "committed_ms, metric_name, metric_value, reason FROM checkpoints "
                "ORDER BY id");
    MUSTER_RETURN_IF_ERROR(q.status());
    int rc;
    while ((rc = q.Step()) == SQLITE_ROW) {
      CheckpointRecord r;
      r.id = static_cast<uint64_t>(q.Int(0));
      r.step = q.Int(1);
      r.generation = static_cast<uint64_t>(q.Int(2));
      r.expected = absl::StrSplit(q.Text(3), '\n', absl::SkipEmpty());
      for (auto& m : std::vector<std::string>(absl::StrSplit(q.Text(4), '\n', absl::SkipEmpty()))) {
        r.reported.insert(m);
      }
      const int64_t state = q.Int(5);
      if (state < 1 || state > 4) {
        return absl::DataLossError(
            absl::StrCat("checkpoint ", r.id, " has unknown state ", state));
      }
      r.state = static_cast<CheckpointState>(state);
      r.created = FromMs(q.Int(6));
      r.committed = FromMs(q.Int(7));
      r.metric_name = q.Text(8);
      r.metric_value = q.Real(9);
      r.reason = q.Text(10);
      out.push_back(std::move(r));
    }
    MUSTER_RETURN_IF_ERROR(ReadEnded(rc, "checkpoints"));
    Statement f(db_,
                "SELECT checkpoint_id, member, path, bytes, checksum FROM checkpoint_files "
                "ORDER BY rowid");
    MUSTER_RETURN_IF_ERROR(f.status());
    while ((rc = f.Step()) == SQLITE_ROW) {
      const uint64_t id = static_cast<uint64_t>(f.Int(0));
      for (CheckpointRecord& r : out) {
        if (r.id != id) continue;
        r.files.push_back(ShardFileRecord{f.Text(1), f.Text(2),
                                          static_cast<uint64_t>(f.Int(3)), f.Text(4)});
        break;
      }
    }
    MUSTER_RETURN_IF_ERROR(ReadEnded(rc, "checkpoint_files"));
    return out;
  }

  absl::Status AppendEvents(const std::vector<JobEvent>& events) override {
    if (events.empty()) return absl::OkStatus();
    absl::MutexLock lock(&mu_);
    return InTransaction([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
      Statement ins(db_, "INSERT INTO events(unix_ms, kind, detail) VALUES(?,?,?)");
      MUSTER_RETURN_IF_ERROR(ins.status());
      for (const JobEvent& e : events) {
        ins.Bind(1, ToMs(e.time));
        ins.Bind(2, e.kind);
        ins.Bind(3, e.detail);
        MUSTER_RETURN_IF_ERROR(ins.Run());
      }
      return absl::OkStatus();
    });
  }

  absl::StatusOr<Lease> ReadLease() override {
    absl::MutexLock lock(&mu_);
    return ReadLeaseLocked();
  }

  absl::StatusOr<Lease> TakeLease(const Lease& seen, const std::string& holder) override {
    absl::MutexLock lock(&mu_);
    Lease taken;
    absl::Status s = InTransaction([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
      MUSTER_ASSIGN_OR_RETURN(Lease now, ReadLeaseLocked());
      if (now.epoch != seen.epoch || now.beats != seen.beats) {
        return absl::AbortedError(absl::StrCat("the lease moved on meanwhile: epoch ", now.epoch,
                                               ", held by ", now.holder));
      }
      Statement up(db_,
                   "INSERT OR REPLACE INTO lease(id, epoch, holder, beats) VALUES(1, ?, ?, 0)");
      MUSTER_RETURN_IF_ERROR(up.status());
      taken = Lease{seen.epoch + 1, holder, 0};
      up.Bind(1, static_cast<int64_t>(taken.epoch));
      up.Bind(2, holder);
      return up.Run();
    });
    MUSTER_RETURN_IF_ERROR(s);
    fence_epoch_ = taken.epoch;
    return taken;
  }

  void CompactJournal() override {
    absl::MutexLock lock(&mu_);
    CompactJournalLocked();
  }

  absl::Status RenewLease(uint64_t epoch) override {
    absl::MutexLock lock(&mu_);
    // A job that trains for days without a regroup still writes its lease
    // every few seconds: the log stays short.
    CompactJournalLocked();
    return InTransaction([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
      Statement up(db_, "UPDATE lease SET beats = beats + 1 WHERE id = 1 AND epoch = ?");
      MUSTER_RETURN_IF_ERROR(up.status());
      up.Bind(1, static_cast<int64_t>(epoch));
      MUSTER_RETURN_IF_ERROR(up.Run());
      if (sqlite3_changes(db_) == 1) return absl::OkStatus();
      MUSTER_ASSIGN_OR_RETURN(Lease now, ReadLeaseLocked());
      return LeaseTakenOver(epoch, now);
    });
  }

  absl::Status ReleaseLease(uint64_t epoch) override {
    absl::MutexLock lock(&mu_);
    Statement up(db_, "UPDATE lease SET holder = '' WHERE id = 1 AND epoch = ?");
    MUSTER_RETURN_IF_ERROR(up.status());
    up.Bind(1, static_cast<int64_t>(epoch));
    MUSTER_RETURN_IF_ERROR(up.Run());
    return SyncLog();
  }

  absl::StatusOr<std::vector<JobEvent>> LoadEvents(size_t limit) override {
    absl::MutexLock lock(&mu_);
    Statement q(db_,
                "SELECT unix_ms, kind, detail FROM (SELECT id, unix_ms, kind, detail "
                "FROM events ORDER BY id DESC LIMIT ?) ORDER BY id");
    MUSTER_RETURN_IF_ERROR(q.status());
    q.Bind(1, static_cast<int64_t>(limit));
    std::vector<JobEvent> out;
    int rc;
    while ((rc = q.Step()) == SQLITE_ROW) {
      out.push_back(JobEvent{FromMs(q.Int(0)), q.Text(1), q.Text(2)});
    }
    MUSTER_RETURN_IF_ERROR(ReadEnded(rc, "events"));
    return out;
  }

 private:
  absl::Status Exec(const char* sql) {
    char* err = nullptr;
    if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
      absl::Status s = absl::UnavailableError(
          absl::StrCat("sqlite: ", err != nullptr ? err : "unknown error"));
      sqlite3_free(err);
      return s;
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Lease> ReadLeaseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Statement q(db_, "SELECT epoch, holder, beats FROM lease WHERE id = 1");
    MUSTER_RETURN_IF_ERROR(q.status());
    Lease lease;
    const int rc = q.Step();
    if (rc == SQLITE_ROW) {
      lease.epoch = static_cast<uint64_t>(q.Int(0));
      lease.holder = q.Text(1);
      lease.beats = static_cast<uint64_t>(q.Int(2));
      return lease;
    }
    MUSTER_RETURN_IF_ERROR(ReadEnded(rc, "lease"));
    return lease;
  }
  // Runs `fn` in one write transaction; once a lease was taken, only while
  // this coordinator still holds it (checked under the write lock, so no
  // write of an older epoch commits after a takeover).
  template <typename Fn>
  absl::Status InTransaction(Fn fn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    MUSTER_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
    absl::Status s = absl::OkStatus();
    if (fence_epoch_ != 0) {
      absl::StatusOr<Lease> now = ReadLeaseLocked();
      if (!now.ok()) {
        s = now.status();
      } else if (now->epoch != fence_epoch_) {
        s = LeaseTakenOver(fence_epoch_, *now);
      }
    }
    if (s.ok()) s = fn();
    if (!s.ok()) {
      Exec("ROLLBACK").IgnoreError();
      return s;
    }
    s = Exec("COMMIT");
    if (!s.ok()) {
      Exec("ROLLBACK").IgnoreError();
      return s;
    }
    return SyncLog();
  }

  // A commit in WAL mode writes the log but does not sync it: it is synced
  // here, after SQLite's write lock was given back and before the caller
  // hears that its write is on disk. A holder whose disk stalls in that
  // sync, or that hangs there, keeps nobody else from writing, so a standby
  // can take the lease over meanwhile (docs/failover.md). Other connections
  // may read the commit before it is synced: they are on this host (WAL
  // needs shared memory), and lose it with the host only. A failed sync is
  // the caller's failed write, although the commit is in the log.
  absl::Status SyncLog() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!log_synced_apart_) return absl::OkStatus();
    sqlite3_file* log = nullptr;
    if (sqlite3_file_control(db_, "main", SQLITE_FCNTL_JOURNAL_POINTER, &log) != SQLITE_OK ||
        log == nullptr || log->pMethods == nullptr) {
      return absl::InternalError("sqlite: the write-ahead log is not open after a commit");
    }
    const int rc = log->pMethods->xSync(log, SQLITE_SYNC_NORMAL);
    if (rc != SQLITE_OK) {
      return absl::UnavailableError(
          absl::StrCat("sqlite: syncing the write-ahead log: ", sqlite3_errstr(rc)));
    }
    return absl::OkStatus();
  }

  void CompactJournalLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    // As often as SQLite would have (1,000 pages, its default): each fold
    // syncs the file.
    if (log_pages_ < kFoldPages) return;
    log_pages_ = 0;
    // PASSIVE: what no reader (a standby) still needs; the rest next time.
    const int rc = sqlite3_wal_checkpoint_v2(db_, nullptr, SQLITE_CHECKPOINT_PASSIVE, nullptr,
                                             nullptr);
    if (rc != SQLITE_OK && rc != SQLITE_BUSY) {
      MUSTER_LOG(WARNING) << "state store: folding the write-ahead log: " << sqlite3_errmsg(db_);
    }
  }

  // The world's members as the value; an older file (a version 1 file's
  // rows go) becomes version 3 in the same transaction.
  absl::Status WriteMembers(const std::string& members) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Statement st(db_, "INSERT OR REPLACE INTO world(id, members) VALUES(1, ?)");
    MUSTER_RETURN_IF_ERROR(st.status());
    st.BindBlob(1, members);
    MUSTER_RETURN_IF_ERROR(st.Run());
    std::string version;
    MUSTER_RETURN_IF_ERROR(GetMeta("schema_version", &version));
    if (version == absl::StrCat(kSchemaVersion)) return absl::OkStatus();
    MUSTER_RETURN_IF_ERROR(Exec("DELETE FROM world_members"));
    return SetMeta("schema_version", absl::StrCat(kSchemaVersion));
  }

  absl::StatusOr<std::vector<Assignment>> ReadMembers() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::string version;
    MUSTER_RETURN_IF_ERROR(GetMeta("schema_version", &version));
    if (version == "1") return ReadVersion1Rows();
    Statement q(db_, "SELECT members FROM world WHERE id = 1");
    MUSTER_RETURN_IF_ERROR(q.status());
    const int rc = q.Step();
    if (rc != SQLITE_ROW) {
      MUSTER_RETURN_IF_ERROR(ReadEnded(rc, "world"));
      return std::vector<Assignment>();
    }
    return DecodeMembers(q.Blob(0), version == "2" ? 2 : 3);
  }

  // A version 1 file's world: a row per member.
  absl::StatusOr<std::vector<Assignment>> ReadVersion1Rows() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Statement q(db_,
                "SELECT rank, member_id, incarnation, node, state_address, node_rank, "
                "local_rank, local_world_size, step FROM world_members ORDER BY rank");
    MUSTER_RETURN_IF_ERROR(q.status());
    std::vector<Assignment> members;
    int rc;
    while ((rc = q.Step()) == SQLITE_ROW) {
      Assignment a;
      a.rank = static_cast<uint32_t>(q.Int(0));
      a.member.id = q.Text(1);
      a.member.incarnation = static_cast<uint64_t>(q.Int(2));
      a.node = q.Text(3);
      a.state_address = q.Text(4);
      a.node_rank = static_cast<uint32_t>(q.Int(5));
      a.local_rank = static_cast<uint32_t>(q.Int(6));
      a.local_world_size = static_cast<uint32_t>(q.Int(7));
      a.step = q.Int(8);
      members.push_back(std::move(a));
    }
    MUSTER_RETURN_IF_ERROR(ReadEnded(rc, "world_members"));
    return members;
  }

  absl::Status SetMeta(const std::string& key, const std::string& value) {
    Statement st(db_, "INSERT OR REPLACE INTO meta(key, value) VALUES(?, ?)");
    MUSTER_RETURN_IF_ERROR(st.status());
    st.Bind(1, key);
    st.Bind(2, value);
    return st.Run();
  }

  absl::Status GetMeta(const std::string& key, std::string* value) {
    Statement st(db_, "SELECT value FROM meta WHERE key = ?");
    MUSTER_RETURN_IF_ERROR(st.status());
    st.Bind(1, key);
    value->clear();
    const int rc = st.Step();
    if (rc == SQLITE_ROW) {
      *value = st.Text(0);
      return absl::OkStatus();
    }
    return ReadEnded(rc, "meta");
  }

  absl::Status GetMetaInt(const std::string& key, uint64_t* out) {
    std::string value;
    MUSTER_RETURN_IF_ERROR(GetMeta(key, &value));
    *out = 0;
    if (!value.empty() && !absl::SimpleAtoi(value, out)) {
      return absl::DataLossError(absl::StrCat("meta ", key, " is not a number: ", value));
    }
    return absl::OkStatus();
  }

  // DATA_LOSS naming what SQLite's quick_check (or opening the file at all)
  // found wrong.
  absl::Status QuickCheck() {
    Statement q(db_, "PRAGMA quick_check(5)");
    if (!q.status().ok()) return absl::DataLossError(sqlite3_errmsg(db_));
    std::vector<std::string> problems;
    int rc;
    while ((rc = q.Step()) == SQLITE_ROW) {
      if (q.Text(0) != "ok") problems.push_back(q.Text(0));
    }
    if (rc != SQLITE_DONE) problems.push_back(sqlite3_errmsg(db_));
    if (problems.empty()) return absl::OkStatus();
    return absl::DataLossError(
        absl::StrCat("quick_check: ", absl::StrJoin(problems, "; ")));
  }

  // A read that stopped with `rc` read the whole table only when rc is
  // SQLITE_DONE; anything else (a damaged page) must not pass for the end
  // of the table.
  absl::Status ReadEnded(int rc, const char* table) {
    if (rc == SQLITE_DONE) return absl::OkStatus();
    return absl::DataLossError(
        absl::StrCat("reading table ", table, " failed: ", sqlite3_errmsg(db_)));
  }

  sqlite3* db_;
  // Every public call takes it: the coordinator's writer thread and the
  // server's lease renewal share one connection.
  absl::Mutex mu_;
  // The epoch this store was fenced to by TakeLease (0: not fenced).
  uint64_t fence_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  // Pages in the write-ahead log after the last commit (the WAL hook sets
  // it inside a commit, so under mu_); CompactJournal folds from kFoldPages.
  static constexpr int kFoldPages = 1000;
  int log_pages_ = 0;
  // WAL mode: commits leave the log unsynced, and SyncLog syncs it.
  bool log_synced_apart_ = false;
};

}  // namespace

std::string NetworkFileSystemName(int64_t f_type) {
  // Magic numbers of statfs(2)'s f_type (linux/magic.h and the file
  // systems' own sources).
  switch (static_cast<uint64_t>(f_type) & 0xffffffffu) {
    case 0x6969: return "nfs";
    case 0x0bd00bd0: return "lustre";
    case 0x47504653: return "gpfs";
    case 0xff534d42: return "cifs";
    case 0xfe534d42: return "smb2";
    case 0x00c36400: return "ceph";
    case 0x19830326: return "beegfs";
    case 0x65735546: return "fuse";
    case 0x013111a8: return "ibrix";
    case 0xaad7aaea: return "panfs";
    default: return "";
  }
}

absl::StatusOr<std::unique_ptr<StateStore>> OpenSqliteStateStore(const std::string& path,
                                                                  absl::Duration sync_delay,
                                                                  JournalMode journal) {
  const char* vfs = nullptr;
  if (sync_delay > absl::ZeroDuration()) {
    MUSTER_ASSIGN_OR_RETURN(vfs, SlowSyncVfs(sync_delay));
  }
  sqlite3* db = nullptr;
  const int rc = sqlite3_open_v2(path.c_str(), &db,
                                 SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE |
                                     SQLITE_OPEN_NOMUTEX,
                                 vfs);
  if (rc != SQLITE_OK) {
    std::string msg = db != nullptr ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return absl::UnavailableError(absl::StrCat("cannot open state database ", path, ": ", msg));
  }
  sqlite3_busy_timeout(db, 5000);
  auto store = std::make_unique<SqliteStateStore>(db);
  // WAL needs memory shared between the processes that open the file, which
  // network file systems do not give: there the rollback journal, whose
  // fsyncs and byte-range locks they do.
  std::string network;
  if (path != ":memory:") {
    const std::string dir = path.rfind('/') == std::string::npos
                                ? std::string(".")
                                : path.substr(0, std::max<size_t>(1, path.rfind('/')));
    struct statfs fs;
    if (::statfs(dir.c_str(), &fs) == 0) network = NetworkFileSystemName(fs.f_type);
  }
  const bool rollback =
      journal == JournalMode::kRollback || (journal == JournalMode::kAuto && !network.empty());
  absl::Status s = store->Init(rollback);
  // Two coordinators opening a new file at once (a primary and its
  // standby): switching it to WAL takes a lock SQLite does not wait for.
  // Init is idempotent; try again for a while.
  for (int i = 0; i < 100 && absl::IsUnavailable(s) &&
                  absl::StrContains(s.message(), "database is locked");
       ++i) {
    absl::SleepFor(absl::Milliseconds(50));
    s = store->Init(rollback);
  }
  if (absl::IsDataLoss(s)) {
    return absl::DataLossError(absl::StrCat(
        "state database ", path, " is damaged (", s.message(),
        "); move it aside and start again: the checkpoint catalog can be rebuilt from the "
        "checkpoints' manifest.json files with --rebuild-catalog=CHECKPOINT_DIR"));
  }
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat("state database ", path, ": ", s.message()));
  }
  if (path != ":memory:") {
    MUSTER_LOG(INFO) << "state database " << path << ": "
                     << (rollback ? "rollback journal" : "WAL journal")
                     << (network.empty() ? "" : absl::StrCat(" (on ", network, ")"));
  }
  return std::unique_ptr<StateStore>(std::move(store));
}

}  // namespace muster
