// CoordinatorService: the gRPC face of Coordinator (callback API). It checks
// the job token, converts protos to domain values and statuses back, and
// records rpc metrics; every decision is the Coordinator's.
//
// Thread-safe: gRPC calls the handlers from its own threads.
#ifndef MUSTER_COORDINATOR_GRPC_SERVICE_H_
#define MUSTER_COORDINATOR_GRPC_SERVICE_H_

#include <functional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

#include "coordinator/coordinator.h"
#include "coordinator/metrics.h"
#include "coordinator/session_reactor.h"
#include "muster/v1/coordinator.grpc.pb.h"

namespace muster {

// The generated CallbackService, but with Session served on completion
// queues (rpc/async_bidi.h says why). Every method of the service is listed:
// one left out would have no handler, and CoordinatorServer refuses to start
// a service with one (has_synchronous_methods).
using CoordinatorServiceBase =
    v1::Coordinator::WithCallbackMethod_Join<
    v1::Coordinator::WithAsyncMethod_Session<
    v1::Coordinator::WithCallbackMethod_Rendezvous<
    v1::Coordinator::WithCallbackMethod_GetWorld<
    v1::Coordinator::WithCallbackMethod_Leave<
    v1::Coordinator::WithCallbackMethod_Drain<
    v1::Coordinator::WithCallbackMethod_KvSet<
    v1::Coordinator::WithCallbackMethod_KvGet<
    v1::Coordinator::WithCallbackMethod_KvAdd<
    v1::Coordinator::WithCallbackMethod_KvCompareAndSet<
    v1::Coordinator::WithCallbackMethod_Barrier<
    v1::Coordinator::WithCallbackMethod_BeginCheckpoint<
    v1::Coordinator::WithCallbackMethod_ReportShard<
    v1::Coordinator::WithCallbackMethod_AbortCheckpoint<
    v1::Coordinator::WithCallbackMethod_ListCheckpoints<
    v1::Coordinator::WithCallbackMethod_GetStatus<
    v1::Coordinator::WithCallbackMethod_ListEvents<
    v1::Coordinator::WithCallbackMethod_Shutdown<
        v1::Coordinator::Service>>>>>>>>>>>>>>>>>>;

class CoordinatorService final : public CoordinatorServiceBase {
 public:
  // `coordinator` and `metrics` must outlive the service. `token` empty:
  // no authentication. `on_shutdown` runs (once) after a Shutdown rpc.
  // `epoch`: the lease epoch this coordinator holds (0: no lease), which
  // every session event and rendezvous answer carries.
  CoordinatorService(Coordinator* coordinator, Metrics* metrics, std::string token,
                     std::function<void()> on_shutdown, uint64_t epoch = 0);

  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* ctx, const v1::JoinRequest* req,
                                 v1::JoinResponse* resp) override;
  // A Session call that arrived on a completion queue: its reactor.
  SessionReactor* StartSession(SessionCall* call);
  grpc::ServerUnaryReactor* Rendezvous(grpc::CallbackServerContext* ctx,
                                       const v1::RendezvousRequest* req,
                                       v1::RendezvousResponse* resp) override;
  grpc::ServerUnaryReactor* GetWorld(grpc::CallbackServerContext* ctx,
                                     const v1::GetWorldRequest* req,
                                     v1::GetWorldResponse* resp) override;
  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* ctx, const v1::LeaveRequest* req,
                                  v1::LeaveResponse* resp) override;
  grpc::ServerUnaryReactor* Drain(grpc::CallbackServerContext* ctx, const v1::DrainRequest* req,
                                  v1::DrainResponse* resp) override;
  grpc::ServerUnaryReactor* KvSet(grpc::CallbackServerContext* ctx, const v1::KvSetRequest* req,
                                  v1::KvSetResponse* resp) override;
  grpc::ServerUnaryReactor* KvGet(grpc::CallbackServerContext* ctx, const v1::KvGetRequest* req,
                                  v1::KvGetResponse* resp) override;
  grpc::ServerUnaryReactor* KvAdd(grpc::CallbackServerContext* ctx, const v1::KvAddRequest* req,
                                  v1::KvAddResponse* resp) override;
  grpc::ServerUnaryReactor* KvCompareAndSet(grpc::CallbackServerContext* ctx,
                                            const v1::KvCompareAndSetRequest* req,
                                            v1::KvCompareAndSetResponse* resp) override;
  grpc::ServerUnaryReactor* Barrier(grpc::CallbackServerContext* ctx,
                                    const v1::BarrierRequest* req,
                                    v1::BarrierResponse* resp) override;
  grpc::ServerUnaryReactor* BeginCheckpoint(grpc::CallbackServerContext* ctx,
                                            const v1::BeginCheckpointRequest* req,
                                            v1::BeginCheckpointResponse* resp) override;
  grpc::ServerUnaryReactor* ReportShard(grpc::CallbackServerContext* ctx,
                                        const v1::ReportShardRequest* req,
                                        v1::ReportShardResponse* resp) override;
  grpc::ServerUnaryReactor* AbortCheckpoint(grpc::CallbackServerContext* ctx,
                                            const v1::AbortCheckpointRequest* req,
                                            v1::AbortCheckpointResponse* resp) override;
  grpc::ServerUnaryReactor* ListCheckpoints(grpc::CallbackServerContext* ctx,
                                            const v1::ListCheckpointsRequest* req,
                                            v1::ListCheckpointsResponse* resp) override;
  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* ctx,
                                      const v1::GetStatusRequest* req,
                                      v1::GetStatusResponse* resp) override;
  grpc::ServerUnaryReactor* ListEvents(grpc::CallbackServerContext* ctx,
                                       const v1::ListEventsRequest* req,
                                       v1::ListEventsResponse* resp) override;
  grpc::ServerUnaryReactor* Shutdown(grpc::CallbackServerContext* ctx,
                                     const v1::ShutdownRequest* req,
                                     v1::ShutdownResponse* resp) override;

 private:
  // Finishes `ctx`'s default reactor with `status` and records metrics.
  // `start` is a time of the coordinator's clock (Elapsed).
  grpc::ServerUnaryReactor* Reply(grpc::CallbackServerContext* ctx, const char* method,
                                  absl::Time start, const absl::Status& status);
  // The coordinator clock's monotonic time since `start`, for metrics.
  absl::Duration Elapsed(absl::Time start) const;
  class Waiting;
  // A blocking call's reactor, finished at once when the client cancels
  // (the coordinator's answer, coming later, is then dropped). Finished
  // already, with RESOURCE_EXHAUSTED, when `caller` has
  // Limits::max_waits_per_caller calls waiting.
  Waiting* StartWaiting(const char* method, absl::Time start, const std::string& caller);
  void Released(const std::string& caller);

  Coordinator* const coordinator_;
  Metrics* const metrics_;
  const std::string token_;
  std::function<void()> on_shutdown_;
  const uint64_t epoch_;
  absl::Mutex waits_mu_;
  // Blocking calls waiting, by caller.
  absl::flat_hash_map<std::string, int> waits_ ABSL_GUARDED_BY(waits_mu_);
};

}  // namespace muster

#endif  // MUSTER_COORDINATOR_GRPC_SERVICE_H_
