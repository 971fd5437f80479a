// WriteQueue: the writing half of a server-side bidirectional stream (gRPC's
// callback API, or rpc/async_bidi.h's reactors), which allows one write in flight at a time. Messages queued
// from any thread are written in order, one after the other; Close finishes
// the stream once what was queued before it has been written.
//
// The owning reactor forwards its OnWriteDone to WriteDone. After Close,
// further Write and Close calls are ignored. A failed write (the peer is
// gone) drops what is queued and finishes the stream with UNAVAILABLE
// unless Close already chose a status.
//
// Merging (EnableMerge): messages queued while a write is in flight go out
// as one message when it is done, and inside a WriteBatch
// (common/write_batch.h) the queue holds its writes until the batch ends
// and then sends them as one. The peer must understand the merged message.
//
// Thread-safe. The reactor must outlive every call into the queue that can
// reach it (gRPC keeps a reactor alive until OnDone, which comes only after
// Finish, and Finish is called at most once, from here).
#ifndef MUSTER_RPC_WRITE_QUEUE_H_
#define MUSTER_RPC_WRITE_QUEUE_H_

#include <grpcpp/grpcpp.h>

#include <deque>
#include <functional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/write_batch.h"
#include "rpc/status.h"

namespace muster {

// `Reactor`: grpc::ServerBidiReactor, or AsyncBidiReactor (rpc/async_bidi.h).
template <typename Request, typename Response,
          typename Reactor = grpc::ServerBidiReactor<Request, Response>>
class WriteQueue final : public HeldWrites {
 public:
  // Replaces the messages of a queue of two or more with one message that
  // carries them all, in order.
  using Merge = std::function<void(std::deque<Response>*)>;

  explicit WriteQueue(Reactor* reactor) : reactor_(reactor) {}

  void EnableMerge(Merge merge) {
    absl::MutexLock lock(&mu_);
    merge_ = std::move(merge);
  }

  // Queues `msg`; starts writing it when nothing else is being written
  // (with merging, inside a WriteBatch: when the batch ends).
  void Write(Response msg) {
    const Response* first = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (close_pending_) return;
      queue_.push_back(std::move(msg));
      if (writing_) return;
      writing_ = true;
      if (merge_ && WriteBatch::Hold(this)) return;  // Flush writes it
      first = &queue_.front();
    }
    reactor_->StartWrite(first);
  }

  // The WriteBatch that held this queue's writes ended: send them.
  void Flush() override {
    const Response* first = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (queue_.size() > 1) merge_(&queue_);
      first = &queue_.front();
    }
    reactor_->StartWrite(first);
  }

  // Finishes the stream with `status` (OK: a normal end) after the queued
  // messages.
  void Close(const absl::Status& status) {
    {
      absl::MutexLock lock(&mu_);
      if (close_pending_) return;
      close_pending_ = true;
      close_status_ = status;
      if (writing_) return;  // WriteDone finishes
      finished_ = true;
    }
    reactor_->Finish(ToGrpcStatus(status));
  }

  // The reactor's OnWriteDone.
  void WriteDone(bool ok) {
    const Response* next = nullptr;
    absl::Status finish;
    bool do_finish = false;
    {
      absl::MutexLock lock(&mu_);
      queue_.pop_front();
      if (!ok) {
        queue_.clear();
        if (!close_pending_) {
          close_pending_ = true;
          close_status_ = absl::UnavailableError("write failed");
        }
      }
      if (!queue_.empty()) {
        if (queue_.size() > 1 && merge_) merge_(&queue_);
        next = &queue_.front();
      } else {
        writing_ = false;
        if (close_pending_ && !finished_) {
          finished_ = true;
          do_finish = true;
          finish = close_status_;
        }
      }
    }
    if (next != nullptr) {
      reactor_->StartWrite(next);
    } else if (do_finish) {
      reactor_->Finish(ToGrpcStatus(finish));
    }
  }

 private:
  Reactor* const reactor_;
  absl::Mutex mu_;
  // std::deque keeps the front's address while others are added behind it.
  std::deque<Response> queue_ ABSL_GUARDED_BY(mu_);
  Merge merge_ ABSL_GUARDED_BY(mu_);
  // A write is in flight, or held back for a WriteBatch's Flush.
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool close_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status close_status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace muster

#endif  // MUSTER_RPC_WRITE_QUEUE_H_
