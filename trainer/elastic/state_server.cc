#include "trainer/elastic/state_server.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/mutex.h"
#include "muster/v1/state.grpc.pb.h"
#include "rpc/credentials.h"
#include "trainer/checkpoint/safetensors.h"

namespace muster {
namespace {

constexpr size_t kChunkBytes = size_t{1} << 20;
constexpr int64_t kNobody = std::numeric_limits<int64_t>::max();
constexpr absl::Duration kCancelPoll = absl::Milliseconds(50);

struct Snapshot {
  int64_t step = -1;
  uint64_t generation = 0;
  std::string bytes;
  std::string xxh3;
};

class StateServerImpl final : public StateServer, public v1::State::Service {
 public:
  explicit StateServerImpl(StateServerOptions o) : options_(std::move(o)) {}
  ~StateServerImpl() override { Shutdown(); }

  absl::Status Listen() {
    auto creds = MakeServerCredentials(options_.tls);
    if (!creds.ok()) return creds.status();
    grpc::ServerBuilder builder;
    builder.AddListeningPort(options_.listen, *creds, &port_);
    // A pull waits for its step with the client's keepalive pings going.
    ApplyServerConnectionRules(&builder, kHandshakeTimeout, kMaxConnectionIdle);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
    if (server_ == nullptr || port_ == 0) {
      return absl::UnavailableError(
          absl::StrCat("state service: cannot listen on ", options_.listen));
    }
    return absl::OkStatus();
  }

  int port() const override { return port_; }

  bool Wanted(int64_t step) const override {
    return step >= earliest_wanted_.load(std::memory_order_relaxed);
  }

  void Publish(int64_t step, uint64_t generation, std::string bytes) override {
    auto snap = std::make_shared<Snapshot>();
    snap->step = step;
    snap->generation = generation;
    snap->xxh3 = Xxh3Hex(bytes.data(), bytes.size());
    snap->bytes = std::move(bytes);
    {
      MutexLock lock(&mu_);
      latest_ = std::move(snap);
    }
    cv_.NotifyAll();
  }

  int64_t held_bytes() const override {
    MutexLock lock(&mu_);
    return latest_ ? static_cast<int64_t>(latest_->bytes.size()) : 0;
  }

  void Shutdown() override {
    {
      MutexLock lock(&mu_);
      if (shut_down_) return;
      shut_down_ = true;
    }
    cv_.NotifyAll();
    if (server_) {
      server_->Shutdown(
          SystemDeadline(options_.clock->Now() + absl::Seconds(2), options_.clock));
    }
  }

  grpc::Status PullState(grpc::ServerContext* ctx, const v1::PullStateRequest* req,
                         grpc::ServerWriter<v1::StateChunk>* writer) override {
    if (absl::Status s = CheckToken(*ctx, options_.token); !s.ok()) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, std::string(s.message()));
    }
    if (req->at_step() < 0) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("at_step must not be negative, not ", req->at_step()));
    }
    const absl::Duration wait =
        req->timeout_ms() == 0 ? absl::Seconds(60) : absl::Milliseconds(req->timeout_ms());
    std::shared_ptr<const Snapshot> snap;
    {
      MutexLock lock(&mu_);
      // The next step boundary, or the requested one if later.
      const int64_t after = latest_ ? latest_->step : -1;
      const int64_t want = std::max(req->at_step(), after + 1);
      auto it = waiting_.insert(want);
      UpdateEarliest();
      const absl::Time deadline = options_.clock->Now() + wait;
      auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return shut_down_ || ctx->IsCancelled() || (latest_ && latest_->step >= want);
      };
      // Nothing notifies cv_ when the caller goes away (it cancels, or its
      // deadline passes), so look again every kCancelPoll: a call nobody
      // waits for must not hold its thread, and keep Wanted() true, until
      // `wait` ends (up to 49 days). Monotonic: a wall step changes no wait.
      for (absl::Duration left = Remaining(deadline, options_.clock);
           !ready() && left > absl::ZeroDuration(); left = Remaining(deadline, options_.clock)) {
        cv_.WaitFor(&mu_, std::min(left, kCancelPoll));
      }
      waiting_.erase(it);
      UpdateEarliest();
      if (shut_down_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "trainer is stopping");
      if (ctx->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
      if (!latest_ || latest_->step < want) {
        return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                            absl::StrCat("no step boundary at or after step ", want, " within ",
                                         absl::FormatDuration(wait)));
      }
      snap = latest_;
    }
    MUSTER_LOG(INFO) << "state service: sending the state after step " << snap->step << " ("
                     << snap->bytes.size() << " bytes) to " << ctx->peer();
    for (size_t off = 0; off < snap->bytes.size() || off == 0; off += kChunkBytes) {
      v1::StateChunk chunk;
      if (off == 0) {
        chunk.set_step(snap->step);
        chunk.set_generation(snap->generation);
        chunk.set_member_id(options_.member_id);
        chunk.set_total_bytes(snap->bytes.size());
        chunk.set_xxh3(snap->xxh3);
      }
      chunk.set_offset(off);
      chunk.set_data(snap->bytes.substr(off, kChunkBytes));
      if (!writer->Write(chunk)) {
        return grpc::Status(grpc::StatusCode::CANCELLED, "the caller went away");
      }
      if (snap->bytes.empty()) break;
    }
    return grpc::Status::OK;
  }

 private:
  void UpdateEarliest() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    earliest_wanted_.store(waiting_.empty() ? kNobody : *waiting_.begin(),
                           std::memory_order_relaxed);
  }

  StateServerOptions options_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  mutable Mutex mu_;
  CondVar cv_;
  std::multiset<int64_t> waiting_ ABSL_GUARDED_BY(mu_);  // steps that calls wait for
  std::atomic<int64_t> earliest_wanted_{kNobody};
  std::shared_ptr<const Snapshot> latest_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

std::string StateListenAddress(const std::string& listen, const std::string& token) {
  if (!token.empty()) return listen;
  const size_t colon = listen.rfind(':');
  const std::string host = colon == std::string::npos ? "" : listen.substr(0, colon);
  if (host.empty() || host == "0.0.0.0" || host == "[::]" || host == "::") {
    return "127.0.0.1" + (colon == std::string::npos ? ":0" : listen.substr(colon));
  }
  return listen;
}

absl::StatusOr<std::unique_ptr<StateServer>> StateServer::Start(StateServerOptions options) {
  if (options.clock == nullptr) {
    return absl::InvalidArgumentError("StateServerOptions::clock is required");
  }
  auto server = std::make_unique<StateServerImpl>(std::move(options));
  if (absl::Status s = server->Listen(); !s.ok()) return s;
  return server;
}

}  // namespace muster
