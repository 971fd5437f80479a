// Server-side bidirectional streams on gRPC's completion-queue API, spread
// over several completion queues, with a reactor interface like the callback
// API's (grpc::ServerBidiReactor: StartRead, StartWrite, Finish, OnReadDone,
// OnWriteDone, OnDone), so that a reactor written for one runs on the other.
//
// Why: a long-lived stream keeps operations pending on its queue (a read and
// the call's end), and gRPC builds without NDEBUG (Debian's) scan a queue's
// pending operations once per completion. The callback API puts every
// stream of a process on one queue, so each completion costs a scan of all
// of them; at 12,500 node streams that scan was a third of the
// coordinator's CPU (docs/scale.md). Here the streams are spread over
// several queues, each served by its own thread, and a scan covers one
// queue's share.
//
// Contract, as the callback API's: OnReadDone runs once per StartRead and
// OnWriteDone once per StartWrite, with false when the operation failed (the
// stream broke or ended); at most one read and one write are outstanding;
// Finish is called once, when no write is outstanding; OnDone is the last
// callback, after Finish completed and the call ended, and the reactor may
// delete itself there. A stream's callbacks never run concurrently with each
// other (one thread serves its queue). StartWrite and Finish may be called
// from any thread.
#ifndef MUSTER_RPC_ASYNC_BIDI_H_
#define MUSTER_RPC_ASYNC_BIDI_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace muster {

// What a completion-queue tag points at: the end of one operation.
class AsyncTag {
 public:
  virtual void Done(bool ok) = 0;

 protected:
  ~AsyncTag() = default;
};

template <typename Request, typename Response>
class AsyncBidiCall;

// The application's side of one stream. Made by AsyncBidiServer's factory
// when a call arrives; lives until its OnDone.
template <typename Request, typename Response>
class AsyncBidiReactor {
 public:
  using Call = AsyncBidiCall<Request, Response>;
  explicit AsyncBidiReactor(Call* call) : call_(call) { call->Bind(this); }
  AsyncBidiReactor(const AsyncBidiReactor&) = delete;
  AsyncBidiReactor& operator=(const AsyncBidiReactor&) = delete;

  // `*request` must stay valid until OnReadDone.
  void StartRead(Request* request) { call_->Read(request); }
  // `*response` must stay valid until OnWriteDone.
  void StartWrite(const Response* response) { call_->Write(response); }
  void Finish(const grpc::Status& status) { call_->Finish(status); }

  virtual void OnReadDone(bool ok) = 0;
  virtual void OnWriteDone(bool ok) = 0;
  virtual void OnDone() = 0;

 protected:
  virtual ~AsyncBidiReactor() = default;
  // The call's context, valid until OnDone returns.
  grpc::ServerContext* context() { return call_->context(); }

 private:
  Call* const call_;
};

// One call's gRPC state and its pending operations. Deletes itself after
// its reactor's OnDone.
template <typename Request, typename Response>
class AsyncBidiCall {
 public:
  using Reactor = AsyncBidiReactor<Request, Response>;
  using Stream = grpc::ServerAsyncReaderWriter<Response, Request>;

  AsyncBidiCall() : stream_(&context_) { context_.AsyncNotifyWhenDone(&ended_); }
  AsyncBidiCall(const AsyncBidiCall&) = delete;
  AsyncBidiCall& operator=(const AsyncBidiCall&) = delete;

  grpc::ServerContext* context() { return &context_; }
  Stream* stream() { return &stream_; }

 private:
  friend Reactor;
  template <typename, typename>
  friend class AsyncBidiServer;

  // A pending operation's tag: calls `on` with its result.
  struct Op final : AsyncTag {
    Op(AsyncBidiCall* call, void (AsyncBidiCall::*on)(bool)) : call(call), on(on) {}
    void Done(bool ok) override { (call->*on)(ok); }
    AsyncBidiCall* const call;
    void (AsyncBidiCall::*const on)(bool);
  };

  ~AsyncBidiCall() = default;

  void Bind(Reactor* reactor) { reactor_ = reactor; }
  void Read(Request* request) {
    Begin();
    stream_.Read(request, &read_);
  }
  void Write(const Response* response) {
    Begin();
    stream_.Write(*response, &write_);
  }
  void Finish(const grpc::Status& status) {
    Begin();
    stream_.Finish(status, &finish_);
  }

  void ReadDone(bool ok) {
    reactor_->OnReadDone(ok);
    End(/*finished=*/false);
  }
  void WriteDone(bool ok) {
    reactor_->OnWriteDone(ok);
    End(/*finished=*/false);
  }
  void FinishDone(bool /*ok*/) { End(/*finished=*/true); }
  // The call ended (finished, cancelled or broken): AsyncNotifyWhenDone.
  // Not an operation begun with Begin.
  void CallEnded(bool /*ok*/) {
    {
      absl::MutexLock lock(&mu_);
      ended_seen_ = true;
      if (!DoneLocked()) return;
    }
    Retire();
  }

  void Begin() {
    absl::MutexLock lock(&mu_);
    ++pending_;
  }
  // An operation begun with Begin completed (its callback has run).
  void End(bool finished) {
    {
      absl::MutexLock lock(&mu_);
      --pending_;
      if (finished) finished_ = true;
      if (!DoneLocked()) return;
    }
    Retire();
  }
  bool DoneLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return pending_ == 0 && finished_ && ended_seen_;
  }
  void Retire() {
    if (reactor_ != nullptr) reactor_->OnDone();
    std::function<void()> retired = std::move(retired_);
    delete this;
    retired();
  }

  grpc::ServerContext context_;
  Stream stream_;
  Reactor* reactor_ = nullptr;
  // Tells the server that this call is gone.
  std::function<void()> retired_;
  Op read_{this, &AsyncBidiCall::ReadDone};
  Op write_{this, &AsyncBidiCall::WriteDone};
  Op finish_{this, &AsyncBidiCall::FinishDone};
  Op ended_{this, &AsyncBidiCall::CallEnded};
  absl::Mutex mu_;
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_seen_ ABSL_GUARDED_BY(mu_) = false;
};

// Serves one bidirectional-streaming method on `queues`, one thread each.
// Construct with the queues the server was built with (ServerBuilder::
// AddCompletionQueue), Start after the server started, and Shutdown after
// the server's Shutdown returned: it waits until every call has ended, then
// shuts the queues down and joins their threads. Destroy the server before
// this object (the queues outlive it).
template <typename Request, typename Response>
class AsyncBidiServer {
 public:
  using Call = AsyncBidiCall<Request, Response>;
  using Reactor = AsyncBidiReactor<Request, Response>;
  // Asks the server for the next call of the method on `queue` (the
  // generated service's RequestMETHOD, with `queue` as both queues).
  using RequestCall = std::function<void(grpc::ServerContext*, typename Call::Stream*,
                                         grpc::ServerCompletionQueue* queue, void* tag)>;
  // Makes the reactor of a call that arrived (it binds itself to `call`).
  using MakeReactor = std::function<Reactor*(Call* call)>;

  AsyncBidiServer(std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> queues,
                  RequestCall request, MakeReactor make)
      : queues_(std::move(queues)), request_(std::move(request)), make_(std::move(make)) {}
  AsyncBidiServer(const AsyncBidiServer&) = delete;
  AsyncBidiServer& operator=(const AsyncBidiServer&) = delete;
  ~AsyncBidiServer() { Shutdown(); }

  void Start() {
    for (const auto& queue : queues_) {
      grpc::ServerCompletionQueue* q = queue.get();
      threads_.emplace_back([q] { Serve(q); });
      AskForCall(q);
    }
  }

  // Waits until every call has ended and every request was answered (the
  // server's Shutdown cancels both), then stops the queues. Idempotent.
  void Shutdown() {
    {
      absl::MutexLock lock(&mu_);
      if (stopped_) return;
      stopping_ = true;
      mu_.Await(absl::Condition(+[](int* calls) { return *calls == 0; }, &calls_));
      stopped_ = true;
    }
    for (const auto& queue : queues_) queue->Shutdown();
    for (std::thread& t : threads_) t.join();
  }

 private:
  // A request for the next call on one queue.
  struct Waiting final : AsyncTag {
    Waiting(AsyncBidiServer* server, grpc::ServerCompletionQueue* queue)
        : server(server), queue(queue), call(new Call()) {
      call->retired_ = [server] { server->Retired(); };
    }
    void Done(bool ok) override {
      if (ok) {
        server->AskForCall(queue);
        server->make_(call);
      } else {
        call->Retire();  // the server is shutting down; the call never began
      }
      delete this;
    }
    AsyncBidiServer* const server;
    grpc::ServerCompletionQueue* const queue;
    Call* const call;
  };

  static void Serve(grpc::ServerCompletionQueue* queue) {
    void* tag = nullptr;
    bool ok = false;
    while (queue->Next(&tag, &ok)) static_cast<AsyncTag*>(tag)->Done(ok);
  }

  void AskForCall(grpc::ServerCompletionQueue* queue) {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      ++calls_;
    }
    auto* w = new Waiting(this, queue);
    request_(w->call->context(), w->call->stream(), queue, static_cast<AsyncTag*>(w));
  }

  void Retired() {
    absl::MutexLock lock(&mu_);
    --calls_;
  }

  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> queues_;
  const RequestCall request_;
  const MakeReactor make_;
  std::vector<std::thread> threads_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  // Calls requested, open or ending: each is deleted before the queues
  // shut down.
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace muster

#endif  // MUSTER_RPC_ASYNC_BIDI_H_
