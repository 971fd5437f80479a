// What Distributed::Start reads besides its Options: the environment of the
// launcher (MUSTER_COORDINATOR, MUSTER_JOB, SLURM_JOB_ID, muster-agent's
// session), resolved into the options of the client and the communicator.
#ifndef MUSTER_TRAINER_LIB_LAUNCH_OPTIONS_H_
#define MUSTER_TRAINER_LIB_LAUNCH_OPTIONS_H_

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "muster/options.h"
#include "trainer/client/coordinator_client.h"
#include "trainer/comm/factory.h"
#include "trainer/elastic/catalog_checkpointer.h"
#include "trainer/elastic/elastic_world.h"
#include "trainer/elastic/progress_reporter.h"
#include "trainer/elastic/replica.h"
#include "trainer/elastic/state_server.h"
#include "trainer/elastic/world_changes.h"

namespace muster {

class GradScaler;  // muster/amp.h

// The client's options: the coordinator (Options::coordinator, else
// $MUSTER_COORDINATOR), the token, this member's placement, `clock` (its
// deadlines'). Errors: INVALID_ARGUMENT naming what is missing, the token's
// and the placement's.
absl::StatusOr<ClientOptions> ClientOptionsFrom(const Options& o, Clock* clock);
// The communicator's options: the job name for shared memory
// (Options::job, else $MUSTER_JOB, $SLURM_JOB_ID, "muster"), this
// process's GPU, `clock` (its deadlines').
CommOptions CommOptionsFrom(const Options& o, int local_rank, Clock* clock);
std::string HostName();
// The CPUs this process may run on (its affinity mask).
int UsableCpus();
// LibTorch's intra-op threads for Options::intra_op_threads = requested
// (muster/options.h): -1 means leave them as they are.

int IntraOpThreads(int requested, int usable_cpus, int node_trainers, bool omp_env_set);
// The options of the engine's parts, as Options say (`clock`: theirs).
// WorldChanges: salvage, the LR scaling, the collective deadline, the
// step to stop after; `several_passes`: State::modules names modules or
// holds several optimizers. The asked-to-stop and -leave functions stay
// the caller's.
WorldChangesOptions WorldChangesOptionsFrom(const Options& o, bool several_passes, Clock* clock);
// The membership's: `client`, the communicator's, the timeouts (a world's
// build waits the collective deadline's long timeout). The interruption
// and the wait before a rejoin stay the caller's.
// What every trainer of a job must hold alike, as "name=value" lines
// (ElasticWorldOptions::settings): the options that shape the collectives
// (backend, buckets, compression, buffers, state checks, salvage, sharding,
// clipping) and the sampler's schedule.
std::string JobSettings(const Options& o);
ElasticWorldOptions ElasticWorldOptionsFrom(const Options& o, ClientOptions client,
                                            Clock* clock);
// The replica's: buckets, overlap, the buffers' broadcast, sharding,
// clipping, and the program's loss scaler (null: none; not owned).
ReplicaOptions ReplicaOptionsFrom(const Options& o, Clock* clock, GradScaler* scaler = nullptr);
// The checkpoints of Options::checkpoint_dir.
CatalogCheckpointerOptions CheckpointOptionsFrom(const Options& o, Clock* clock);
// The progress lines (none when quiet) and the logs.
ProgressOptions ProgressOptionsFrom(const Options& o, Clock* clock);

// Sets LibTorch's intra-op threads for `node_trainers` trainers of this
// world on this node (IntraOpThreads, OMP_NUM_THREADS as set), saying so.
// Warns, once a process, when LibTorch's BLAS is the reference one
// (IsReferenceBlas).
void ShareIntraOpThreads(const Options& o, int node_trainers);
// Whether `library`, the resolved path of the library that defines sgemm_,
// is the reference (netlib) BLAS: a libblas.so that no optimized provider
// (OpenBLAS, BLIS, ATLAS, MKL) installed. Debian's libtorch1.13 gets it
// when apt meets "libblas3 | libblas.so.3" with nothing else installed.
bool IsReferenceBlas(std::string_view library);

// The state service (muster pull-weights) on Options::state_listen, null
// when that is empty; the address it serves is written into `client` for
// the coordinator to hand out. Its waits are timed on `clock`. Errors:
// StateServer::Start's.
absl::StatusOr<std::unique_ptr<StateServer>> StartStateService(const Options& o,
                                                               ClientOptions* client,
                                                               Clock* clock);

}  // namespace muster

#endif  // MUSTER_TRAINER_LIB_LAUNCH_OPTIONS_H_
