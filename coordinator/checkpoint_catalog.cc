#include "coordinator/checkpoint_catalog.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace muster {

const char* CheckpointStateName(CheckpointState state) {
  switch (state) {
    case CheckpointState::kPending: return "pending";
    case CheckpointState::kCommitted: return "committed";
    case CheckpointState::kAborted: return "aborted";
    case CheckpointState::kRetired: return "retired";
  }
  return "unknown";
}

uint64_t CheckpointRecord::total_bytes() const {
  uint64_t total = 0;
  for (const ShardFileRecord& f : files) total += f.bytes;
  return total;
}

CheckpointCatalog::CheckpointCatalog(StateStore* store, CatalogOptions options,
                                     Limits limits)
    : store_(store), options_(std::move(options)), limits_(limits) {}

absl::Status CheckpointCatalog::Load() {
  MUSTER_ASSIGN_OR_RETURN(std::vector<CheckpointRecord> records, store_->LoadCheckpoints());
  records_.clear();
  for (CheckpointRecord& r : records) {
    next_id_ = std::max(next_id_, r.id + 1);
    records_[r.id] = std::move(r);
  }
  return absl::OkStatus();
}

absl::Status CheckpointCatalog::Save(CheckpointRecord record) {
  if (writer_) {
    writer_(record);
  } else {
    MUSTER_RETURN_IF_ERROR(store_->SaveCheckpoint(record));
  }
  const uint64_t id = record.id;
  records_[id] = std::move(record);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> CheckpointCatalog::Begin(uint64_t generation, int64_t step,
                                                  const std::vector<std::string>& members,
                                                  absl::Time wall_now) {
  if (step < 0) return absl::InvalidArgumentError(absl::StrCat("step is negative (", step, ")"));
  if (members.empty()) return absl::FailedPreconditionError("the generation has no members");
  for (const auto& [id, r] : records_) {
    if (r.step != step) continue;
    if (r.state == CheckpointState::kCommitted) {
      return absl::AlreadyExistsError(
          absl::StrCat("step ", step, " is already committed as checkpoint ", id));
    }
    if (r.state == CheckpointState::kPending && r.generation == generation) return id;
  }
  CheckpointRecord r;
  r.id = next_id_;
  r.step = step;
  r.generation = generation;
  r.expected = members;
  r.created = wall_now;
  MUSTER_RETURN_IF_ERROR(Save(std::move(r)));
  return next_id_++;
}

absl::StatusOr<bool> CheckpointCatalog::Report(uint64_t id, const ShardReport& report,
                                               absl::Time wall_now) {
  auto it = records_.find(id);
  if (it == records_.end()) return absl::NotFoundError(absl::StrCat("no checkpoint ", id));
  const CheckpointRecord& current = it->second;
  switch (current.state) {
    case CheckpointState::kPending: break;
    case CheckpointState::kAborted:
      return absl::AbortedError(absl::StrCat("checkpoint ", id, " was aborted: ", current.reason));
    case CheckpointState::kCommitted:
    case CheckpointState::kRetired:
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint ", id, " is already ", CheckpointStateName(current.state)));
  }
  if (std::find(current.expected.begin(), current.expected.end(), report.member) ==
      current.expected.end()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "member ", report.member, " is not part of generation ", current.generation,
        " of checkpoint ", id));
  }
  if (report.files.size() > limits_.max_files_per_report) {
    return absl::InvalidArgumentError(absl::StrCat(
        "report names ", report.files.size(), " files; the limit is ",
        limits_.max_files_per_report));
  }
  MUSTER_RETURN_IF_ERROR(CheckOptional("metric_name", report.metric_name, limits_.max_id_bytes));
  for (const ShardFileRecord& f : report.files) {
    MUSTER_RETURN_IF_ERROR(CheckName("files.path", f.path, limits_.max_path_bytes));
    if (f.checksum.size() != 16 ||
        f.checksum.find_first_not_of("0123456789abcdef") != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "files.checksum of ", f.path, " must be 16 lower-case hex digits (xxh3-64)"));
    }
  }

  CheckpointRecord next = current;
  next.files.erase(std::remove_if(next.files.begin(), next.files.end(),
                                  [&](const ShardFileRecord& f) {
                                    return f.member == report.member;
                                  }),
                   next.files.end());
  for (ShardFileRecord f : report.files) {
    f.member = report.member;
    next.files.push_back(std::move(f));
  }
  next.reported.insert(report.member);
  if (!report.metric_name.empty()) {
    next.metric_name = report.metric_name;
    next.metric_value = report.metric_value;
  }
  const bool commit = next.reported.size() == next.expected.size();
  if (commit) {
    next.state = CheckpointState::kCommitted;
    next.committed = wall_now;
  }
  MUSTER_RETURN_IF_ERROR(Save(std::move(next)));
  if (commit) MUSTER_RETURN_IF_ERROR(ApplyRetention());
  return commit;
}

absl::Status CheckpointCatalog::Abort(uint64_t id, const std::string& reason) {
  auto it = records_.find(id);
  if (it == records_.end()) return absl::NotFoundError(absl::StrCat("no checkpoint ", id));
  if (it->second.state == CheckpointState::kAborted) return absl::OkStatus();
  if (it->second.state != CheckpointState::kPending) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", id, " is ", CheckpointStateName(it->second.state),
        "; only pending checkpoints can be aborted"));
  }
  CheckpointRecord next = it->second;
  next.state = CheckpointState::kAborted;
  next.reason = reason.substr(0, limits_.max_reason_bytes);
  return Save(std::move(next));
}

absl::Status CheckpointCatalog::AbortBefore(uint64_t generation, const std::string& reason) {
  std::vector<uint64_t> ids;
  for (const auto& [id, r] : records_) {
    if (r.state == CheckpointState::kPending && r.generation < generation) ids.push_back(id);
  }
  for (uint64_t id : ids) MUSTER_RETURN_IF_ERROR(Abort(id, reason));
  return absl::OkStatus();
}

absl::Status CheckpointCatalog::ApplyRetention() {
  if (options_.keep_last == 0) return absl::OkStatus();
  std::vector<const CheckpointRecord*> committed;
  for (const auto& [id, r] : records_) {
    if (r.state == CheckpointState::kCommitted) committed.push_back(&r);
  }
  std::sort(committed.begin(), committed.end(),
            [](const CheckpointRecord* a, const CheckpointRecord* b) {
              return a->step > b->step;
            });
  const CheckpointRecord* best = nullptr;
  if (!options_.keep_best_metric.empty()) {
    for (const CheckpointRecord* r : committed) {
      if (r->metric_name != options_.keep_best_metric) continue;
      if (best == nullptr ||
          (options_.keep_best_larger ? r->metric_value > best->metric_value
                                     : r->metric_value < best->metric_value)) {
        best = r;
      }
    }
  }
  std::vector<uint64_t> retire;
  for (size_t i = options_.keep_last; i < committed.size(); ++i) {
    if (committed[i] != best) retire.push_back(committed[i]->id);
  }
  for (uint64_t id : retire) {
    CheckpointRecord next = records_[id];
    next.state = CheckpointState::kRetired;
    MUSTER_RETURN_IF_ERROR(Save(std::move(next)));
  }
  return absl::OkStatus();
}

std::vector<CheckpointRecord> CheckpointCatalog::List(bool all) const {
  std::vector<CheckpointRecord> out;
  for (const auto& [id, r] : records_) {
    if (all || r.state == CheckpointState::kCommitted) out.push_back(r);
  }
  std::sort(out.begin(), out.end(), [](const CheckpointRecord& a, const CheckpointRecord& b) {
    return a.step != b.step ? a.step > b.step : a.id > b.id;
  });
  return out;
}

const CheckpointRecord* CheckpointCatalog::LatestCommitted() const {
  const CheckpointRecord* best = nullptr;
  for (const auto& [id, r] : records_) {
    if (r.state == CheckpointState::kCommitted && (best == nullptr || r.step > best->step)) {
      best = &r;
    }
  }
  return best;
}

size_t CheckpointCatalog::committed_count() const {
  size_t n = 0;
  for (const auto& [id, r] : records_) n += r.state == CheckpointState::kCommitted;
  return n;
}

}  // namespace muster
