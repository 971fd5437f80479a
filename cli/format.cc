#include "cli/format.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"

namespace muster {
namespace {

// Left-aligned columns sized to their widest cell.
std::string Table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& row : rows) {
    width.resize(std::max(width.size(), row.size()));
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      absl::StrAppend(&line, row[i]);
      if (i + 1 < row.size()) line.append(width[i] - row[i].size() + 2, ' ');
    }
    absl::StrAppend(&out, line, "\n");
  }
  return out;
}

std::string Bytes(uint64_t b) {
  if (b >= (1ull << 30)) return absl::StrFormat("%.1f GiB", b / double(1ull << 30));
  if (b >= (1ull << 20)) return absl::StrFormat("%.1f MiB", b / double(1ull << 20));
  if (b >= (1ull << 10)) return absl::StrFormat("%.1f KiB", b / double(1ull << 10));
  return absl::StrCat(b, " B");
}

std::string StateName(v1::Checkpoint::State s) {
  switch (s) {
    case v1::Checkpoint::PENDING: return "pending";
    case v1::Checkpoint::COMMITTED: return "committed";
    case v1::Checkpoint::ABORTED: return "aborted";
    case v1::Checkpoint::RETIRED: return "retired";
    default: return "unknown";
  }
}

}  // namespace

std::string FormatStatus(const v1::GetStatusResponse& s) {
  std::string out = absl::StrCat(
      "job ", s.job_state(), "  generation ", s.generation(), "  world ", s.world_size(),
      " (min ", s.min_members(), ", max ", s.max_members(), ")  committed checkpoints ",
      s.committed_checkpoints());
  if (s.latest_committed_step() >= 0) {
    absl::StrAppend(&out, " (latest step ", s.latest_committed_step(), ")");
  }
  absl::StrAppend(&out, "  uptime ",
                  absl::FormatDuration(absl::Seconds(s.uptime_ms() / 1000)), "\n");
  if (s.members().empty()) return absl::StrCat(out, "no members\n");
  std::vector<std::vector<std::string>> rows = {
      {"MEMBER", "INCARNATION", "NODE", "LOCAL", "STATE", "RANK", "STEP", "HEARTBEAT"}};
  for (const v1::MemberStatus& m : s.members()) {
    rows.push_back({m.member().member_id(), absl::StrCat(m.member().incarnation()), m.node(),
                    absl::StrCat(m.local_rank()), m.state(),
                    m.rank() < 0 ? "-" : absl::StrCat(m.rank()), absl::StrCat(m.step()),
                    absl::StrFormat("%.1fs ago", m.heartbeat_age_ms() / 1000.0)});
  }
  return absl::StrCat(out, Table(rows));
}

std::string FormatCheckpoints(const v1::ListCheckpointsResponse& list) {
  if (list.checkpoints().empty()) return "no checkpoints\n";
  std::vector<std::vector<std::string>> rows = {
      {"ID", "STEP", "GENERATION", "WORLD", "STATE", "TIME (UTC)", "SIZE", "FILES"}};
  for (const v1::Checkpoint& c : list.checkpoints()) {
    const int64_t ms = c.committed_unix_ms() != 0 ? c.committed_unix_ms() : c.created_unix_ms();
    std::vector<std::string> files;
    for (const v1::ShardFile& f : c.files()) files.push_back(f.path());
    rows.push_back({absl::StrCat(c.checkpoint_id()), absl::StrCat(c.step()),
                    absl::StrCat(c.generation()), absl::StrCat(c.world_size()),
                    StateName(c.state()),
                    absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixMillis(ms),
                                     absl::UTCTimeZone()),
                    Bytes(c.total_bytes()),
                    files.empty() ? "-" : absl::StrJoin(files, ",")});
  }
  return Table(rows);
}

std::string FormatWorld(const v1::GetWorldResponse& world) {
  const v1::World& w = world.world();
  std::string out = absl::StrFormat(
      "generation %d: %d members on %d nodes, state source rank %d (step %d), digest %016x\n",
      w.generation(), w.world_size(), w.node_count(), w.state_source_rank(), w.state_step(),
      w.digest());
  std::vector<std::vector<std::string>> rows = {
      {"RANK", "NODE", "LOCAL", "MEMBER", "INCARNATION", "STEP", "STATE SERVICE"}};
  for (const v1::Assignment& a : world.members()) {
    rows.push_back({absl::StrCat(a.rank()), a.node(),
                    absl::StrCat(a.local_rank(), "/", a.local_world_size()),
                    a.member().member_id(), absl::StrCat(a.member().incarnation()),
                    absl::StrCat(a.step()), a.state_address().empty() ? "-" : a.state_address()});
  }
  return absl::StrCat(out, Table(rows));
}

std::string FormatEvents(const v1::ListEventsResponse& events) {
  std::string out;
  for (const v1::Event& e : events.events()) {
    absl::StrAppend(&out,
                    absl::FormatTime("%Y-%m-%d %H:%M:%E3S", absl::FromUnixMillis(e.unix_ms()),
                                     absl::UTCTimeZone()),
                    "  ", absl::StrFormat("%-10s", e.kind()), "  ", e.detail(), "\n");
  }
  return out;
}

absl::StatusOr<int64_t> ParseSince(const std::string& text, absl::Time now) {
  if (text.empty()) return 0;
  absl::Duration ago;
  if (absl::ParseDuration(text, &ago)) {
    if (ago < absl::ZeroDuration()) {
      return absl::InvalidArgumentError(absl::StrCat("--since ", text, " is negative"));
    }
    return absl::ToUnixMillis(now - ago);
  }
  absl::Time t;
  std::string err;
  if (absl::ParseTime(absl::RFC3339_full, text, &t, &err)) return absl::ToUnixMillis(t);
  return absl::InvalidArgumentError(
      absl::StrCat("--since ", text, ": neither a duration (10m, 2h) nor an RFC 3339 time "
                   "(2026-11-23T17:00:00Z)"));
}

}  // namespace muster
