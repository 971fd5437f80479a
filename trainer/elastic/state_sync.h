// State transfer after a regroup: every rank of the new world takes the
// model, the optimizer state and the training counters of the rank that
// holds the newest step (the coordinator names it), over the new world's
// communicator. Survivors that are behind (a step that completed on some
// ranks only) and newcomers (a replacement or a new member) catch up from a
// live peer; nothing is read from disk.
#ifndef MUSTER_TRAINER_ELASTIC_STATE_SYNC_H_
#define MUSTER_TRAINER_ELASTIC_STATE_SYNC_H_

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "trainer/comm/communicator.h"

namespace muster {

// Broadcasts `source`'s `counters` (e.g. step and sample offset), parameters,
// buffers and optimizer state to every rank, then checks with one
// all-reduce that all ranks hold identical state. Errors: the
// communicator's, or DATA_LOSS when the ranks still differ.
absl::Status SyncStateFrom(int source, Communicator* comm, torch::nn::Module& model,
                           torch::optim::Optimizer& optimizer, std::vector<int64_t>* counters,
                           absl::Time deadline);

// All-reduced check that every rank holds the same parameters and buffers.
absl::Status CheckSameState(Communicator* comm, torch::nn::Module& model, absl::Time deadline);

}  // namespace muster

#endif  // MUSTER_TRAINER_ELASTIC_STATE_SYNC_H_
