#include "trainer/elastic/catalog_checkpointer.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/checkpoint_manifest.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "trainer/checkpoint/optimizer_shard_files.h"
#include "trainer/comm/values.h"

namespace muster {
namespace {

constexpr absl::Duration kCallTimeout = absl::Seconds(30);

// A CoordinatorClient call's deadline, `timeout` from now on `clock`, the
// client's.
absl::Time CallDeadline(Clock* clock, absl::Duration timeout) { return clock->Now() + timeout; }

// Removes the step-<S> directories of checkpoints older than `at_step` that
// the catalog no longer keeps.
void ApplyRetention(CoordinatorClient* client, Clock* clock, FileSystem* fs,
                    const std::string& dir, int64_t at_step) {
  auto kept = client->ListCommitted(CallDeadline(clock, kCallTimeout));
  auto names = fs->ListDir(dir);
  if (!kept.ok() || !names.ok()) {
    MUSTER_LOG(WARNING) << "retention skipped: " << (kept.ok() ? names.status() : kept.status());
    return;
  }
  for (const std::string& name : *names) {
    int64_t s = -1;
    if (!ParseStepDirName(name, &s)) continue;
    bool keep = s >= at_step;
    for (const CatalogEntry& e : *kept) keep |= e.step == s;
    if (!keep) fs->RemoveAll(dir + "/" + name).IgnoreError();
  }
}

// The shard files of a world, by rank, from TakeSharded's exchange:
// `words` holds, for each rank, a flag, the file's size and its checksum.
std::vector<FileReport> ShardFiles(const std::string& step_dir, const std::vector<int64_t>& words) {
  const int world = static_cast<int>(words.size() / 3);
  std::vector<FileReport> files;
  for (int r = 0; r < world; ++r) {
    files.push_back({absl::StrCat(step_dir, "/", ShardFileName(r, world)),
                     static_cast<uint64_t>(words[3 * r + 1]),
                     absl::StrFormat("%016x", static_cast<uint64_t>(words[3 * r + 2]))});
  }
  return files;
}

}  // namespace

CatalogCheckpointer::CatalogCheckpointer(CatalogCheckpointerOptions options, TrainingState state)
    : options_(std::move(options)),
      fs_(options_.fs != nullptr ? options_.fs : DefaultFileSystem()),
      checkpointer_(options_.dir, std::move(state), options_.clock, fs_),
      clock_(options_.clock),
      last_(clock_->Now()) {}

absl::StatusOr<CheckpointMeta> CatalogCheckpointer::Resume(CoordinatorClient* client,
                                                           std::vector<ShardFileRef>* deferred) {
  MUSTER_ASSIGN_OR_RETURN(std::vector<CatalogEntry> committed,
                          client->ListCommitted(CallDeadline(clock_, absl::Seconds(60))));
  for (const CatalogEntry& entry : committed) {
    std::vector<FileReport> files;
    for (const CatalogFile& f : entry.files) files.push_back({f.path, f.bytes, f.xxh3});
    absl::StatusOr<CheckpointMeta> meta = LoadCheckpoint(files, checkpointer_.state(), fs_, deferred);
    if (meta.ok()) {
      outcome_->Committed(meta->step);
      return meta;
    }
    MUSTER_LOG(WARNING) << "checkpoint of step " << entry.step << " is unusable ("
                        << meta.status() << "); trying the previous one";
  }
  // None does (a coordinator started without the --state-dir it had lists
  // none): the finished checkpoints of the directory, by their manifests.
  for (const int64_t step : FinishedSteps()) {
    const std::string dir = checkpointer_.StepDir(step);
    absl::StatusOr<CheckpointMeta> meta = LoadOnDisk(dir, step, deferred);
    if (meta.ok()) {
      outcome_->Committed(meta->step);
      MUSTER_LOG(WARNING) << "resuming from " << dir << ", which the coordinator's catalog "
                          << "does not offer: its manifest names every file, and each one's "
                          << "checksum verifies (a coordinator started without the --state-dir "
                          << "it had?)";
      return meta;
    }
    MUSTER_LOG(WARNING) << dir << " is unusable (" << meta.status() << "); trying the previous one";
  }
  return absl::NotFoundError("no committed checkpoint verifies");
}

std::vector<int64_t> CatalogCheckpointer::FinishedSteps() const {
  std::vector<int64_t> steps;
  absl::StatusOr<std::vector<std::string>> names = fs_->ListDir(options_.dir);
  if (!names.ok()) return steps;  // not made yet
  for (const std::string& name : *names) {
    int64_t step = -1;
    if (ParseStepDirName(name, &step) &&
        fs_->Stat(absl::StrCat(options_.dir, "/", name, "/", kManifestName)).ok()) {
      steps.push_back(step);
    }
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

absl::StatusOr<CheckpointMeta> CatalogCheckpointer::LoadOnDisk(
    const std::string& dir, int64_t step, std::vector<ShardFileRef>* deferred) const {
  MUSTER_ASSIGN_OR_RETURN(const CheckpointOnDisk found, ReadCheckpointOnDisk(fs_, dir));
  if (found.manifest.meta.step != step) {
    return absl::DataLossError(
        absl::StrCat("its manifest says step ", found.manifest.meta.step, " (moved or renamed?)"));
  }
  std::vector<FileReport> files;
  for (const CheckpointOnDisk::File& f : found.files) files.push_back({f.path, f.bytes, f.xxh3});
  return LoadCheckpoint(files, checkpointer_.state(), fs_, deferred);
}

absl::Status CatalogCheckpointer::RefuseCheckpointsNotOffered() const {
  const std::vector<int64_t> steps = FinishedSteps();
  if (steps.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "checkpoint_dir ", options_.dir, " holds finished checkpoints (the newest: step-",
      steps.front(), ") that this run did not resume from and would write over from step 0. ",
      "Repair or move them, or give a coordinator whose catalog lists them (the --state-dir it ",
      "had, or --rebuild-catalog=", options_.dir, " on a new one); to start afresh, give an ",
      "empty checkpoint_dir"));
}

bool CatalogCheckpointer::DueAtStep(int64_t step) const {
  return options_.every_steps > 0 && step % options_.every_steps == 0;
}

bool CatalogCheckpointer::DueByTime() const {
  return options_.interval_seconds > 0 &&
         clock_->Now() - last_ >= absl::Seconds(options_.interval_seconds);
}

void CatalogCheckpointer::Outcome::Set(absl::Status s) {
  absl::MutexLock lock(&mu);
  last = std::move(s);
}

void CatalogCheckpointer::Outcome::Committed(int64_t step) {
  absl::MutexLock lock(&mu);
  newest_committed = std::max(newest_committed, step);
}

int CatalogCheckpointer::committed() const {
  absl::MutexLock lock(&outcome_->mu);
  return outcome_->committed;
}

int64_t CatalogCheckpointer::newest_committed() const {
  absl::MutexLock lock(&outcome_->mu);
  return outcome_->newest_committed;
}

absl::Status CatalogCheckpointer::Wait() {
  checkpointer_.Wait().IgnoreError();  // the callback has put the write's error in `last`
  absl::MutexLock lock(&outcome_->mu);
  return outcome_->last;
}

absl::Status CatalogCheckpointer::Take(CoordinatorClient* client, int rank, CheckpointMeta meta,
                                       absl::Duration call_timeout) {
  last_ = clock_->Now();
  outcome_->Set(absl::OkStatus());
  const int64_t step = meta.step;
  absl::StatusOr<uint64_t> id =
      client->BeginCheckpoint(meta.generation, step, CallDeadline(clock_, call_timeout));
  if (absl::IsAlreadyExists(id.status())) {  // committed before (a stop right after a resume)
    outcome_->Committed(step);
    return absl::OkStatus();
  }
  absl::Status s = id.status();
  if (s.ok() && rank != 0) {
    absl::StatusOr<bool> done = client->ReportShard(*id, {}, CallDeadline(clock_, call_timeout));
    if (done.ok() && *done) outcome_->Committed(step);
    s = done.status();
  }
  if (s.ok() && rank == 0) {
    s = Write(client, *id, std::move(meta), {}, call_timeout);
    if (!s.ok()) {
      client->AbortCheckpoint(*id, std::string(s.message()), CallDeadline(clock_, call_timeout))
          .IgnoreError();
    }
  }
  if (!s.ok()) {
    s = absl::Status(s.code(), absl::StrCat("checkpoint of step ", step, ": ", s.message()));
  }
  outcome_->Set(s);
  return s;
}

// Rank 0: snapshot, then write and report in the background.
absl::Status CatalogCheckpointer::Write(CoordinatorClient* client, uint64_t id,
                                        CheckpointMeta meta, std::vector<FileReport> shard_files,
                                        absl::Duration call_timeout) {
  meta.model = options_.model_name;
  meta.optimizer = options_.optimizer_name;
  const int64_t step = meta.step;
  return checkpointer_.Snapshot(
      meta, std::move(shard_files),
      [client, id, step, call_timeout, clock = clock_, fs = fs_, dir = options_.dir,
       outcome = outcome_](absl::StatusOr<std::vector<FileReport>> files,
                           CheckpointTiming timing) {
        if (!files.ok()) {
          client->AbortCheckpoint(id, std::string(files.status().message()),
                                  CallDeadline(clock, call_timeout)).IgnoreError();
          outcome->Set(absl::Status(files.status().code(),
                                    absl::StrCat("checkpoint of step ", step, " not written: ",
                                                 files.status().message())));
          return;
        }
        std::vector<CatalogFile> report;
        for (const FileReport& f : *files) report.push_back({f.path, f.bytes, f.xxh3});
        absl::StatusOr<bool> done =
            client->ReportShard(id, report, CallDeadline(clock, call_timeout));
        if (!done.ok()) {
          MUSTER_LOG(WARNING) << "checkpoint of step " << step << " not reported: " << done.status();
          outcome->Set(absl::Status(done.status().code(),
                                    absl::StrCat("checkpoint of step ", step, " not reported: ",
                                                 done.status().message())));
          return;
        }
        {
          absl::MutexLock lock(&outcome->mu);
          ++outcome->committed;
        }
        if (*done) outcome->Committed(step);
        MUSTER_LOG(INFO) << "checkpoint of step " << step << " written (" << timing.bytes / 1e6
                         << " MB, blocking " << timing.blocking_seconds << " s, write "
                         << timing.write_seconds << " s)";
        ApplyRetention(client, clock, fs, dir, step);
      });
}

absl::StatusOr<FileReport> CatalogCheckpointer::WriteOwnShard(
    int64_t step, const absl::StatusOr<OwnShardState>& own, int rank, int world) {
  if (!own.ok()) return own.status();
  if (own->shard != rank || own->world != world) {
    return absl::FailedPreconditionError(absl::StrCat("this rank (", rank, " of ", world,
                                                      ") holds shard ", own->shard, " of ",
                                                      own->world));
  }
  const std::string dir = checkpointer_.StepDir(step);
  MUSTER_RETURN_IF_ERROR(fs_->CreateDir(options_.dir));
  MUSTER_RETURN_IF_ERROR(fs_->CreateDir(dir));
  const std::string path = absl::StrCat(dir, "/", ShardFileName(rank, world));
  MUSTER_ASSIGN_OR_RETURN(WrittenFile written,
                          WriteShardFile(fs_, path, rank, world, own->groups));
  return FileReport{path, written.bytes, written.xxh3};
}

absl::StatusOr<bool> CatalogCheckpointer::TakeSharded(CoordinatorClient* client,
                                                      Communicator* comm, int rank,
                                                      CheckpointMeta meta,
                                                      const absl::StatusOr<OwnShardState>& own,
                                                      absl::Time deadline,
                                                      absl::Duration call_timeout) {
  last_ = clock_->Now();
  outcome_->Set(absl::OkStatus());
  const int64_t step = meta.step;
  const int world = comm->size();
  absl::StatusOr<uint64_t> id =
      client->BeginCheckpoint(meta.generation, step, CallDeadline(clock_, call_timeout));
  // Each rank's slot: 1 and its file's size and checksum once written, 2
  // when the catalog already holds the step committed, 0 when it failed.
  constexpr int64_t kWritten = 1, kCommittedBefore = 2;
  std::vector<int64_t> words(3 * static_cast<size_t>(world), 0);
  absl::Status s = id.status();
  if (absl::IsAlreadyExists(s)) {
    words[3 * rank] = kCommittedBefore;
  } else if (s.ok()) {
    absl::StatusOr<FileReport> mine = WriteOwnShard(step, own, rank, world);
    uint64_t sum = 0;
    if (mine.ok() && absl::SimpleHexAtoi(mine->xxh3, &sum)) {
      words[3 * rank] = kWritten;
      words[3 * rank + 1] = static_cast<int64_t>(mine->bytes);
      words[3 * rank + 2] = static_cast<int64_t>(sum);
    } else {
      s = mine.ok() ? absl::InternalError("unreadable checksum " + mine->xxh3) : mine.status();
    }
  }
  MUSTER_RETURN_IF_ERROR(AllReduceValues(comm, words.data(), words.size(), DataType::kInt64,
                                         ReduceOp::kSum, deadline));
  int before = 0, failed = -1;
  for (int r = 0; r < world; ++r) {
    if (words[3 * r] == kCommittedBefore) ++before;
    if (words[3 * r] != kWritten && words[3 * r] != kCommittedBefore && failed < 0) failed = r;
  }
  if (before == world) {  // committed before (a checkpoint right after a resume)
    outcome_->Committed(step);
    return true;
  }
  if (failed >= 0 || before > 0) {
    if (s.ok()) {
      s = absl::AbortedError(failed >= 0 ? absl::StrCat("rank ", failed,
                                                        " could not write its optimizer shard")
                                         : std::string("the ranks disagree on whether it exists"));
    }
    s = absl::Status(s.code(), absl::StrCat("checkpoint of step ", step, ": ", s.message()));
    if (rank == 0 && id.ok()) {
      client->AbortCheckpoint(*id, std::string(s.message()), CallDeadline(clock_, call_timeout))
          .IgnoreError();
      fs_->RemoveAll(checkpointer_.StepDir(step)).IgnoreError();
    }
    MUSTER_LOG(WARNING) << s << "; skipped";
    outcome_->Set(s);
    return false;
  }
  if (rank != 0) {
    absl::StatusOr<bool> done = client->ReportShard(*id, {}, CallDeadline(clock_, call_timeout));
    if (done.ok() && *done) outcome_->Committed(step);
    s = done.status();
  } else {
    s = Write(client, *id, std::move(meta), ShardFiles(checkpointer_.StepDir(step), words),
              call_timeout);
    if (!s.ok()) {
      client->AbortCheckpoint(*id, std::string(s.message()), CallDeadline(clock_, call_timeout))
          .IgnoreError();
    }
  }
  if (!s.ok()) {
    s = absl::Status(s.code(), absl::StrCat("checkpoint of step ", step, ": ", s.message()));
    MUSTER_LOG(WARNING) << s << "; skipped";
  }
  outcome_->Set(s);
  return s.ok();
}

absl::StatusOr<bool> CatalogCheckpointer::TakeToStop(CoordinatorClient* client,
                                                     Communicator* comm, int rank,
                                                     const CheckpointMeta& meta,
                                                     absl::Time deadline,
                                                     const absl::StatusOr<OwnShardState>* own) {
  constexpr int kAttempts = 2;
  constexpr absl::Duration kCallTimeout = absl::Seconds(20);
  for (int attempt = 1; attempt <= kAttempts; ++attempt) {
    absl::Status s;
    if (own != nullptr) {
      // Where it did not go ahead, Wait says what failed.
      MUSTER_RETURN_IF_ERROR(
          TakeSharded(client, comm, rank, meta, *own, deadline, kCallTimeout).status());
    } else {
      s = Take(client, rank, meta, kCallTimeout);
    }
    if (absl::Status written = Wait(); s.ok()) s = written;
    int64_t failed = s.ok() ? 0 : 1;
    MUSTER_RETURN_IF_ERROR(
        AllReduceValues(comm, &failed, 1, DataType::kInt64, ReduceOp::kSum, deadline));
    if (failed == 0) return true;
    MUSTER_LOG(WARNING) << "the checkpoint to stop at step " << meta.step
                        << " did not commit (try " << attempt << " of " << kAttempts << "): "
                        << (s.ok() ? absl::StrCat(failed, " rank(s) failed") : s.ToString());
  }
  return false;
}

int64_t CatalogCheckpointer::NewestInCatalog(CoordinatorClient* client) const {
  absl::StatusOr<std::vector<CatalogEntry>> committed =
      client->ListCommitted(CallDeadline(clock_, absl::Seconds(5)));
  if (committed.ok()) return committed->empty() ? 0 : committed->front().step;
  return std::max<int64_t>(0, newest_committed());
}

}  // namespace muster
