// libmuster: make your own LibTorch training loop distributed, elastic-ready
// and coordinated by a muster job, in a few lines.
//
//   auto dist = muster::Distributed::Start(*model, {});      // join the job
//   for (int64_t step = 0; step < steps; ++step) {
//     std::vector<int64_t> idx = dist->NextBatch(data_size, batch, seed);
//     ... forward on those examples, loss ...
//     optimizer.zero_grad();
//     dist->BeforeBackward();
//     loss.backward();
//     if (!dist->AfterBackward().ok()) { /* the step failed: drop it */ }
//     optimizer.step();
//   }
//   dist->Finish();
//
// Start() reads the coordinator address and job token from the options or
// from $MUSTER_COORDINATOR / $MUSTER_TOKEN_FILE, and this trainer's node and
// local rank from Slurm, torchrun or OpenMPI variables.
//
// Thread-safety: a Distributed is used by the thread that runs the training
// loop. Errors follow muster's convention: UNAVAILABLE (coordinator
// unreachable), ABORTED (a peer failed: the step is dropped),
// DEADLINE_EXCEEDED, INVALID_ARGUMENT.
#ifndef MUSTER_MUSTER_H_
#define MUSTER_MUSTER_H_

#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace muster {

struct Options {
  std::string coordinator;  // host:port; default $MUSTER_COORDINATOR
  std::string token_file;   // default $MUSTER_TOKEN_FILE
  std::string backend = "auto";  // auto, gloo, shm, hier, nccl
  double bucket_mb = 25;
  std::string node_id;      // default: from the launcher, else the host name
  int local_rank = -1;      // default: from the launcher, else 0
  std::string job;          // names shared memory; default $SLURM_JOB_ID or "muster"
};

class Distributed {
 public:
  // Joins the job, waits for the world to form, connects the communicator
  // and copies rank 0's parameters and buffers of `model` to every rank.
  // `model` must outlive the returned object.
  static absl::StatusOr<std::unique_ptr<Distributed>> Start(torch::nn::Module& model,
                                                            const Options& options);
  virtual ~Distributed() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // This rank's share of the next global batch of `batch_per_rank` * world
  // examples from a data set of `dataset_size`, in a per-epoch permutation
  // seeded by `seed`; every example is visited once per epoch.
  virtual std::vector<int64_t> NextBatch(int64_t dataset_size, int batch_per_rank,
                                         uint64_t seed) = 0;
  virtual int64_t epoch() const = 0;

  // Before loss.backward(). `sync` false accumulates gradients locally (like
  // DDP's no_sync); the next synchronised step reduces the sum.
  virtual void BeforeBackward(bool sync = true) = 0;
  // After loss.backward(), before optimizer.step(): every gradient is the
  // average over the world. On error, drop the step.
  virtual absl::Status AfterBackward() = 0;

  // Averages `values` over the world (e.g. metrics).
  virtual absl::StatusOr<std::vector<double>> Average(std::vector<double> values) = 0;

  // Leaves the job as finished.
  virtual absl::Status Finish() = 0;
};

}  // namespace muster

#endif  // MUSTER_MUSTER_H_
