#include "trainer/elastic/catalog_checkpointer.h"

#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace muster {
namespace {

constexpr absl::Duration kCallTimeout = absl::Seconds(30);

// Removes the step-<S> directories of checkpoints older than `at_step` that
// the catalog no longer keeps.
void ApplyRetention(CoordinatorClient* client, FileSystem* fs, const std::string& dir,
                    int64_t at_step) {
  auto kept = client->ListCommitted(absl::Now() + kCallTimeout);
  auto names = fs->ListDir(dir);
  if (!kept.ok() || !names.ok()) {
    MUSTER_LOG(WARNING) << "retention skipped: " << (kept.ok() ? names.status() : kept.status());
    return;
  }
  for (const std::string& name : *names) {
    int64_t s = -1;
    if (name.rfind("step-", 0) != 0 || !absl::SimpleAtoi(name.substr(5), &s)) continue;
    bool keep = s >= at_step;
    for (const CatalogEntry& e : *kept) keep |= e.step == s;
    if (!keep) fs->RemoveAll(dir + "/" + name).IgnoreError();
  }
}

}  // namespace

CatalogCheckpointer::CatalogCheckpointer(CatalogCheckpointerOptions options, TrainingState state)
    : options_(std::move(options)),
      fs_(options_.fs != nullptr ? options_.fs : DefaultFileSystem()),
      checkpointer_(options_.dir, std::move(state), fs_) {}

absl::StatusOr<CheckpointMeta> CatalogCheckpointer::Resume(CoordinatorClient* client) {
  MUSTER_ASSIGN_OR_RETURN(std::vector<CatalogEntry> committed,
                          client->ListCommitted(absl::Now() + absl::Seconds(60)));
  for (const CatalogEntry& entry : committed) {
    std::vector<FileReport> files;
    for (const CatalogFile& f : entry.files) files.push_back({f.path, f.bytes, f.xxh3});
    absl::StatusOr<CheckpointMeta> meta = LoadCheckpoint(files, checkpointer_.state(), fs_);
    if (meta.ok()) return meta;
    MUSTER_LOG(WARNING) << "checkpoint of step " << entry.step << " is unusable ("
                        << meta.status() << "); trying the previous one";
  }
  return absl::NotFoundError("no committed checkpoint verifies");
}

bool CatalogCheckpointer::Due(int64_t step) const {
  return (options_.every_steps > 0 && step % options_.every_steps == 0) ||
         (options_.interval_seconds > 0 &&
          absl::Now() - last_ >= absl::Seconds(options_.interval_seconds));
}

absl::Status CatalogCheckpointer::Take(CoordinatorClient* client, int rank, CheckpointMeta meta) {
  last_ = absl::Now();
  absl::StatusOr<uint64_t> id =
      client->BeginCheckpoint(meta.generation, meta.step, absl::Now() + kCallTimeout);
  if (!id.ok()) {
    MUSTER_LOG(WARNING) << "checkpoint of step " << meta.step << " not started: " << id.status();
    return absl::OkStatus();
  }
  if (rank != 0) {
    absl::Status s = client->ReportShard(*id, {}, absl::Now() + kCallTimeout).status();
    if (!s.ok()) MUSTER_LOG(WARNING) << "checkpoint report failed: " << s;
    return absl::OkStatus();
  }
  meta.model = options_.model_name;
  meta.optimizer = options_.optimizer_name;
  const uint64_t cid = *id;
  const int64_t step = meta.step;
  return checkpointer_.Snapshot(
      meta, [client, cid, step, fs = fs_, dir = options_.dir, committed = committed_](
                absl::StatusOr<std::vector<FileReport>> files, CheckpointTiming timing) {
        if (!files.ok()) {
          client->AbortCheckpoint(cid, std::string(files.status().message()),
                                  absl::Now() + kCallTimeout).IgnoreError();
          return;
        }
        std::vector<CatalogFile> report;
        for (const FileReport& f : *files) report.push_back({f.path, f.bytes, f.xxh3});
        absl::StatusOr<bool> done = client->ReportShard(cid, report, absl::Now() + kCallTimeout);
        if (!done.ok()) {
          MUSTER_LOG(WARNING) << "checkpoint of step " << step << " not reported: " << done.status();
          return;
        }
        ++*committed;
        MUSTER_LOG(INFO) << "checkpoint of step " << step << " written (" << timing.bytes / 1e6
                         << " MB, blocking " << timing.blocking_seconds << " s, write "
                         << timing.write_seconds << " s)";
        ApplyRetention(client, fs, dir, step);
      });
}

}  // namespace muster
