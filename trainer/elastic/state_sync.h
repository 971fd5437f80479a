// State transfer after a regroup: every rank of the new world takes the
// whole training state (model, optimizer, the user's extra tensors and
// blobs) and the training counters of the rank that holds the newest step
// (the coordinator names it), over the new world's communicator. Survivors
// that are behind (a step that completed on some ranks only) and newcomers (a
// replacement or a new member) catch up from a live peer; nothing is read
// from disk. Afterwards one all-reduce checks that every rank holds
// bit-identical state.
#ifndef MUSTER_TRAINER_ELASTIC_STATE_SYNC_H_
#define MUSTER_TRAINER_ELASTIC_STATE_SYNC_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "trainer/checkpoint/training_state.h"
#include "trainer/comm/communicator.h"
#include "trainer/elastic/training_counters.h"

namespace muster {

// Broadcasts `source`'s `counters` (as TrainingCounters::ToWords) and
// state to every rank, then checks that all ranks hold identical state. On
// success every rank holds the source's state and `*counters`. Errors: the
// communicator's; DATA_LOSS when the ranks still differ, the source's
// counters do not decode, or a blob's load rejects the source's bytes;
// `*counters` is then unchanged (the tensors may have been overwritten).
//
// `in_step`: this rank is inside a step whose forward passes changed the
// modules' buffers on each rank, and whose graphs may still hold them (a
// peer failed in a pass of the step). When the source is, the buffers stay
// out of the transfer and of the check on every rank, so that no graph of
// the step breaks; `*buffers_held` (when given) is then true, and the
// caller copies every buffer from `source` at the step boundary.
absl::Status SyncStateFrom(int source, Communicator* comm, const TrainingState& state,
                           TrainingCounters* counters, absl::Time deadline, bool in_step = false,
                           bool* buffers_held = nullptr);

// XXH3-64 over every byte of `state` (its model's buffers too unless
// `buffers` is false) and `counters` (words such as
// TrainingCounters::ToWords).
uint64_t StateDigest(const TrainingState& state, const std::vector<int64_t>& counters,
                     bool buffers = true);

// All-reduced check that `digest` is the same on every rank: OK, or
// DATA_LOSS on every rank when any two differ.
absl::Status CheckSameDigest(uint64_t digest, Communicator* comm, absl::Time deadline);
// CheckSameDigest of the whole state; when it differs, the DATA_LOSS error
// names the entries that differ (one more all-reduce of every entry's hash).
absl::Status CheckSameState(const TrainingState& state, const std::vector<int64_t>& counters,
                            Communicator* comm, absl::Time deadline, bool buffers = true);

// Collective: whether every rank holds the same state (the digest of
// `state` and `counters`), one all-reduce of a word per rank when they do.
// OK, or DATA_LOSS on every rank naming the ranks whose state differs from
// the one most ranks hold (rank 0's on a tie) and the first registered
// entry that differs ("model param.discriminator/0.weight"): one more
// all-reduce of every entry's hash. Errors: the communicator's.
absl::Status CheckRanksAgree(const TrainingState& state, const std::vector<int64_t>& counters,
                             Communicator* comm, absl::Time deadline);

}  // namespace muster

#endif  // MUSTER_TRAINER_ELASTIC_STATE_SYNC_H_
