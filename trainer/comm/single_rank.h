// A communicator of one rank, on any memory: every collective is already
// done (a sum or an average over one rank is the buffer itself, a
// broadcast from the only rank is a no-op), so it moves no byte, starts no
// transport and returns OK at once. The hierarchical composition uses it on
// the GPU for a node of one trainer, where an NCCL communicator of one rank
// would reduce nothing and cost NCCL's initialisation (about 0.4 s, the
// first in a process) in every world a new process enters: a warm spare's,
// a restarted trainer's.
#ifndef MUSTER_TRAINER_COMM_SINGLE_RANK_H_
#define MUSTER_TRAINER_COMM_SINGLE_RANK_H_

#include <memory>

#include "trainer/comm/communicator.h"

namespace muster {

// name() is "self". After Abort every call answers ABORTED, as any
// communicator's does.
std::unique_ptr<Communicator> NewSingleRankCommunicator(MemorySpace memory);

}  // namespace muster

#endif  // MUSTER_TRAINER_COMM_SINGLE_RANK_H_
