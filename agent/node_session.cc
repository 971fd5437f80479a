// Start and stop of the node session, the trainers' socket and the service
// they call (node_session_impl.h).
#include "agent/node_session.h"

#include <grpcpp/grpcpp.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "rpc/agent_protocol.h"
#include "rpc/credentials.h"
#include "agent/node_session_impl.h"

namespace muster {
namespace node_session_internal {

absl::Status NodeSessionImpl::Init() {
  if (o_.coordinator.empty() || o_.node.empty()) {
    return absl::InvalidArgumentError("a node session needs the coordinator and the node");
  }
  std::string tmpl = o_.runtime_dir + "/muster-agent.XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) {  // 0700
    return absl::InternalError(absl::StrCat("cannot make a directory under ", o_.runtime_dir,
                                            ": ", std::strerror(errno)));
  }
  dir_ = tmpl;
  socket_ = dir_ + "/session.sock";
  if (socket_.size() >= sizeof(sockaddr_un{}.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the agent's socket path ", socket_, " is too long for a Unix socket; set TMPDIR to a "
        "shorter directory"));
  }
  MUSTER_ASSIGN_OR_RETURN(coordinator_, CoordinatorChannel::Create(o_.coordinator, o_.tls));
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address(), grpc::InsecureServerCredentials());
  builder.RegisterService(this);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr) {
    return absl::InternalError(absl::StrCat("cannot serve trainers on ", address()));
  }
  thread_ = std::thread([this] { ConnectLoop(); });
  MUSTER_LOG(INFO) << "muster-agent: node " << o_.node << ": one session with "
                   << o_.coordinator << " for this node's trainers, which reach it on "
                   << address();
  return absl::OkStatus();
}

NodeSessionImpl::~NodeSessionImpl() {
  EnterStopping();
  if (thread_.joinable()) thread_.join();
  if (server_ != nullptr) {
    server_->Shutdown(SystemDeadline(clock_->Now() + absl::Seconds(1), clock_));
  }
  if (!socket_.empty()) ::unlink(socket_.c_str());
  if (!dir_.empty()) ::rmdir(dir_.c_str());
}

grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionEvent>* NodeSessionImpl::Session(
    grpc::CallbackServerContext* ctx) {
  pid_t pid = 0;
  auto it = ctx->client_metadata().find(kTrainerPidMetadata);
  if (it != ctx->client_metadata().end()) {
    int value = 0;
    if (absl::SimpleAtoi(absl::string_view(it->second.data(), it->second.size()), &value)) {
      pid = value;
    }
  }
  return new LocalSession(this, CheckToken(*ctx, o_.token), pid);
}

grpc::ServerUnaryReactor* NodeSessionImpl::Rendezvous(grpc::CallbackServerContext* ctx,
                                                      const v1::RendezvousRequest* request,
                                                      v1::RendezvousResponse* response) {
  auto* call = new RelayedRendezvous(this, response);
  call->Start(CheckToken(*ctx, o_.token), *request);
  return call;
}

}  // namespace node_session_internal

absl::StatusOr<std::unique_ptr<NodeSession>> NodeSession::Start(NodeSessionOptions options) {
  if (options.clock == nullptr) {
    return absl::InvalidArgumentError("NodeSessionOptions::clock is not set");
  }
  auto session = std::make_unique<node_session_internal::NodeSessionImpl>(std::move(options));
  MUSTER_RETURN_IF_ERROR(session->Init());
  return session;
}

}  // namespace muster
