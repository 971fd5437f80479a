// The implementation behind include/muster/muster.h.
#include <torch/torch.h>
#include <unistd.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/launch_env.h"
#include "common/status_macros.h"
#include "common/token.h"
#include "muster/muster.h"
#include "trainer/client/coordinator_client.h"
#include "trainer/comm/factory.h"
#include "trainer/data/sampler.h"
#include "trainer/ddp/gradient_sync.h"

namespace muster {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(120);

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

class DistributedImpl : public Distributed {
 public:
  int rank() const override { return world_.rank; }
  int world_size() const override { return world_.world_size; }
  int64_t epoch() const override { return epoch_; }

  std::vector<int64_t> NextBatch(int64_t dataset_size, int batch_per_rank,
                                 uint64_t seed) override {
    if (!sampler_ || sampler_->size() != dataset_size || seed_ != seed) {
      sampler_ = std::make_unique<DistributedSampler>(dataset_size, seed);
      seed_ = seed;
    }
    SampledBatch b = sampler_->Next(offset_, world_.world_size, world_.rank, batch_per_rank);
    offset_ += b.global_batch;
    epoch_ = b.epoch;
    client_->SetStep(++step_);
    return b.indices;
  }

  void BeforeBackward(bool sync) override { sync_->Begin(sync); }

  absl::Status AfterBackward() override { return sync_->Finish(absl::Now() + kTimeout); }

  absl::StatusOr<std::vector<double>> Average(std::vector<double> values) override {
    MUSTER_RETURN_IF_ERROR(comm_->AllReduce(values.data(), values.size(), DataType::kFloat64,
                                            ReduceOp::kAverage, absl::Now() + kTimeout));
    return values;
  }

  absl::Status Finish() override { return client_->Leave(/*finished=*/true, step_); }

  ~DistributedImpl() override {
    sync_.reset();
    comm_.reset();
  }

  WorldInfo world_;
  std::unique_ptr<CoordinatorClient> client_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<GradientSync> sync_;
  std::unique_ptr<DistributedSampler> sampler_;
  uint64_t seed_ = 0;
  int64_t offset_ = 0, epoch_ = 0, step_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Distributed>> Distributed::Start(torch::nn::Module& model,
                                                                const Options& options) {
  ClientOptions co;
  co.target = options.coordinator.empty() ? Env("MUSTER_COORDINATOR") : options.coordinator;
  if (co.target.empty()) {
    return absl::InvalidArgumentError(
        "no coordinator: set Options::coordinator or $MUSTER_COORDINATOR");
  }
  MUSTER_ASSIGN_OR_RETURN(co.token, ResolveToken(options.token_file));
  char host[256] = "localhost";
  ::gethostname(host, sizeof(host) - 1);
  MUSTER_ASSIGN_OR_RETURN(LaunchIdentity id,
                          ResolveLaunchIdentity({options.node_id, options.local_rank},
                                                [](const char* n) { return std::getenv(n); },
                                                host));
  co.member_id = id.member_id();
  co.node = id.node;
  co.local_rank = static_cast<uint32_t>(id.local_rank);
  MUSTER_ASSIGN_OR_RETURN(Backend backend, ParseBackend(options.backend));

  auto d = std::make_unique<DistributedImpl>();
  MUSTER_ASSIGN_OR_RETURN(d->client_, CoordinatorClient::Create(co));
  MUSTER_RETURN_IF_ERROR(d->client_->Join(0, absl::Now() + kTimeout));
  DistributedImpl* raw = d.get();
  MUSTER_RETURN_IF_ERROR(d->client_->StartSession([raw](const SessionNotice& n) {
    if (n.kind == SessionNotice::Kind::kRegroup && !n.abort) return;
    if (raw->comm_) raw->comm_->Abort(absl::AbortedError(n.reason));
  }));
  MUSTER_ASSIGN_OR_RETURN(d->world_, d->client_->Rendezvous(0, 0, absl::Now() + absl::Seconds(600)));
  d->store_ = NewCoordinatorStore(d->client_.get(), d->world_.generation);
  CommOptions comm;
  comm.backend = backend;
  comm.job = !options.job.empty() ? options.job
             : !Env("SLURM_JOB_ID").empty() ? Env("SLURM_JOB_ID") : "muster";
  MUSTER_ASSIGN_OR_RETURN(d->comm_, BuildCommunicator(d->world_, d->store_.get(), comm,
                                                      absl::Now() + kTimeout));
  std::vector<torch::Tensor> state = model.parameters();
  for (const torch::Tensor& b : model.buffers()) state.push_back(b);
  MUSTER_RETURN_IF_ERROR(BroadcastTensors(state, d->comm_.get(), 0, absl::Now() + kTimeout));
  GradientSyncOptions so;
  so.bucket_bytes = static_cast<size_t>(options.bucket_mb * (1 << 20));
  d->sync_ = std::make_unique<GradientSync>(model.parameters(), d->comm_.get(), so);
  return std::unique_ptr<Distributed>(std::move(d));
}

}  // namespace muster
