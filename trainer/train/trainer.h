// RunTraining: one trainer process's whole job — join the coordinator,
// rendezvous, connect the communicator, broadcast rank 0's parameters, train
// with bucketed overlapped gradient all-reduce on a distributed sampler,
// evaluate, log, and leave as finished.
#ifndef MUSTER_TRAINER_TRAIN_TRAINER_H_
#define MUSTER_TRAINER_TRAIN_TRAINER_H_

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/client/coordinator_client.h"
#include "trainer/comm/factory.h"

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
  double momentum = 0.9;
  double weight_decay = 0.0;
  int64_t warmup_steps = 50;
  size_t bucket_bytes = 25u << 20;
  bool overlap = true;
  int64_t eval_every = 0;  // 0: at the end only
  int64_t log_every = 20;
  std::string log_dir;     // JSON lines + TensorBoard (rank 0); "" = none
  uint64_t seed = 1;
  int threads = 0;         // LibTorch intra-op threads; 0 = cores / local trainers
  bool quiet = false;      // no progress lines
};

struct TrainResult {
  int rank = 0;
  int world_size = 0;
  int64_t steps = 0;
  double last_loss = 0;
  double test_loss = 0;
  double test_accuracy = 0;
  double steps_per_second = 0;
  double samples_per_second = 0;
  double comm_overlap_pct = 0;  // share of all-reduce time hidden behind backward
  std::vector<torch::Tensor> parameters;  // final, in registration order
};

absl::StatusOr<TrainResult> RunTraining(const TrainOptions& options);

}  // namespace muster

#endif  // MUSTER_TRAINER_TRAIN_TRAINER_H_
