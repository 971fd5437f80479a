#include "relay/relay.h"

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "rpc/coordinator_channel.h"
#include "rpc/credentials.h"
#include "rpc/peer_address.h"
#include "rpc/status.h"

namespace muster {
namespace {

using grpc::ByteBuffer;

// Metadata that describes the hop rather than the call: gRPC's own (the
// deadline travels as the new call's deadline), HTTP/2's, and the
// forwarded host, which the relay sets itself.
bool HopByHop(absl::string_view key) {
  return key.empty() || key[0] == ':' || absl::StartsWith(key, "grpc-") || key == "user-agent" ||
         key == "content-type" || key == "te" || key == "host" || key == kForwardedHostMetadata;
}

absl::string_view View(const grpc::string_ref& s) { return {s.data(), s.size()}; }

}  // namespace

class Relay::Impl : public grpc::CallbackGenericService {
 public:
  explicit Impl(RelayOptions options) : o_(std::move(options)) {}

  absl::Status Listen();
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override;

  // The next connection to the coordinator, in turn; one that could not
  // connect first follows its target (an address file, a list).
  std::shared_ptr<grpc::Channel> NextChannel() {
    CoordinatorChannel& c = *upstream_[next_++ % upstream_.size()];
    std::shared_ptr<grpc::Channel> channel = c.get();
    if (channel->GetState(/*try_to_connect=*/false) == GRPC_CHANNEL_TRANSIENT_FAILURE &&
        c.Refresh()) {
      MUSTER_LOG(INFO) << "muster-relay: coordinator now at " << c.address();
      channel = c.get();
    }
    return channel;
  }

  void Shutdown() {
    absl::MutexLock lock(&shutdown_mu_);
    if (server_ == nullptr) return;
    stopping_ = true;
    // Calls under way are cancelled at once (a deadline already past, no
    // clock read); each ends upstream too.
    server_->Shutdown(std::chrono::system_clock::time_point());
    server_->Wait();
    server_.reset();
  }

  const RelayOptions o_;
  int port_ = 0;
  std::atomic<uint64_t> calls_{0}, refused_{0}, open_{0};
  std::atomic<bool> stopping_{false};

 private:
  std::vector<std::unique_ptr<CoordinatorChannel>> upstream_;
  std::atomic<uint64_t> next_{0};
  absl::Mutex shutdown_mu_;
  std::unique_ptr<grpc::Server> server_ ABSL_GUARDED_BY(shutdown_mu_);
};

namespace {

// One call relayed: the caller's (down) and the coordinator's (up) ends of
// it, each a reactor, pumping messages in two loops that each keep one
// operation outstanding: down read -> up write -> down read ..., and
// up read -> down write -> up read .... The up call holds two holds, one
// per loop, so that it ends (OnDone, with the coordinator's status) only
// once neither loop will touch it again; its status then finishes the down
// call. Deleted once both ends are done.
class RelayedCall {
 public:
  RelayedCall(Relay::Impl* relay, grpc::GenericCallbackServerContext* ctx)
      : relay_(relay), ctx_(ctx), down_(this), up_(this) {}

  grpc::ServerGenericBidiReactor* Start() {
    ++relay_->calls_;
    ++relay_->open_;
    if (absl::Status auth = CheckToken(*ctx_, relay_->o_.token); !auth.ok()) {
      ++relay_->refused_;
      refs_ = 1;  // no up call
      down_.Finish(ToGrpcStatus(auth));
      return &down_;
    }
    // The deadline goes up with the call; a caller that goes away does not
    // cancel it: its end half-closes it instead (DownRead), which the
    // coordinator tells apart from a relay lost
    // (coordinator/session_reactor.h).
    up_ctx_ = grpc::ClientContext::FromCallbackServerContext(
        *ctx_, grpc::PropagationOptions().disable_cancellation_propagation());
    for (const auto& [key, value] : ctx_->client_metadata()) {
      if (!HopByHop(View(key))) up_ctx_->AddMetadata(std::string(View(key)), std::string(View(value)));
    }
    // Always set, even when unknown (""): it also tells the coordinator
    // that the call came through a relay.
    up_ctx_->AddMetadata(kForwardedHostMetadata, CallerHost(*ctx_));
    grpc::GenericStub stub(relay_->NextChannel());
    stub.PrepareBidiStreamingCall(up_ctx_.get(), ctx_->method(), grpc::StubOptions(), &up_);
    up_.AddHold();  // the down -> up loop
    up_.AddHold();  // the up -> down loop
    up_.StartRead(&from_up_);
    up_.StartCall();
    down_.StartRead(&from_down_);
    return &down_;
  }

 private:
  class Down : public grpc::ServerGenericBidiReactor {
   public:
    explicit Down(RelayedCall* call) : call_(call) {}
    void OnReadDone(bool ok) override { call_->DownRead(ok); }
    void OnWriteDone(bool ok) override { call_->DownWritten(ok); }
    void OnCancel() override { call_->DownCancelled(); }
    void OnDone() override { call_->Unref(); }

   private:
    RelayedCall* const call_;
  };

  class Up : public grpc::ClientBidiReactor<ByteBuffer, ByteBuffer> {
   public:
    explicit Up(RelayedCall* call) : call_(call) {}
    void OnReadDone(bool ok) override { call_->UpRead(ok); }
    void OnWriteDone(bool ok) override { call_->UpWritten(ok); }
    void OnDone(const grpc::Status& status) override { call_->UpDone(status); }

   private:
    RelayedCall* const call_;
  };

  // down -> up. A message read from the caller goes up, unless the up call
  // has ended (then it is dropped: the caller's call is finishing).
  void DownRead(bool ok) {
    {
      absl::MutexLock lock(&mu_);
      if (writes_over_) return;
      if (ok) {
        up_writing_ = true;
      } else {
        writes_over_ = true;  // the caller half-closed, or its call ended
      }
    }
    if (ok) {
      up_.StartWrite(&from_down_);
      return;
    }
    // A relay that stops ends its callers' calls itself: cancelled up, not
    // half-closed, so that the coordinator holds their sessions.
    if (relay_->stopping_) {
      Cancel();
    } else {
      up_.StartWritesDone();
    }
    up_.RemoveHold();
  }

  void UpWritten(bool ok) {
    bool release = false;
    {
      absl::MutexLock lock(&mu_);
      up_writing_ = false;
      if (!ok || up_ended_) release = std::exchange(writes_over_, true) == false;
    }
    if (release) {
      up_.RemoveHold();
    } else if (ok) {
      down_.StartRead(&from_down_);
    }
  }

  // up -> down. A message from the coordinator goes down, unless the
  // caller is gone: then the up call is drained until it ends.
  void UpRead(bool ok) {
    if (ok) {
      if (down_broken_) {
        up_.StartRead(&from_up_);
      } else {
        down_.StartWrite(&from_up_);
      }
      return;
    }
    bool release = false;
    {
      absl::MutexLock lock(&mu_);
      up_ended_ = true;  // the coordinator finished the call
      if (!up_writing_) release = std::exchange(writes_over_, true) == false;
    }
    if (release) up_.RemoveHold();
    up_.RemoveHold();
  }

  void DownWritten(bool ok) {
    // The caller is gone: its pending read fails too, which half-closes
    // the up call (DownRead).
    if (!ok) down_broken_ = true;
    up_.StartRead(&from_up_);
  }

  void Cancel() {
    if (up_ctx_ != nullptr) up_ctx_->TryCancel();
  }

  // The caller's call ended before its status: the caller went away (its
  // pending read fails, and the up call is half-closed as if it had
  // finished), or the relay is stopping, when the up call is cancelled so
  // that the coordinator holds the caller's session for its reconnection.
  void DownCancelled() {
    if (relay_->stopping_) Cancel();
  }

  // Every operation of the up call is over: its status ends the caller's.
  void UpDone(const grpc::Status& status) {
    for (const auto& [key, value] : up_ctx_->GetServerTrailingMetadata()) {
      if (!HopByHop(View(key))) {
        ctx_->AddTrailingMetadata(std::string(View(key)), std::string(View(value)));
      }
    }
    down_.Finish(status);
    Unref();
  }

  void Unref() {
    if (--refs_ > 0) return;
    --relay_->open_;
    delete this;
  }

  Relay::Impl* const relay_;
  grpc::GenericCallbackServerContext* const ctx_;
  Down down_;
  Up up_;
  std::unique_ptr<grpc::ClientContext> up_ctx_;
  ByteBuffer from_down_, from_up_;
  // Touched only by the up -> down loop, one step after the other.
  bool down_broken_ = false;
  std::atomic<int> refs_{2};  // down's OnDone and up's
  absl::Mutex mu_;
  bool up_writing_ ABSL_GUARDED_BY(mu_) = false;  // a message on its way up
  bool up_ended_ ABSL_GUARDED_BY(mu_) = false;    // the coordinator finished
  bool writes_over_ ABSL_GUARDED_BY(mu_) = false; // the down -> up loop's hold released
};

}  // namespace

grpc::ServerGenericBidiReactor* Relay::Impl::CreateReactor(
    grpc::GenericCallbackServerContext* ctx) {
  return (new RelayedCall(this, ctx))->Start();
}

absl::Status Relay::Impl::Listen() {
  for (int i = 0; i < o_.connections; ++i) {
    MUSTER_ASSIGN_OR_RETURN(std::unique_ptr<CoordinatorChannel> c,
                            CoordinatorChannel::Create(o_.coordinator, o_.coordinator_tls, i));
    upstream_.push_back(std::move(c));
  }
  MUSTER_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                          MakeServerCredentials(o_.tls));
  grpc::ServerBuilder builder;
  builder.AddListeningPort(o_.listen, credentials, &port_);
  builder.RegisterCallbackGenericService(this);
  // Callers' messages up to the coordinator's limit; the coordinator's
  // answers whatever their size (it bounds them itself).
  builder.SetMaxReceiveMessageSize(o_.max_message_bytes);
  builder.SetMaxSendMessageSize(-1);
  ApplyServerConnectionRules(&builder, kHandshakeTimeout, kMaxConnectionIdle);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", o_.listen));
  }
  absl::MutexLock lock(&shutdown_mu_);
  server_ = std::move(server);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Relay>> Relay::Start(const RelayOptions& options) {
  if (options.coordinator.empty()) {
    return absl::InvalidArgumentError("muster-relay needs the coordinator's address");
  }
  if (options.max_message_bytes < 1) {
    return absl::InvalidArgumentError("the largest message must be at least 1 byte");
  }
  if (options.connections < 1 || options.connections > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("connections must be between 1 and 64, not ", options.connections));
  }
  auto impl = std::make_unique<Impl>(options);
  MUSTER_RETURN_IF_ERROR(impl->Listen());
  return std::unique_ptr<Relay>(new Relay(std::move(impl)));
}

Relay::Relay(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Relay::~Relay() { Shutdown(); }

int Relay::port() const { return impl_->port_; }

RelayCounts Relay::counts() const {
  return {impl_->calls_.load(), impl_->refused_.load(), impl_->open_.load()};
}

void Relay::Shutdown() { impl_->Shutdown(); }

}  // namespace muster
