#include "coordinator/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <exception>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace muster {
namespace {

const prometheus::Histogram::BucketBoundaries& LatencyBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30};
  return *buckets;
}

}  // namespace

Metrics::Metrics() : registry_(std::make_shared<prometheus::Registry>()) {
  using namespace prometheus;  // NOLINT: builder DSL
  rpcs_ = &BuildCounter().Name("muster_rpcs_total")
               .Help("Coordinator rpcs by method and status code").Register(*registry_);
  rpc_latency_ = &BuildHistogram().Name("muster_rpc_latency_seconds")
                      .Help("Coordinator rpc handling time by method (blocking calls include "
                            "their wait)").Register(*registry_);
  heartbeat_latency_ = &BuildHistogram().Name("muster_heartbeat_latency_seconds")
                            .Help("Heartbeat handling time").Register(*registry_)
                            .Add({}, LatencyBuckets());
  heartbeats_ = &BuildCounter().Name("muster_heartbeats_total").Help("Heartbeats received")
                     .Register(*registry_).Add({});
  members_ = &BuildGauge().Name("muster_members").Help("Members by state")
                  .Register(*registry_);
  generation_ = &BuildGauge().Name("muster_generation").Help("Current generation")
                     .Register(*registry_).Add({});
  sessions_ = &BuildGauge().Name("muster_sessions").Help("Open member sessions")
                   .Register(*registry_).Add({});
  regroups_ = &BuildCounter().Name("muster_regroups_total").Help("Generations formed")
                   .Register(*registry_).Add({});
  failures_ = &BuildCounter().Name("muster_member_failures_total")
                   .Help("Members declared failed").Register(*registry_).Add({});
  checkpoints_ = &BuildCounter().Name("muster_checkpoints_committed_total")
                      .Help("Checkpoints committed").Register(*registry_).Add({});
  world_size_ = &BuildGauge().Name("muster_world_size").Help("Members of the live world")
                     .Register(*registry_).Add({});
  step_ = &BuildGauge().Name("muster_step")
               .Help("Newest training step a member of the world reported")
               .Register(*registry_).Add({});
  rank_memory_ = &BuildGauge().Name("muster_rank_memory_bytes")
                      .Help("The memory account of the active member that holds the most, by "
                            "what holds it (its last pass's)")
                      .Register(*registry_);
  const Histogram::BucketBoundaries seconds = {0.01, 0.03, 0.1, 0.3, 1, 3, 10, 30, 100};
  regroup_duration_ = &BuildHistogram().Name("muster_regroup_duration_seconds")
                           .Help("From forming a world to its last member's arrival")
                           .Register(*registry_).Add({}, seconds);
  checkpoint_duration_ = &BuildHistogram().Name("muster_checkpoint_duration_seconds")
                              .Help("From a checkpoint's begin to its commit")
                              .Register(*registry_).Add({}, seconds);
  checkpoint_bytes_ = &BuildCounter().Name("muster_checkpoint_bytes_total")
                           .Help("Bytes of the committed checkpoints' files")
                           .Register(*registry_).Add({});
  listener_rebuilds_ = &BuildCounter().Name("muster_listener_rebuilds_total")
                            .Help("gRPC listeners replaced after they stopped accepting "
                                  "(out of file descriptors)")
                            .Register(*registry_).Add({});
}

Metrics::~Metrics() = default;

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Create(const std::string& listen) {
  std::unique_ptr<Metrics> m(new Metrics());
  if (!listen.empty()) {
    try {
      m->exposer_ = std::make_unique<prometheus::Exposer>(listen);
    } catch (const std::exception& e) {
      return absl::UnavailableError(
          absl::StrCat("cannot serve metrics on ", listen, ": ", e.what()));
    }
    m->exposer_->RegisterCollectable(m->registry_);
  }
  return m;
}

void Metrics::ObserveRpc(const char* method, absl::StatusCode code, absl::Duration latency) {
  RpcSeries series;
  {
    absl::MutexLock lock(&rpc_mu_);
    auto [it, added] = rpc_series_.try_emplace(std::make_pair(std::string(method), code));
    if (added) {
      it->second.calls = &rpcs_->Add({{"method", method}, {"code", absl::StatusCodeToString(code)}});
      it->second.latency = &rpc_latency_->Add({{"method", method}}, LatencyBuckets());
    }
    series = it->second;
  }
  series.calls->Increment();
  series.latency->Observe(absl::ToDoubleSeconds(latency));
}

void Metrics::ObserveHeartbeat(absl::Duration latency) {
  heartbeats_->Increment();
  heartbeat_latency_->Observe(absl::ToDoubleSeconds(latency));
}

void Metrics::CountListenerRebuild() { listener_rebuilds_->Increment(); }

void Metrics::Update(const CoordinatorCounters& c) {
  absl::MutexLock lock(&mu_);
  generation_->Set(static_cast<double>(c.generation));
  sessions_->Set(static_cast<double>(c.open_sessions));
  for (const char* state : {"waiting", "active", "draining", "failed", "left", "finished"}) {
    auto it = c.members_by_state.find(state);
    members_->Add({{"state", state}})
        .Set(it == c.members_by_state.end() ? 0.0 : static_cast<double>(it->second));
  }
  if (c.regroups > last_.regroups) regroups_->Increment(c.regroups - last_.regroups);
  if (c.failures > last_.failures) failures_->Increment(c.failures - last_.failures);
  if (c.checkpoints_committed > last_.checkpoints_committed) {
    checkpoints_->Increment(c.checkpoints_committed - last_.checkpoints_committed);
  }
  world_size_->Set(static_cast<double>(c.world_size));
  step_->Set(static_cast<double>(c.step));
  const MemberMemory& m = c.largest_memory;
  for (const auto& [category, bytes] :
       {std::pair<const char*, uint64_t>{"parameters", m.parameters},
        {"gradients", m.gradients}, {"optimizer_state", m.optimizer_state},
        {"communication", m.communication}, {"staging", m.staging}, {"transfer", m.transfer}}) {
    rank_memory_->Add({{"category", category}}).Set(static_cast<double>(bytes));
  }
  // The observations made since the last update (as many as are kept).
  const size_t new_regroups = std::min<uint64_t>(c.regroups_timed - last_.regroups_timed,
                                                 c.regroup_seconds.size());
  for (size_t i = c.regroup_seconds.size() - new_regroups; i < c.regroup_seconds.size(); ++i) {
    regroup_duration_->Observe(c.regroup_seconds[i]);
  }
  const size_t new_checkpoints = std::min<uint64_t>(
      c.checkpoints_timed - last_.checkpoints_timed, c.checkpoint_seconds.size());
  for (size_t i = c.checkpoint_seconds.size() - new_checkpoints; i < c.checkpoint_seconds.size();
       ++i) {
    checkpoint_duration_->Observe(c.checkpoint_seconds[i]);
    checkpoint_bytes_->Increment(c.checkpoint_bytes[i]);
  }
  last_ = c;
}

std::string Metrics::Render() const {
  prometheus::TextSerializer serializer;
  return serializer.Serialize(registry_->Collect());
}

int Metrics::port() const {
  if (!exposer_) return 0;
  auto ports = exposer_->GetListeningPorts();
  return ports.empty() ? 0 : ports.front();
}

}  // namespace muster
