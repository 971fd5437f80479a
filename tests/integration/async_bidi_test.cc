// rpc/async_bidi.h over real gRPC on loopback: streams on several
// completion queues (which queue gRPC gives a call to is its choice) are
// each answered in order, the reactor's contract
// (OnDone last, once) holds, and Shutdown ends open streams instead of
// waiting for them.
#include "rpc/async_bidi.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "muster/v1/coordinator.grpc.pb.h"

namespace muster {
namespace {

using Service = v1::Coordinator::WithAsyncMethod_Session<v1::Coordinator::Service>;
using Call = AsyncBidiCall<v1::SessionRequest, v1::SessionEvent>;

// What the reactors saw, from every thread.
struct Seen {
  absl::Mutex mu;
  int done ABSL_GUARDED_BY(mu) = 0;
  std::atomic<int> callbacks_in_flight{0};
  std::atomic<bool> overlapped{false};
};

// Answers each heartbeat with an ack of its sequence; finishes OK when the
// client is done writing, or UNAVAILABLE when the read fails otherwise.
class EchoReactor : public AsyncBidiReactor<v1::SessionRequest, v1::SessionEvent> {
 public:
  EchoReactor(Call* call, Seen* seen) : AsyncBidiReactor(call), seen_(seen) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    Enter();
    if (!ok) {
      FinishOnce();
      Leave();
      return;
    }
    {
      absl::MutexLock lock(&mu_);
      event_.mutable_ack()->set_sequence(request_.heartbeat().sequence());
      writing_ = true;
    }
    StartWrite(&event_);
    Leave();
  }

  void OnWriteDone(bool ok) override {
    Enter();
    bool finish = false;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      finish = finish_pending_;
    }
    if (ok) StartRead(&request_);
    if (finish) DoFinish();
    Leave();
  }

  void OnDone() override {
    {
      absl::MutexLock lock(&seen_->mu);
      ++seen_->done;
    }
    delete this;
  }

 private:
  ~EchoReactor() override = default;

  void FinishOnce() {
    {
      absl::MutexLock lock(&mu_);
      if (writing_) {
        finish_pending_ = true;
        return;
      }
    }
    DoFinish();
  }
  void DoFinish() {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    finished_ = true;
    Finish(grpc::Status::OK);
  }
  // One stream's callbacks never overlap; each queue has one thread.
  void Enter() {
    if (busy_.exchange(true)) seen_->overlapped = true;
  }
  void Leave() { busy_ = false; }

  Seen* const seen_;
  v1::SessionRequest request_;
  v1::SessionEvent event_;
  std::atomic<bool> busy_{false};
  absl::Mutex mu_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

class AsyncBidiTest : public ::testing::Test {
 protected:
  void Start(int queues) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&service_);
    std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> qs;
    for (int i = 0; i < queues; ++i) qs.push_back(builder.AddCompletionQueue());
    sessions_ = std::make_unique<AsyncBidiServer<v1::SessionRequest, v1::SessionEvent>>(
        std::move(qs),
        [this](grpc::ServerContext* ctx, Call::Stream* stream, grpc::ServerCompletionQueue* q,
               void* tag) { service_.RequestSession(ctx, stream, q, q, tag); },
        [this](Call* call) { return new EchoReactor(call, &seen_); });
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    sessions_->Start();
    stub_ = v1::Coordinator::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(port_), grpc::InsecureChannelCredentials()));
  }

  void TearDown() override {
    if (server_ != nullptr) {
      server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(100));
      sessions_->Shutdown();
    }
  }

  int done() {
    absl::MutexLock lock(&seen_.mu);
    return seen_.done;
  }

  Service service_;
  Seen seen_;
  int port_ = 0;
  std::unique_ptr<AsyncBidiServer<v1::SessionRequest, v1::SessionEvent>> sessions_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
};

TEST_F(AsyncBidiTest, StreamsOnSeveralQueuesAreEachAnsweredInOrder) {
  Start(/*queues=*/3);
  constexpr int kStreams = 24;
  constexpr int kMessages = 50;
  std::atomic<int> wrong{0};
  std::vector<std::thread> clients;
  for (int s = 0; s < kStreams; ++s) {
    clients.emplace_back([&, s] {
      grpc::ClientContext ctx;
      auto stream = stub_->Session(&ctx);
      for (int i = 0; i < kMessages; ++i) {
        v1::SessionRequest req;
        req.mutable_heartbeat()->set_sequence(static_cast<uint64_t>(s * 1000 + i));
        v1::SessionEvent ack;
        if (!stream->Write(req) || !stream->Read(&ack) ||
            ack.ack().sequence() != req.heartbeat().sequence()) {
          ++wrong;
        }
      }
      stream->WritesDone();
      v1::SessionEvent extra;
      if (stream->Read(&extra)) ++wrong;
      if (!stream->Finish().ok()) ++wrong;
    });
  }
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(wrong.load(), 0);
  // Each reactor's OnDone came once, after its stream finished.
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (done() < kStreams && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(done(), kStreams);
  EXPECT_FALSE(seen_.overlapped.load());
}

TEST_F(AsyncBidiTest, ShutdownEndsStreamsThatAreStillOpen) {
  Start(/*queues=*/2);
  constexpr int kStreams = 6;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReaderWriter<v1::SessionRequest, v1::SessionEvent>>>
      streams;
  for (int s = 0; s < kStreams; ++s) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    streams.push_back(stub_->Session(contexts.back().get()));
    v1::SessionRequest req;
    req.mutable_heartbeat()->set_sequence(1);
    v1::SessionEvent ack;
    ASSERT_TRUE(streams.back()->Write(req));
    ASSERT_TRUE(streams.back()->Read(&ack));
  }
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(50));
  sessions_->Shutdown();  // returns only once every call is gone
  EXPECT_EQ(done(), kStreams);
  for (auto& stream : streams) {
    v1::SessionEvent ack;
    EXPECT_FALSE(stream->Read(&ack));
    EXPECT_FALSE(stream->Finish().ok());
  }
  server_.reset();
}

}  // namespace
}  // namespace muster
