// Coordinator: the KV store and barriers of the current generation, and the
// checkpoint catalog.
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "coordinator/coordinator.h"

namespace muster {

absl::Status Coordinator::KvSet(uint64_t generation, const std::string& key,
                                std::string value) {
  Decision decision(&mu_, durable_);
  Actions& actions = decision.actions();
  MUSTER_RETURN_IF_ERROR(gen_.CheckGeneration(generation));
  return kv_.Set(key, std::move(value), &actions);
}

void Coordinator::KvGet(uint64_t generation, std::vector<std::string> keys,
                        absl::Duration wait, KvCallback done) {
  Decision decision(&mu_, durable_);
  Actions& actions = decision.actions();
  absl::Status s = gen_.CheckGeneration(generation);
  if (!s.ok()) {
    actions.Add([done = std::move(done), s] { done(s); });
    return;
  }
  wait = CapWait(wait);
  if (wait == absl::ZeroDuration()) {
    auto values = kv_.Get(keys);
    actions.Add([done = std::move(done), values = std::move(values)] { done(values); });
    return;
  }
  kv_.Wait(std::move(keys), clock_->Now() + wait, std::move(done), &actions);
}

absl::StatusOr<int64_t> Coordinator::KvAdd(uint64_t generation, const std::string& key,
                                           int64_t delta) {
  Decision decision(&mu_, durable_);
  Actions& actions = decision.actions();
  MUSTER_RETURN_IF_ERROR(gen_.CheckGeneration(generation));
  return kv_.Add(key, delta, &actions);
}

absl::StatusOr<CasResult> Coordinator::KvCompareAndSet(
    uint64_t generation, const std::string& key, const std::optional<std::string>& expected,
    std::string desired) {
  Decision decision(&mu_, durable_);
  Actions& actions = decision.actions();
  MUSTER_RETURN_IF_ERROR(gen_.CheckGeneration(generation));
  return kv_.CompareAndSet(key, expected, std::move(desired), &actions);
}

void Coordinator::Barrier(uint64_t generation, const MemberKey& key, const std::string& name,
                          absl::Duration timeout, DoneCallback done) {
  Decision decision(&mu_, durable_);
  Actions& actions = decision.actions();
  absl::Status s = gen_.CheckGeneration(generation);
  if (s.ok()) s = CheckName("name", name, options_.limits.max_id_bytes);
  if (s.ok()) s = LiveMember(key).status();
  const World& world = gen_.world();
  if (s.ok() && world.RankOf(key.id) < 0) {
    s = absl::PermissionDeniedError(
        absl::StrCat("member ", key.id, " is not part of generation ", generation));
  }
  if (!s.ok()) {
    actions.Add([done = std::move(done), s] { done(s); });
    return;
  }
  barriers_.Arrive(name, key.id, world.size(), clock_->Now() + CapWait(timeout),
                   std::move(done), &actions);
}

// ---------------------------------------------------------------- catalog

absl::StatusOr<uint64_t> Coordinator::BeginCheckpoint(uint64_t generation,
                                                      const MemberKey& key, int64_t step) {
  absl::StatusOr<uint64_t> id = DecideBeginCheckpoint(generation, key, step);
  if (id.ok()) MUSTER_RETURN_IF_ERROR(AwaitDurable());
  return id;
}

absl::StatusOr<uint64_t> Coordinator::DecideBeginCheckpoint(uint64_t generation,
                                                            const MemberKey& key, int64_t step) {
  absl::MutexLock lock(&mu_);
  MUSTER_RETURN_IF_ERROR(CheckServing());
  MUSTER_RETURN_IF_ERROR(gen_.CheckGeneration(generation));
  MUSTER_RETURN_IF_ERROR(LiveMember(key).status());
  const World& world = gen_.world();
  if (world.RankOf(key.id) < 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("member ", key.id, " is not part of generation ", generation));
  }
  std::vector<std::string> members;
  for (const Assignment& a : world.members) members.push_back(a.member.id);
  return catalog_.Begin(generation, step, members, clock_->WallNow());
}

absl::StatusOr<bool> Coordinator::ReportShard(uint64_t id, const MemberKey& key,
                                              ShardReport report) {
  absl::StatusOr<bool> committed = DecideReportShard(id, key, std::move(report));
  // "committed" is said only once it is on disk.
  if (committed.ok()) MUSTER_RETURN_IF_ERROR(AwaitDurable());
  return committed;
}

absl::StatusOr<bool> Coordinator::DecideReportShard(uint64_t id, const MemberKey& key,
                                                    ShardReport report) {
  absl::MutexLock lock(&mu_);
  MUSTER_RETURN_IF_ERROR(CheckServing());
  MUSTER_RETURN_IF_ERROR(LiveMember(key).status());
  report.member = key.id;
  MUSTER_ASSIGN_OR_RETURN(bool committed, catalog_.Report(id, report, clock_->WallNow()));
  if (committed) {
    ++counters_.checkpoints_committed;
    const CheckpointRecord* r = catalog_.LatestCommitted();
    if (r != nullptr && r->id == id) {
      uint64_t bytes = 0;
      for (const ShardFileRecord& f : r->files) bytes += f.bytes;
      CoordinatorCounters::Keep(&counters_.checkpoint_seconds,
                                absl::ToDoubleSeconds(r->committed - r->created));
      CoordinatorCounters::Keep(&counters_.checkpoint_bytes, static_cast<double>(bytes));
      ++counters_.checkpoints_timed;
    }
    Record("checkpoint", absl::StrCat("checkpoint ", id, " committed",
                                      r != nullptr ? absl::StrCat(" (latest step ", r->step, ")")
                                                   : std::string()));
  }
  return committed;
}

absl::Status Coordinator::AbortCheckpoint(uint64_t id, const MemberKey& key,
                                          const std::string& reason) {
  MUSTER_RETURN_IF_ERROR(CheckOptional("reason", reason, options_.limits.max_reason_bytes));
  {
    absl::MutexLock lock(&mu_);
    MUSTER_RETURN_IF_ERROR(CheckServing());
    MUSTER_RETURN_IF_ERROR(LiveMember(key).status());
    MUSTER_RETURN_IF_ERROR(catalog_.Abort(id, absl::StrCat(key.id, ": ", reason)));
    Record("checkpoint", absl::StrCat("checkpoint ", id, " aborted by ", key.id, ": ", reason));
  }
  return AwaitDurable();
}

std::vector<CheckpointRecord> Coordinator::ListCheckpoints(bool all) {
  absl::MutexLock lock(&mu_);
  return catalog_.List(all);
}

}  // namespace muster
