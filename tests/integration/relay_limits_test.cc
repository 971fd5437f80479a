// A relay in this process in front of a coordinator in this process: what
// the relay refuses itself instead of passing on.
#include <gtest/gtest.h>

#include <string>

#include "absl/time/clock.h"
#include "coordinator/server.h"
#include "muster/v1/coordinator.grpc.pb.h"
#include "relay/relay.h"
#include "rpc/credentials.h"

namespace muster {
namespace {

// A message over the relay's limit is refused there (RESOURCE_EXHAUSTED),
// not buffered and passed on: the coordinator behind it, whose limit is
// larger here, would have answered it (ABORTED: generation 0 is over).
TEST(RelayLimitsTest, AMessageOverTheLimitIsRefusedAtTheRelay) {
  ServerOptions o;
  o.token = "t";
  auto server = std::move(CoordinatorServer::Start(o)).value();
  RelayOptions r;
  r.listen = "127.0.0.1:0";
  r.coordinator = "127.0.0.1:" + std::to_string(server->port());
  r.max_message_bytes = 1 << 20;
  auto relay = std::move(Relay::Start(r)).value();
  auto stub = v1::Coordinator::NewStub(
      *MakeChannel("127.0.0.1:" + std::to_string(relay->port()), {}));
  auto set = [&](size_t bytes) {
    v1::KvSetRequest req;
    req.set_key("k");
    req.set_value(std::string(bytes, 'x'));
    v1::KvSetResponse resp;
    grpc::ClientContext ctx;
    AttachToken(&ctx, "t");
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    return stub->KvSet(&ctx, req, &resp);
  };
  EXPECT_EQ(set(2 << 20).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(set(1000).error_code(), grpc::StatusCode::ABORTED);
}

}  // namespace
}  // namespace muster
