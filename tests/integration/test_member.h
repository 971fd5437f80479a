// TestMember: a trainer's control-plane side, reduced to what the
// coordinator tests need: join, a real Session stream with a background
// heartbeat and event reader, and the other rpcs through the stub.
//
// Thread-safe for the methods tests call from several threads (events are
// guarded by a mutex).
#ifndef MUSTER_TESTS_INTEGRATION_TEST_MEMBER_H_
#define MUSTER_TESTS_INTEGRATION_TEST_MEMBER_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "muster/v1/coordinator.grpc.pb.h"

namespace muster {

class TestMember {
 public:
  TestMember(std::shared_ptr<grpc::Channel> channel, std::string token, std::string id,
             std::string node, uint64_t incarnation = 1);
  ~TestMember();

  absl::Status Join();
  // Opens the session, sends hello and starts heartbeating every `interval`.
  absl::Status OpenSession(absl::Duration interval = absl::Milliseconds(100));
  // Stops sending heartbeats but keeps the stream open (a hung process).
  void PauseHeartbeats() { paused_ = true; }
  // Cancels the stream (a killed process).
  void BreakSession();
  void set_step(int64_t step) { step_ = step; }

  absl::StatusOr<v1::RendezvousResponse> Rendezvous(uint64_t after, int64_t step,
                                                    absl::Duration timeout = absl::Seconds(20));
  absl::Status Leave(v1::LeaveRequest::Reason reason);

  // Waits until a regroup event arrived; returns it.
  absl::StatusOr<v1::RegroupEvent> WaitRegroup(absl::Duration timeout);
  // Waits until the stream ended; returns its final status.
  absl::StatusOr<grpc::Status> WaitSessionEnd(absl::Duration timeout);
  int acks() const { return acks_.load(); }

  v1::Coordinator::Stub* stub() { return stub_.get(); }
  v1::MemberRef ref() const;
  // A client context with the token and a deadline.
  std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout = absl::Seconds(10)) const;

 private:
  void ReadLoop();
  void HeartbeatLoop(absl::Duration interval);

  std::unique_ptr<v1::Coordinator::Stub> stub_;
  const std::string token_;
  const std::string id_;
  const std::string node_;
  const uint64_t incarnation_;
  std::atomic<bool> paused_{false};
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> step_{0};
  std::atomic<int> acks_{0};

  grpc::ClientContext session_ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::SessionRequest, v1::SessionEvent>> stream_;
  absl::Mutex write_mu_;
  std::thread reader_;
  std::thread heartbeater_;

  absl::Mutex mu_;
  std::vector<v1::RegroupEvent> regroups_ ABSL_GUARDED_BY(mu_);
  size_t regroups_taken_ ABSL_GUARDED_BY(mu_) = 0;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status end_status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace muster

#endif  // MUSTER_TESTS_INTEGRATION_TEST_MEMBER_H_
