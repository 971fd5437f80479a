// ProgressReporter: what rank 0 shows of a run — a progress line (to
// ProgressOptions::output) every `log_every` steps (step, epoch, loss, learning rate, samples/s,
// ETA), the same figures in JSON lines (LOG_DIR/metrics.jsonl) and
// TensorBoard event files (LOG_DIR/events.out.tfevents.*), and a line for
// every world entered. Other ranks keep only the loss average. Rank 0 is the
// current world's: a member that becomes rank 0 at a world change appends to
// metrics.jsonl and opens an event file of its own; one that stops being
// rank 0 stops writing, so every record is written once. The files'
// wall_time is the wall clock's (a record); rates and the ETA are timed on
// the monotonic clock.
//
// Thread-safety: training thread only.
#ifndef MUSTER_TRAINER_ELASTIC_PROGRESS_REPORTER_H_
#define MUSTER_TRAINER_ELASTIC_PROGRESS_REPORTER_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "muster/options.h"
#include "trainer/elastic/event_writer.h"

namespace muster {

struct ProgressOptions {
  // Where rank 0's world and progress lines go; empty: nowhere.
  std::function<void(std::string_view)> output;
  int64_t log_every = 20;
  std::string log_dir;      // "" = no files
  std::string model_name;   // for the world line
  int batch_per_rank = 0;
  // Times the rates and the ETA (Now()) and stamps the records (WallNow()).
  // Required, not owned, must outlive the reporter.
  Clock* clock = nullptr;
};

class ProgressReporter {
 public:
  // `rank`: this member's in its first world.
  // Errors: INVALID_ARGUMENT (no clock); the log directory or its files
  // cannot be created where `rank` is 0.
  static absl::StatusOr<std::unique_ptr<ProgressReporter>> Create(ProgressOptions options,
                                                                  int rank);

  // A world was entered: the files are written from here on only where
  // p.rank is 0 (opened now, if this member was not rank 0 before; a file
  // that cannot be opened then is logged and skipped, training goes on).
  void WorldEntered(const Progress& p, const std::string& backend, int node_count);
  void RecordLoss(double loss);
  // After a committed step: the progress line and the metrics, when due.
  // `lrs`: each parameter group's learning rate (may be empty).
  // `grad_norm`: the step's gradient norm before clipping
  // (Options::clip_grad_norm), written as "grad_norm" where it is not NaN.
  void StepDone(const Progress& p, const std::vector<double>& lrs, double grad_norm);
  void Scalars(int64_t step, const std::map<std::string, double>& values);
  double last_loss() const { return last_loss_; }

 private:
  explicit ProgressReporter(ProgressOptions options)
      : options_(std::move(options)), interval_start_(options_.clock->Now()) {}

  absl::Status OpenFiles();

  const ProgressOptions options_;
  bool writes_ = false;  // rank 0 of the current world
  std::unique_ptr<JsonLinesWriter> jsonl_;
  std::unique_ptr<EventWriter> events_;
  // Samples per second and the ETA: monotonic time.
  absl::Time interval_start_;
  int64_t interval_samples_ = 0;
  double loss_sum_ = 0, last_loss_ = 0;
  int64_t loss_count_ = 0;
};

}  // namespace muster

#endif  // MUSTER_TRAINER_ELASTIC_PROGRESS_REPORTER_H_
