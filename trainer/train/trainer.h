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
#include "common/file_system.h"
#include "trainer/client/coordinator_client.h"
#include "trainer/comm/factory.h"

// No LibTorch here: programs that define Abseil flags include this header,
// and Debian's LibTorch brings glog, whose FLAGS_log_dir clashes with ours.
namespace at {
class Tensor;
}  // namespace at

namespace muster {

struct TrainOptions {
  ClientOptions client;  // coordinator address, token, member id, node, local rank
  int local_world_size = 1;
  CommOptions comm;
  std::string model = "cnn";
  std::string dataset = "fashion-mnist";  // or "synthetic"
  std::string data_dir;                   // default: Debian's package location
  int synthetic_channels = 1, synthetic_size = 28;
  int64_t synthetic_examples = 60000;
  int batch_size = 64;  // per rank
  int64_t steps = 0;    // 0: train `epochs` epochs
  int epochs = 1;
  std::string optimizer = "sgd";  // or "adamw"
  double lr = 0.01;               // for one rank; see lr_scaling
  std::string lr_scaling = "linear";  // "linear": lr * world size; "none"
  // After a regroup: "scale" the (linear) learning rate to the new world
  // size, or "keep" the one of the world the run started in.
  std::string elastic_lr = "scale";
  double momentum = 0.9;
  double weight_decay = 0.0;
  int64_t warmup_steps = 50;
  size_t bucket_bytes = 25u << 20;
  bool overlap = true;
  bool salvage = true;
  int compute_ms = 0;   // time each step also spends as if computing (benchmarks)  // salvage a step a peer failed in (false: drop it)
  int64_t eval_every = 0;  // 0: at the end only
  int64_t log_every = 20;
  std::string log_dir;     // JSON lines + TensorBoard (rank 0); "" = none
  uint64_t seed = 1;
  int threads = 0;         // LibTorch intra-op threads; 0 = cores / local trainers
  bool quiet = false;      // no progress lines

  // Checkpoints (see trainer/checkpoint/checkpointer.h). Empty dir: none.
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;       // steps; 0 = not by steps
  double checkpoint_interval_s = 0;   // seconds; 0 = not by time
  bool resume = true;                 // restore the newest committed checkpoint at start
  // The state service (`muster pull-weights`): host:port to listen on
  // ("" = none), advertised to the coordinator as <address>:<port>, where
  // address is comm.gloo.hostname or else the host name.
  std::string state_listen = "0.0.0.0:0";
  TlsFiles state_tls;  // cert + key: the state service serves TLS
  FileSystem* checkpoint_fs = nullptr;  // default: the real file system (tests inject faults)
  // Set by a signal handler (SIGUSR1/SIGTERM): every rank checkpoints at the
  // next step boundary and RunTraining returns with `stopped` set.
  const std::atomic<bool>* stop_requested = nullptr;
  // Behave as if stop_requested were set after this step (drills and tests).
  int64_t stop_after_step = 0;
  // Use the library's SIGUSR1/SIGTERM handlers (muster::InstallSignalHandlers)
  // when stop_requested/leave_requested are null (a process; not threads).
  bool handle_signals = false;
  // Set by SIGTERM: this trainer leaves at the next step boundary and the
  // others go on without it — unless every rank got it (a whole job being
  // preempted), which is a stop with a checkpoint like stop_requested.
  const std::atomic<bool>* leave_requested = nullptr;
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
  bool stopped = false;         // stopped by a signal after checkpointing
  bool left = false;            // left the job early (SIGTERM, drain)
  int64_t resumed_from_step = -1;  // the checkpoint restored at start (-1: none)
  int checkpoints_committed = 0;
  int regroups = 0;               // generations entered after the first
  int steps_salvaged = 0;         // failed steps taken in the regrouped world
  int steps_dropped = 0;          // failed steps dropped
  double parameter_checksum = 0;  // sum of |x| over the final parameters
  std::vector<at::Tensor> parameters;  // final, in registration order
};

absl::StatusOr<TrainResult> RunTraining(const TrainOptions& options);

}  // namespace muster

#endif  // MUSTER_TRAINER_TRAIN_TRAINER_H_
