// Job tokens on the wire and TLS credentials, shared by every muster client
// and server. Stateless functions; thread-safe.
#ifndef MUSTER_RPC_CREDENTIALS_H_
#define MUSTER_RPC_CREDENTIALS_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "rpc/tls_files.h"

namespace muster {

// The metadata entry that carries the job token: "authorization: Bearer T".
inline constexpr char kAuthMetadataKey[] = "authorization";

// Errors: INVALID_ARGUMENT (cert without key or the reverse), NOT_FOUND
// (a file cannot be read).
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFiles& tls);
// For clients: TLS when `tls.ca` is set (verifying the server against it;
// cert+key add a client certificate), plain text otherwise.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsFiles& tls);

// A channel to `target` ("host:port"). Channels to the same target share
// one connection; with `connection` >= 0 the channel has a connection of
// its own (a relay's several to the coordinator). Errors: as
// MakeChannelCredentials.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& target,
                                                           const TlsFiles& tls,
                                                           int connection = -1);

// How long a connection may take to begin HTTP/2, and how long it may hold
// no call, before a muster server closes it (docs/security.md).
inline constexpr absl::Duration kHandshakeTimeout = absl::Seconds(2);
inline constexpr absl::Duration kMaxConnectionIdle = absl::Minutes(5);

// The connection rules every muster server applies (the coordinator, the
// relay, a trainer's state service): clients may ping every second, even between calls; one server
// per port (no SO_REUSEPORT); a connection that has not begun HTTP/2 after
// `handshake_timeout`, or has held no call for `max_connection_idle`, is
// closed.
void ApplyServerConnectionRules(grpc::ServerBuilder* builder, absl::Duration handshake_timeout,
                                absl::Duration max_connection_idle);

// Adds the token to a client call (no-op for an empty token).
void AttachToken(grpc::ClientContext* context, const std::string& token);

// OK when `context` carries `expected` (constant-time compare) or `expected`
// is empty; UNAUTHENTICATED otherwise.
absl::Status CheckToken(const grpc::ServerContextBase& context, const std::string& expected);

}  // namespace muster

#endif  // MUSTER_RPC_CREDENTIALS_H_
