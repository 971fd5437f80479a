// CoordinatorHarness: the real CoordinatorService over a real Coordinator
// (SQLite state in memory, a FakeClock), served on an in-process gRPC
// channel, with the checks coordinator_fuzz makes after every call.
//
// One gRPC server lives for many inputs; each input gets a fresh Coordinator
// (Begin/End), so an input replays the same way on its own. The server
// dispatches through a forwarder to the current input's CoordinatorService.
// Calls run one at a time: a call that blocks in the coordinator (Rendezvous,
// KvGet with a wait, Barrier) stays pending while later calls run, and is
// completed by them, by Tick(), or by the shutdown at End(). No thread but
// the caller's changes the coordinator's state between calls, which is what
// lets a rejected call be checked to have changed nothing.
//
// Every violation prints what happened and calls abort(), which libFuzzer
// reports with the input:
//   - a call with a wrong or missing token is not UNAUTHENTICATED, or the
//     coordinator's state differs after it;
//   - a call with the token fails with a code the protocol does not use
//     (UNKNOWN, INTERNAL, UNIMPLEMENTED, DATA_LOSS, CANCELLED,
//     UNAUTHENTICATED; DEADLINE_EXCEEDED for a call that does not block);
//   - a successful answer contradicts its request (a world without the
//     caller at its rank, KvGet values not matching the keys, ...);
//   - the generation goes back, or a world forms with generation 0;
//   - GetStatus fails, or a call never completes (after the shutdown).
//
// MUSTER_FUZZ_TRACE=1 in the environment prints every call and its answer
// (to see what a crashing input does).
//
// Not thread-safe: used from libFuzzer's one thread.
#ifndef MUSTER_TESTS_FUZZ_COORDINATOR_HARNESS_H_
#define MUSTER_TESTS_FUZZ_COORDINATOR_HARNESS_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/fake_clock.h"
#include "coordinator/coordinator.h"
#include "coordinator/grpc_service.h"
#include "coordinator/metrics.h"
#include "coordinator/state_store.h"
#include "muster/v1/coordinator.grpc.pb.h"
#include "rpc/async_bidi.h"
#include "tests/fuzz/coordinator_input.h"

namespace muster::fuzz {

// Prints `what` and aborts.
[[noreturn]] void Fail(const std::string& what);

class CoordinatorHarness {
 public:
  using Stub = v1::Coordinator::Stub;
  template <typename Req, typename Resp>
  using AsyncMethod = void (Stub::async::*)(grpc::ClientContext*, const Req*, Resp*,
                                           std::function<void(grpc::Status)>);
  // Checks a successful answer; aborts (through Fail) when it is wrong.
  template <typename Req, typename Resp>
  using Check = std::function<void(const Req&, const Resp&)>;

  // The process-wide harness (never destroyed).
  static CoordinatorHarness& Get();

  // Starts a fresh coordinator with `options` (its clock is replaced by a
  // FakeClock). False when the options are invalid.
  bool Begin(CoordinatorOptions options);
  // Checks that GetStatus answers, shuts the coordinator down, and waits for
  // every call and session of the input to end.
  void End();

  // Sends one unary rpc and waits until the service has handled it; unless
  // `blocks`, also for the answer. `check` runs on a successful answer.
  template <typename Req, typename Resp>
  void Unary(const char* name, AsyncMethod<Req, Resp> method, const Req& req, Auth auth,
             bool blocks, Check<Req, Resp> check = nullptr);

  // Opens a Session and writes `messages`. When they are a hello and
  // heartbeats, the session stays open (up to kMaxSessions; more are closed
  // at once); a node session is closed by the harness; otherwise the server
  // must end it.
  void OpenSession(const std::vector<v1::SessionRequest>& messages, Auth auth);
  // A heartbeat / the client's close on open session `index` (modulo the
  // number open; nothing when none is).
  void SessionHeartbeat(size_t index, int64_t step, uint64_t sequence);
  void CloseSession(size_t index);

  // Advances the fake clock by `d` and runs the coordinator's Tick().
  void Tick(absl::Duration d);
  // Shuts the coordinator down (as a killed process would leave its state
  // file) and starts a new one on the same state store.
  void Restart();

  // Checks what must hold between any two calls: the generation never goes
  // back, also across a restart, and a live world's generation is not 0
  // (which means "none yet").
  void AfterOp();

  // The current coordinator, for drawing plausible request fields.
  Coordinator* coordinator() { return instance_->coordinator.get(); }

 private:
  // One coordinator and the service over it.
  struct Instance {
    std::shared_ptr<FakeClock> clock;
    std::shared_ptr<StateStore> store;
    std::unique_ptr<Coordinator> coordinator;
    std::unique_ptr<CoordinatorService> service;
  };
  struct PendingCall {
    virtual ~PendingCall() = default;
    grpc::ClientContext context;
    const char* name = "";
    // Set before done; read after WaitDone.
    grpc::Status status;
    bool done = false;  // guarded by the harness's mu_
  };
  template <typename Req, typename Resp>
  struct TypedCall : PendingCall {
    Req request;
    Resp response;
  };
  struct ClientSession {
    std::unique_ptr<grpc::ClientContext> context;
    std::unique_ptr<grpc::ClientReaderWriter<v1::SessionRequest, v1::SessionEvent>> stream;
  };
  class Forwarder;

  CoordinatorHarness();
  void StartServer();
  void RecycleServer();
  // A coordinator over `clock` and `store`; aborts when it cannot be made.
  std::unique_ptr<Instance> NewInstance(std::shared_ptr<FakeClock> clock,
                                        std::shared_ptr<StateStore> store);
  // Shuts the current instance down, ends its sessions and calls, and keeps
  // it until the server is recycled (gRPC may still run a finished session
  // reactor's last callback into it).
  void Retire();

  // What a call with a bad token must leave unchanged.
  std::string StateFingerprint();
  void Authenticate(grpc::ClientContext* context, Auth auth);
  // Checks `status` of a call made with `auth`.
  void CheckStatus(const char* name, Auth auth, bool blocks, const grpc::Status& status,
                   const std::string& request);
  void Trace(const char* name, Auth auth, const std::string& request, const grpc::Status& status);
  // Counts one more call the service must handle; returns its ticket.
  uint64_t Expect();
  // Waits until the service has handled the call of `ticket`.
  void WaitHandled(uint64_t ticket, const char* name);
  void WaitDone(PendingCall* call);
  void MarkDone(PendingCall* call);
  // Reads a session to its end and checks its final status.
  void FinishSession(ClientSession* session, Auth auth);
  // Reads events until `acks` acknowledgements arrived (false: the stream ended).
  bool ReadAcks(ClientSession* session, int acks);

  const bool trace_;
  Metrics* metrics_ = nullptr;  // never destroyed
  // The Session streams' queue; outlives server_.
  std::unique_ptr<AsyncBidiServer<v1::SessionRequest, v1::SessionEvent>> session_queues_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Forwarder> forwarder_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<Stub> stub_;
  uint64_t inputs_ = 0;
  uint64_t generation_ = 0;  // the highest generation seen in this input

  CoordinatorOptions options_;
  std::unique_ptr<Instance> instance_;
  std::vector<std::unique_ptr<Instance>> retired_;
  std::vector<std::unique_ptr<PendingCall>> calls_;
  std::vector<ClientSession> sessions_;

  absl::Mutex mu_;
  uint64_t expected_ ABSL_GUARDED_BY(mu_) = 0;  // calls sent to the service
  uint64_t handled_ ABSL_GUARDED_BY(mu_) = 0;   // handler invocations returned
};

// ---------------------------------------------------------------- template

template <typename Req, typename Resp>
void CoordinatorHarness::Unary(const char* name, AsyncMethod<Req, Resp> method, const Req& req,
                               Auth auth, bool blocks, Check<Req, Resp> check) {
  const bool authorized = auth == Auth::kToken || auth == Auth::kToken2;
  const std::string before = authorized ? std::string() : StateFingerprint();
  auto owned = std::make_unique<TypedCall<Req, Resp>>();
  TypedCall<Req, Resp>* call = owned.get();
  calls_.push_back(std::move(owned));
  call->name = name;
  call->request = req;
  call->context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  Authenticate(&call->context, auth);
  const uint64_t ticket = Expect();
  (stub_->async()->*method)(
      &call->context, &call->request, &call->response,
      [this, call, auth, blocks, check](grpc::Status status) {
        if (trace_) Trace(call->name, auth, call->request.ShortDebugString(), status);
        CheckStatus(call->name, auth, blocks, status, call->request.ShortDebugString());
        if (status.ok() && check) check(call->request, call->response);
        call->status = status;
        MarkDone(call);
      });
  WaitHandled(ticket, name);
  if (!blocks || !authorized) WaitDone(call);
  if (!authorized && StateFingerprint() != before) {
    Fail(std::string(name) + " without the right token changed the coordinator's state; request: " +
         call->request.ShortDebugString() + "\nbefore:\n" + before + "\nafter:\n" +
         StateFingerprint());
  }
}

}  // namespace muster::fuzz

#endif  // MUSTER_TESTS_FUZZ_COORDINATOR_HARNESS_H_
