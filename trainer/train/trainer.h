// RunTraining: muster-train's job, as a client of the public library
// (include/muster/muster.h): build the chosen model, data set and optimizer,
// hand them to muster::Distributed, run the loop, evaluate, and report.
// Everything elastic (joins, regroups, checkpoints, signals, state
// transfer) happens inside the library.
#ifndef MUSTER_TRAINER_TRAIN_TRAINER_H_
#define MUSTER_TRAINER_TRAIN_TRAINER_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "muster/memory_account.h"
#include "muster/options.h"
#include "muster/step_timeline.h"

// No LibTorch here: programs that define Abseil flags include this header,
// and Debian's LibTorch brings glog, whose FLAGS_log_dir clashes with ours.
namespace at {
class Tensor;
}  // namespace at

namespace muster {

// muster-train's run: the library's options plus what the program itself
// builds (model, data, optimizer, learning-rate schedule).
struct TrainOptions {
  // The job, communication, data schedule (batch_per_rank, steps, epochs,
  // seed), checkpoints, stopping and output. RunTraining fills in
  // dataset_size, lr_schedule, model_name and optimizer_name.
  Options library;
  std::string model = "cnn";
  std::string dataset = "fashion-mnist";  // or "synthetic"
  std::string data_dir;                   // default: Debian's package location
  int synthetic_channels = 1, synthetic_size = 28;
  int64_t synthetic_examples = 60000;
  std::string optimizer = "sgd";  // or "adamw"
  double lr = 0.01;               // for one rank; see lr_scaling
  std::string lr_scaling = "linear";  // "linear": lr * world size; "none"
  double momentum = 0.9;
  double weight_decay = 0.0;
  int64_t warmup_steps = 50;
  int compute_ms = 0;      // time each step also spends as if computing (benchmarks)
  // Each rank's batch in this many parts, each with its own forward and
  // backward inside the step's one synchronised pass (a loop over
  // micro-batches, a loss per task): what several backward calls in a pass
  // cost (benchmarks). 1: one backward.
  int backward_calls = 1;
  int64_t eval_every = 0;  // 0: at the end only
  // Time every step from its batch in memory to the optimizer step done on
  // the device (a device synchronisation per step): TrainResult::step_ms_p50.
  bool time_steps = false;
  // Deterministic cuDNN convolutions: a resumed GPU run matches bit for bit.
  bool deterministic = false;
};

struct TrainResult {
  TrainResult();
  ~TrainResult();
  TrainResult(TrainResult&&);
  TrainResult& operator=(TrainResult&&);
  TrainResult(const TrainResult&);
  TrainResult& operator=(const TrainResult&);

  int rank = 0;
  int world_size = 0;
  int64_t steps = 0;
  double last_loss = 0;
  double test_loss = 0;
  double test_accuracy = 0;
  double steps_per_second = 0;
  double samples_per_second = 0;
  double comm_overlap_pct = 0;  // share of all-reduce time hidden behind backward
  StepTimeline timeline;        // where the steps' time went (Distributed::step_timeline)
  int intra_op_threads = 0;     // LibTorch's threads on the training thread at the end
  double step_ms_p50 = 0;       // with time_steps: median step time after the warm-up
  double step_ms_mean = 0;      // with time_steps: mean step time after the warm-up
  int step_ms_warmup = 0;       // the first steps left out of both (20 of more than 40)
  bool stopped = false;         // stopped by a signal after checkpointing
  int exit_code = 0;            // Distributed::ExitCode of how the run ended
  bool left = false;            // left the job early (SIGTERM, drain)
  int64_t resumed_from_step = -1;  // the state it started from: a checkpoint's or a live peer's (-1: fresh)
  int checkpoints_committed = 0;
  int regroups = 0;               // generations entered after the first
  int steps_salvaged = 0;         // failed steps taken in the regrouped world
  int steps_dropped = 0;          // failed steps dropped
  // Distributed::optimizer_state_elements: this rank's per-element state.
  int64_t optimizer_state_elements = 0;
  MemoryAccount memory;  // Distributed::memory_account at the end
  double parameter_checksum = 0;  // sum of |x| over the final parameters
  // Distributed::last_gradient_norm: NaN without clipping.
  double last_gradient_norm = 0;
  std::vector<at::Tensor> parameters;  // final, in registration order
};

// `clock` times the run and, with time_steps, its steps (the library keeps
// its own: Distributed::Start); required, not owned.
absl::StatusOr<TrainResult> RunTraining(const TrainOptions& options, Clock* clock);

}  // namespace muster

#endif  // MUSTER_TRAINER_TRAIN_TRAINER_H_
