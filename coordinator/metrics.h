// Metrics: the coordinator's Prometheus metrics (prometheus-cpp), served as
// text at http://HOST:PORT/metrics when a listen address is given.
//
// Thread-safe.
#ifndef MUSTER_COORDINATOR_METRICS_H_
#define MUSTER_COORDINATOR_METRICS_H_

#include <memory>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/coordinator.h"

namespace prometheus {
class Exposer;
class Registry;
class Counter;
class Gauge;
template <typename T> class Family;
class Histogram;
}  // namespace prometheus

namespace muster {

class Metrics {
 public:
  // `listen` empty: collect only (Render() still works). Errors:
  // UNAVAILABLE when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<Metrics>> Create(const std::string& listen);
  ~Metrics();

  // One finished rpc.
  void ObserveRpc(const char* method, absl::StatusCode code, absl::Duration latency);
  // One heartbeat handled, with its handling time.
  void ObserveHeartbeat(absl::Duration latency);
  // One gRPC listener replaced after it stopped accepting
  // (listener_watchdog.h).
  void CountListenerRebuild();
  // Copies the coordinator's gauges and counters.
  void Update(const CoordinatorCounters& counters);
  // The Prometheus text exposition of every metric.
  std::string Render() const;
  // The bound port of the HTTP listener (0 if none).
  int port() const;

 private:
  Metrics();
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  prometheus::Family<prometheus::Counter>* rpcs_;
  prometheus::Family<prometheus::Histogram>* rpc_latency_;
  prometheus::Histogram* heartbeat_latency_;
  prometheus::Counter* heartbeats_;
  prometheus::Family<prometheus::Gauge>* members_;
  prometheus::Gauge* generation_;
  prometheus::Gauge* sessions_;
  prometheus::Counter* regroups_;
  prometheus::Counter* failures_;
  prometheus::Counter* checkpoints_;
  prometheus::Gauge* world_size_;
  prometheus::Gauge* step_;
  prometheus::Family<prometheus::Gauge>* rank_memory_;
  prometheus::Histogram* regroup_duration_;
  prometheus::Histogram* checkpoint_duration_;
  prometheus::Counter* checkpoint_bytes_;
  prometheus::Counter* listener_rebuilds_;
  // ObserveRpc's series by method and code, found once: Family::Add builds
  // a label map and searches for it on every call, and a regroup at
  // 100,000 members observes 100,000 answers.
  struct RpcSeries {
    prometheus::Counter* calls;
    prometheus::Histogram* latency;
  };
  absl::Mutex rpc_mu_;
  absl::flat_hash_map<std::pair<std::string, absl::StatusCode>, RpcSeries> rpc_series_
      ABSL_GUARDED_BY(rpc_mu_);
  absl::Mutex mu_;
  CoordinatorCounters last_ ABSL_GUARDED_BY(mu_);
};

}  // namespace muster

#endif  // MUSTER_COORDINATOR_METRICS_H_
