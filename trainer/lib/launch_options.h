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

}  // namespace muster

#endif  // MUSTER_TRAINER_LIB_LAUNCH_OPTIONS_H_
