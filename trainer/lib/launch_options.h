// What Distributed::Start reads besides its Options: the environment of the
// launcher (MUSTER_COORDINATOR, MUSTER_JOB, SLURM_JOB_ID, muster-agent's
// session), resolved into the options of the client and the communicator.
#ifndef MUSTER_TRAINER_LIB_LAUNCH_OPTIONS_H_
#define MUSTER_TRAINER_LIB_LAUNCH_OPTIONS_H_

#include <string>

#include "absl/status/statusor.h"
#include "muster/options.h"
#include "trainer/client/coordinator_client.h"
#include "trainer/comm/factory.h"

namespace muster {

// The client's options: the coordinator (Options::coordinator, else
// $MUSTER_COORDINATOR), the token, this member's placement. Errors:
// INVALID_ARGUMENT naming what is missing, the token's and the placement's.
absl::StatusOr<ClientOptions> ClientOptionsFrom(const Options& o);
// The communicator's options: the job name for shared memory
// (Options::job, else $MUSTER_JOB, $SLURM_JOB_ID, "muster") and this
// process's GPU.
CommOptions CommOptionsFrom(const Options& o, int local_rank);
std::string HostName();
// The CPUs this process may run on (its affinity mask).
int UsableCpus();
// LibTorch's intra-op threads for Options::intra_op_threads = requested
// (muster/options.h): -1 means leave them as they are.

int IntraOpThreads(int requested, int usable_cpus, int node_trainers, bool omp_env_set);

}  // namespace muster

#endif  // MUSTER_TRAINER_LIB_LAUNCH_OPTIONS_H_
