// The trainer's state service over real gRPC: token checks, waiting for the
// requested step boundary, chunked transfer with a checksum.
#include "trainer/elastic/state_server.h"

#include <grpcpp/grpcpp.h>

#include <thread>

#include <gtest/gtest.h>

#include "absl/time/clock.h"
#include "muster/v1/state.grpc.pb.h"
#include "rpc/credentials.h"
#include "trainer/checkpoint/safetensors.h"

namespace muster {
namespace {

class StateServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StateServerOptions o{"127.0.0.1:0", "job-token", {}, "n/1", RealClock::Get()};
    server_ = std::move(StateServer::Start(o)).value();
    stub_ = v1::State::NewStub(
        *MakeChannel("127.0.0.1:" + std::to_string(server_->port()), {}));
  }

  // Until a call waits for some step (at most 10 s): a caller's thread
  // may start late.
  void AwaitCall() {
    const absl::Time end = absl::Now() + absl::Seconds(10);
    while (absl::Now() < end && !server_->Wanted(1'000'000)) absl::SleepFor(absl::Milliseconds(1));
  }

  // Pulls the state after `at_step`: the status, and the bytes and step.
  grpc::Status Pull(const std::string& token, int64_t at_step, std::string* bytes,
                    int64_t* step, uint32_t timeout_ms = 5000) {
    grpc::ClientContext ctx;
    AttachToken(&ctx, token);
    ctx.set_deadline(
        absl::ToChronoTime(absl::Now() + absl::Milliseconds(timeout_ms) + absl::Seconds(5)));
    v1::PullStateRequest req;
    req.set_at_step(at_step);
    req.set_timeout_ms(timeout_ms);
    auto reader = stub_->PullState(&ctx, req);
    v1::StateChunk chunk;
    std::string xxh3;
    while (reader->Read(&chunk)) {
      if (chunk.offset() == 0) {
        *step = chunk.step();
        xxh3 = chunk.xxh3();
        EXPECT_EQ(chunk.member_id(), "n/1");
      }
      EXPECT_EQ(chunk.offset(), bytes->size());
      *bytes += chunk.data();
    }
    grpc::Status s = reader->Finish();
    if (s.ok()) {
      EXPECT_EQ(Xxh3Hex(bytes->data(), bytes->size()), xxh3);
    }
    return s;
  }

  std::unique_ptr<StateServer> server_;
  std::unique_ptr<v1::State::Stub> stub_;
};

// Without a job token the weights are not served to the network: a wildcard
// host becomes loopback; a token or an explicit host keeps the address.
TEST(StateListenAddressTest, WithoutATokenAWildcardBecomesLoopback) {
  EXPECT_EQ(StateListenAddress("0.0.0.0:0", ""), "127.0.0.1:0");
  EXPECT_EQ(StateListenAddress("[::]:7000", ""), "127.0.0.1:7000");
  EXPECT_EQ(StateListenAddress(":7000", ""), "127.0.0.1:7000");
  EXPECT_EQ(StateListenAddress("0.0.0.0:0", "secret"), "0.0.0.0:0");
  EXPECT_EQ(StateListenAddress("10.1.2.3:7000", ""), "10.1.2.3:7000");
}

TEST_F(StateServerTest, NoOrWrongTokenIsRefused) {
  std::string bytes;
  int64_t step = -1;
  EXPECT_EQ(Pull("", 0, &bytes, &step).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Pull("wrong", 0, &bytes, &step).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_FALSE(server_->Wanted(1'000'000)) << "a refused call must not wait for the state";
}

TEST_F(StateServerTest, WaitsForTheStepBoundaryAndSendsEveryChunk) {
  std::string bytes;
  int64_t step = -1;
  grpc::Status status;
  std::thread caller([&] { status = Pull("job-token", 7, &bytes, &step); });
  // The call is waiting before the training thread steps, however slow the
  // caller's thread was to start.
  AwaitCall();
  // The training thread: steps 1.. until someone wants its state.
  std::string state(3 * (1 << 20) + 12345, '\0');  // more than two chunks
  for (size_t i = 0; i < state.size(); ++i) state[i] = static_cast<char>(i * 131);
  int64_t s = 0;
  const absl::Time end = absl::Now() + absl::Seconds(10);
  while (absl::Now() < end && s < 100) {
    ++s;
    if (server_->Wanted(s)) {
      EXPECT_EQ(s, 7) << "wanted before the requested step";
      server_->Publish(s, 3, state);
      break;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  caller.join();
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(step, 7);
  EXPECT_EQ(bytes, state);
  EXPECT_FALSE(server_->Wanted(100));
}

// `muster pull-weights --step` far ahead waits for minutes while its
// channel pings the server every 5 s (rpc/credentials.h): the server must
// accept those pings, not end the call with "too many pings".
TEST_F(StateServerTest, APullThatWaitsThroughTheClientsKeepalivePingsIsServed) {
  std::string bytes;
  int64_t step = -1;
  grpc::Status status;
  std::thread caller([&] { status = Pull("job-token", 5, &bytes, &step, /*timeout_ms=*/40000); });
  AwaitCall();
  ASSERT_TRUE(server_->Wanted(5));
  // Past the server's strikes: a first ping, then three too soon after it.
  absl::SleepFor(absl::Seconds(27));
  server_->Publish(5, 2, "weights after step 5");
  caller.join();
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(step, 5);
  EXPECT_EQ(bytes, "weights after step 5");
}

TEST_F(StateServerTest, NoStepBoundaryInTimeIsDeadlineExceeded) {
  std::string bytes;
  int64_t step = -1;
  const grpc::Status s = Pull("job-token", 5, &bytes, &step, /*timeout_ms=*/100);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_NE(s.error_message().find("step 5"), std::string::npos) << s.error_message();
}

TEST_F(StateServerTest, ShutdownEndsWaitingCalls) {
  std::string bytes;
  int64_t step = -1;
  grpc::Status status;
  std::thread caller([&] { status = Pull("job-token", 0, &bytes, &step); });
  while (!server_->Wanted(1)) absl::SleepFor(absl::Milliseconds(1));
  server_->Shutdown();
  caller.join();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
}

}  // namespace
}  // namespace muster
