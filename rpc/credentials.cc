#include "rpc/credentials.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "common/token.h"

namespace muster {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& what, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", what, " file ", path));
  std::ostringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFiles& tls) {
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  if (tls.cert.empty() || tls.key.empty()) {
    return absl::InvalidArgumentError("TLS needs both --tls-cert and --tls-key");
  }
  grpc::SslServerCredentialsOptions options(
      tls.ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                     : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  MUSTER_ASSIGN_OR_RETURN(pair.private_key, ReadPem("TLS key", tls.key));
  MUSTER_ASSIGN_OR_RETURN(pair.cert_chain, ReadPem("TLS certificate", tls.cert));
  options.pem_key_cert_pairs.push_back(pair);
  if (!tls.ca.empty()) {
    MUSTER_ASSIGN_OR_RETURN(options.pem_root_certs, ReadPem("TLS CA", tls.ca));
  }
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsFiles& tls) {
  if (!tls.enabled()) return grpc::InsecureChannelCredentials();
  if (tls.ca.empty()) return absl::InvalidArgumentError("a TLS client needs --tls-ca");
  if (tls.cert.empty() != tls.key.empty()) {
    return absl::InvalidArgumentError("a client certificate needs both --tls-cert and --tls-key");
  }
  grpc::SslCredentialsOptions options;
  MUSTER_ASSIGN_OR_RETURN(options.pem_root_certs, ReadPem("TLS CA", tls.ca));
  if (!tls.cert.empty()) {
    MUSTER_ASSIGN_OR_RETURN(options.pem_cert_chain, ReadPem("TLS certificate", tls.cert));
    MUSTER_ASSIGN_OR_RETURN(options.pem_private_key, ReadPem("TLS key", tls.key));
  }
  return grpc::SslCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& target,
                                                           const TlsFiles& tls, int connection) {
  MUSTER_ASSIGN_OR_RETURN(auto creds, MakeChannelCredentials(tls));
  grpc::ChannelArguments args;
  if (connection >= 0) {
    // Channels with different arguments do not share a subchannel.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetInt("muster.connection", connection);
  }
  args.SetMaxReceiveMessageSize(64 << 20);
  // gRPC's own reconnect backoff (1 s, growing by 1.6 up to 120 s) would
  // hold every client of a restarted coordinator for seconds after it
  // listens again, whatever the callers' retry loops do. Reconnect from
  // 100 ms up to 1 s (jittered by gRPC) instead: the callers' loops back
  // off on their own, and a node's trainers reach the coordinator through
  // the agent's one channel.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // A coordinator that hangs (or whose node is cut off) leaves its TCP
  // connection looking alive; calls in flight would wait out their
  // deadlines. While a call is in flight, ping every 5 s and drop the
  // connection when a ping goes 3 s unanswered: the call fails UNAVAILABLE
  // and is retried, at the address a failover wrote (docs/failover.md).
  // The coordinator accepts pings every second (server.cc).
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 3000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  return grpc::CreateCustomChannel(target, creds, args);
}

void ApplyServerConnectionRules(grpc::ServerBuilder* builder, absl::Duration handshake_timeout,
                                absl::Duration max_connection_idle) {
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
  // One server per port: with SO_REUSEPORT (gRPC's default) a second
  // coordinator on the same port would bind too, and joins would split
  // between two jobs' worth of state. (A rebuilt listener binds after the
  // dead one was shut down: SO_REUSEADDR, which gRPC sets, lets it.)
  builder->AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Idle connections, authenticated or not, do not hold descriptors for
  // long (docs/security.md).
  builder->AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                              static_cast<int>(absl::ToInt64Milliseconds(handshake_timeout)));
  builder->AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                              static_cast<int>(absl::ToInt64Milliseconds(max_connection_idle)));
}

void AttachToken(grpc::ClientContext* context, const std::string& token) {
  if (!token.empty()) context->AddMetadata(kAuthMetadataKey, absl::StrCat("Bearer ", token));
}

absl::Status CheckToken(const grpc::ServerContextBase& context, const std::string& expected) {
  if (expected.empty()) return absl::OkStatus();
  const auto& md = context.client_metadata();
  auto it = md.find(kAuthMetadataKey);
  if (it == md.end()) {
    return absl::UnauthenticatedError("missing job token (authorization: Bearer ...)");
  }
  absl::string_view value(it->second.data(), it->second.size());
  constexpr absl::string_view kPrefix = "Bearer ";
  if (value.substr(0, kPrefix.size()) != kPrefix ||
      !ConstantTimeEquals(value.substr(kPrefix.size()), expected)) {
    return absl::UnauthenticatedError("wrong job token");
  }
  return absl::OkStatus();
}

}  // namespace muster
