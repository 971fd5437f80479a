#include "trainer/elastic/progress_reporter.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace muster {
namespace {

std::string FormatEta(double seconds) {
  const int64_t s = static_cast<int64_t>(std::max(0.0, seconds));
  return absl::StrFormat("%d:%02d", s / 60, s % 60);
}

// The records' wall_time: seconds since the Unix epoch, wall clock.
double WallSeconds(Clock* clock) { return absl::ToUnixMicros(clock->WallNow()) / 1e6; }

}  // namespace

absl::StatusOr<std::unique_ptr<ProgressReporter>> ProgressReporter::Create(
    ProgressOptions options, int rank) {
  if (options.clock == nullptr) {
    return absl::InvalidArgumentError("ProgressOptions::clock is required");
  }
  std::unique_ptr<ProgressReporter> r(new ProgressReporter(std::move(options)));
  r->writes_ = rank == 0;
  if (r->writes_) MUSTER_RETURN_IF_ERROR(r->OpenFiles());
  return r;
}

absl::Status ProgressReporter::OpenFiles() {
  if (options_.log_dir.empty() || jsonl_ != nullptr) return absl::OkStatus();
  ::mkdir(options_.log_dir.c_str(), 0755);
  MUSTER_ASSIGN_OR_RETURN(jsonl_, JsonLinesWriter::Create(options_.log_dir + "/metrics.jsonl"));
  MUSTER_ASSIGN_OR_RETURN(events_, EventWriter::Create(options_.log_dir, options_.clock));
  return absl::OkStatus();
}

void ProgressReporter::WorldEntered(const Progress& p, const std::string& backend,
                                    int node_count) {
  writes_ = p.rank == 0;
  if (writes_) {
    if (absl::Status opened = OpenFiles(); !opened.ok()) {
      MUSTER_LOG(WARNING) << "rank 0's metrics are not written: " << opened.message();
      jsonl_.reset();
      events_.reset();
    }
  }
  if (p.rank != 0 || !options_.output) return;
  // A program that names no model (Options::model_name) gets no "model".
  const std::string model =
      options_.model_name.empty() ? "" : absl::StrCat(", model ", options_.model_name);
  options_.output(
      absl::StrFormat("muster: generation %d, world %d on %d nodes, backend %s%s, batch %d "
                      "per rank (%d global), step %d",
                      p.generation, p.world_size, node_count, backend, model,
                      options_.batch_per_rank, p.global_batch, p.step));
}

void ProgressReporter::RecordLoss(double loss) {
  last_loss_ = loss;
  loss_sum_ += loss;
  ++loss_count_;
}

void ProgressReporter::StepDone(const Progress& p, const std::vector<double>& lrs,
                                double grad_norm) {
  interval_samples_ += p.global_batch;
  if (p.step % options_.log_every != 0 && p.step != p.total_steps) return;
  const double secs = absl::ToDoubleSeconds(options_.clock->Now() - interval_start_);
  const double sps = interval_samples_ / std::max(secs, 1e-9);
  const double mean_loss = loss_sum_ / std::max<int64_t>(1, loss_count_);
  const double eta = (p.total_steps - p.step) * p.global_batch / std::max(sps, 1e-9);
  if (p.rank == 0 && options_.output) {
    std::string lr = "-";
    if (!lrs.empty()) {
      lr = absl::StrJoin(lrs, ",", [](std::string* out, double r) {
        absl::StrAppend(out, absl::StrFormat("%.4g", r));
      });
    }
    options_.output(absl::StrFormat("step %d/%d  epoch %d  loss %.4f  lr %s  %.0f samples/s  ETA %s",
                                    p.step, p.total_steps, p.epoch, mean_loss, lr, sps,
                                    FormatEta(eta)));
  }
  const double now = WallSeconds(options_.clock);
  if (writes_ && jsonl_) {
    std::map<std::string, double> values = {{"loss", mean_loss}, {"samples_per_s", sps},
                                            {"epoch", static_cast<double>(p.epoch)},
                                            {"world_size", static_cast<double>(p.world_size)},
                                            {"generation", static_cast<double>(p.generation)}};
    // "lr" is the first group's; "lr_group<g>" each further group's.
    for (size_t g = 0; g < lrs.size(); ++g) {
      values[g == 0 ? std::string("lr") : absl::StrCat("lr_group", g)] = lrs[g];
    }
    if (!std::isnan(grad_norm)) values["grad_norm"] = grad_norm;
    jsonl_->Write(p.step, now, values);
  }
  if (writes_ && events_) {
    events_->Scalar("train/loss", static_cast<float>(mean_loss), p.step, now);
    events_->Scalar("train/samples_per_s", static_cast<float>(sps), p.step, now);
    if (!std::isnan(grad_norm)) {
      events_->Scalar("train/grad_norm", static_cast<float>(grad_norm), p.step, now);
    }
    events_->Flush();
  }
  interval_start_ = options_.clock->Now();
  interval_samples_ = 0;
  loss_sum_ = 0;
  loss_count_ = 0;
}

void ProgressReporter::Scalars(int64_t step, const std::map<std::string, double>& values) {
  if (!writes_) return;
  const double now = WallSeconds(options_.clock);
  if (jsonl_) jsonl_->Write(step, now, values);
  if (events_) {
    for (const auto& [name, v] : values) events_->Scalar(name, static_cast<float>(v), step, now);
    events_->Flush();
  }
}

}  // namespace muster
