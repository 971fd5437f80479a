#include "trainer/comm/gloo/gloo_communicator.h"

#include <unistd.h>

#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>

#include <csignal>
#include <algorithm>
#include <cstring>
#include <mutex>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/monotonic_wait.h"
#include "common/host_name.h"
#include "common/logging.h"
#include "trainer/comm/gloo/gloo_address.h"
#include "trainer/comm/gloo/gloo_store.h"
#include "trainer/comm/gloo/reachability.h"
#include "trainer/comm/reduce.h"

namespace muster {
namespace {

// Bytes per send/recv in Gloo's ring (two in flight). Gloo's default is
// 1 MiB; 4 MiB measured 15% faster over TCP here (docs/communicators.md).
constexpr size_t kSegmentBytes = 4 << 20;

// Bytes per peer in each round of ReduceScatter's all-to-all.
constexpr size_t kRoundBytes = 1 << 20;

// Gloo's own timeout for one operation: until the caller's deadline, a
// time of `clock` (at least 10 ms so Gloo does not treat it as "no
// timeout").
std::chrono::milliseconds Until(absl::Time deadline, Clock* clock) {
  const int64_t ms = absl::ToInt64Milliseconds(Remaining(deadline, clock));
  // Bounded above too: Gloo adds it to "now" and must not overflow.
  return std::chrono::milliseconds(std::clamp<int64_t>(ms, 10, int64_t{24} * 3600 * 1000));
}

absl::Status FromException(const std::exception& e) {
  const std::string what = e.what();
  if (what.find("Timed out") != std::string::npos || what.find("timed out") != std::string::npos) {
    return absl::DeadlineExceededError(absl::StrCat("gloo: ", what));
  }
  return absl::AbortedError(absl::StrCat("gloo: ", what));
}

// Calls fn<T>() with T matching the element size of `type`.
template <typename Fn>
void WithElementType(DataType type, Fn&& fn) {
  switch (DataTypeSize(type)) {
    case 2: fn(uint16_t{}); break;
    case 4: fn(float{}); break;
    default: fn(double{}); break;
  }
}

// The worker thread and everything it touches; shared with the reaper that
// outlives a destroyed communicator whose worker is still blocked.
struct Worker {
  absl::Mutex mu;
  std::function<absl::Status()> job ABSL_GUARDED_BY(mu);
  bool has_job ABSL_GUARDED_BY(mu) = false;
  bool running ABSL_GUARDED_BY(mu) = false;
  bool done ABSL_GUARDED_BY(mu) = false;
  bool stop ABSL_GUARDED_BY(mu) = false;
  absl::Status result ABSL_GUARDED_BY(mu);
  absl::Status broken ABSL_GUARDED_BY(mu);  // non-OK once unusable
  std::shared_ptr<gloo::rendezvous::Context> context;
  std::thread thread;
  // Gloo works on this copy of the caller's buffer, so that a transfer that
  // outlives an aborted call never writes into memory the caller freed.
  std::vector<char> staging;

  char* Stage(const void* data, size_t bytes) {
    if (staging.size() < bytes) staging.resize(bytes);
    std::memcpy(staging.data(), data, bytes);
    return staging.data();
  }

  void Loop() {
    while (true) {
      std::function<absl::Status()> fn;
      {
        absl::MutexLock lock(&mu);
        mu.Await(absl::Condition(
            +[](Worker* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu) { return w->has_job || w->stop; },
            this));
        if (!has_job) return;
        fn = std::move(job);
        has_job = false;
        running = true;
      }
      absl::Status s;
      try {
        s = fn();
      } catch (const std::exception& e) {
        s = FromException(e);
      }
      absl::MutexLock lock(&mu);
      running = false;
      done = true;
      result = s;
    }
  }
};

class GlooCommunicator : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<Worker> worker, int rank, int size, Clock* clock,
                   std::unique_ptr<ReachabilityProbe> probe, absl::Duration probe_timeout)
      : worker_(std::move(worker)),
        rank_(rank),
        size_(size),
        clock_(clock),
        probe_(std::move(probe)),
        probe_timeout_(probe_timeout),
        poker_(std::make_unique<MutexPoker>(&worker_->mu, absl::Milliseconds(10))) {}

  ~GlooCommunicator() override {
    bool idle;
    {
      absl::MutexLock lock(&worker_->mu);
      worker_->stop = true;
      if (worker_->broken.ok()) worker_->broken = absl::AbortedError("communicator destroyed");
      idle = !worker_->running && !worker_->has_job;
    }
    if (idle) {
      // The usual case: nothing in flight; release everything now.
      worker_->thread.join();
      worker_->context.reset();
      return;
    }
    // A transfer blocked on a hung peer ends at its own timeout; release the
    // worker and the sockets then, without making the caller wait.
    std::thread([w = worker_] {
      w->thread.join();
      w->context.reset();
    }).detach();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "gloo"; }

  absl::Status AllReduce(void* data, size_t count, DataType type, ReduceOp op,
                         absl::Time deadline) override {
    if (count == 0) return Check();
    if (size_ == 1) return Check();
    if (absl::Status b = Check(); !b.ok()) return b;
    auto ctx = worker_->context;
    const size_t bytes = count * DataTypeSize(type);
    char* stage = worker_->Stage(data, bytes);
    absl::Status s = Run(deadline, [=, clock = clock_]() -> absl::Status {
      gloo::AllreduceOptions opts(ctx);
      WithElementType(type, [&](auto t) {
        using T = decltype(t);
        opts.setOutput(reinterpret_cast<T*>(stage), count);
      });
      opts.setReduceFunction([type](void* out, const void* a, const void* b, size_t n) {
        SumInto(type, out, a, b, n);
      });
      opts.setTimeout(Until(deadline, clock));
      opts.setMaxSegmentSize(kSegmentBytes);
      gloo::allreduce(opts);
      return absl::OkStatus();
    });
    if (!s.ok()) return s;
    std::memcpy(data, stage, bytes);
    if (op == ReduceOp::kAverage) DivideBy(type, data, count, size_);
    return s;
  }

  // Gloo 0.5's options API has no reduce-scatter. An all-to-all sends each
  // segment to its rank, so that every rank sends and receives (W-1)/W of
  // the buffer once, as a ring's reduce-scatter does and half of what the
  // all-reduce moves; each rank then sums the W copies of its own segment
  // in rank order (SumAll). The other segments are left as they were.
  // The all-to-all goes in rounds of at most kRoundBytes per peer: over a
  // link shaped to 1 Gbit/s, one send of 32 MiB took as long as the
  // all-reduce of twice the bytes (docs/communicators.md).
  absl::Status ReduceScatter(void* data, const std::vector<size_t>& counts, DataType type,
                             ReduceOp op, absl::Time deadline) override {
    if (absl::Status s = CheckCounts(counts, size_); !s.ok()) return s;
    const size_t total = TotalCount(counts), own = counts[rank_];
    if (size_ == 1 || total == 0) return Check();
    if (absl::Status b = Check(); !b.ok()) return b;
    const size_t es = DataTypeSize(type);
    const size_t piece = kRoundBytes / es;
    const size_t rounds = (*std::max_element(counts.begin(), counts.end()) + piece - 1) / piece;
    // Round k sends elements [k*piece, (k+1)*piece) of every segment; the
    // staged input holds them round by round, and the received pieces
    // follow it, round by round and rank by rank within a round.
    if (worker_->staging.size() < (total + size_ * own) * es) {
      worker_->staging.resize((total + size_ * own) * es);
    }
    char* stage = worker_->staging.data();
    char* pieces = stage + total * es;
    std::vector<size_t> at(size_ + 1, 0);
    for (int r = 0; r < size_; ++r) at[r + 1] = at[r] + counts[r];
    auto in_round = [&counts, piece](int r, size_t k) {
      return std::min(piece, counts[r] - std::min(counts[r], k * piece));
    };
    std::vector<std::vector<int64_t>> sends(rounds, std::vector<int64_t>(size_));
    for (size_t k = 0, next = 0; k < rounds; ++k) {
      for (int r = 0; r < size_; ++r) {
        const size_t n = in_round(r, k);
        sends[k][r] = static_cast<int64_t>(n);
        std::memcpy(stage + next * es, static_cast<char*>(data) + (at[r] + k * piece) * es,
                    n * es);
        next += n;
      }
    }
    auto ctx = worker_->context;
    absl::Status s = Run(deadline, [=, clock = clock_, me = rank_]() -> absl::Status {
      char* in = stage;
      char* out = pieces;
      for (size_t k = 0; k < rounds; ++k) {
        const int64_t mine = sends[k][me];
        gloo::AlltoallvOptions opts(ctx);
        WithElementType(type, [&](auto t) {
          using T = decltype(t);
          opts.setInput(reinterpret_cast<T*>(in), sends[k]);
          opts.setOutput(reinterpret_cast<T*>(out), std::vector<int64_t>(sends[k].size(), mine));
        });
        opts.setTimeout(Until(deadline, clock));
        gloo::alltoallv(opts);
        for (int64_t n : sends[k]) in += n * es;
        out += sends[k].size() * mine * es;
      }
      return absl::OkStatus();
    });
    if (!s.ok() || own == 0) return s;
    for (size_t k = 0; k < rounds; ++k) {
      const size_t n = in_round(rank_, k);
      if (n == 0) break;
      const char* round = pieces + size_ * k * piece * es;
      std::vector<const void*> others;
      for (int r = 1; r < size_; ++r) others.push_back(round + r * n * es);
      SumAll(type, static_cast<char*>(data) + (at[rank_] + k * piece) * es, round, others, n,
             op == ReduceOp::kAverage ? size_ : 1);
    }
    return s;
  }

  absl::Status AllGather(void* data, const std::vector<size_t>& counts, DataType type,
                         absl::Time deadline) override {
    if (absl::Status s = CheckCounts(counts, size_); !s.ok()) return s;
    if (size_ == 1) return Check();
    const size_t es = DataTypeSize(type);
    const size_t offset = SegmentOffset(counts, rank_);
    auto own = std::make_shared<std::vector<char>>(
        static_cast<char*>(data) + offset * es,
        static_cast<char*>(data) + (offset + counts[rank_]) * es);
    const size_t total = TotalCount(counts);
    if (absl::Status b = Check(); !b.ok()) return b;
    auto ctx = worker_->context;
    char* stage = worker_->Stage(data, total * es);
    absl::Status s = Run(deadline, [=, clock = clock_]() -> absl::Status {
      gloo::AllgathervOptions opts(ctx);
      WithElementType(type, [&](auto t) {
        using T = decltype(t);
        opts.setInput(reinterpret_cast<T*>(own->data()), counts[rank_]);
        opts.setOutput(reinterpret_cast<T*>(stage), counts);
      });
      opts.setTimeout(Until(deadline, clock));
      gloo::allgatherv(opts);
      return absl::OkStatus();
    });
    if (s.ok()) std::memcpy(data, stage, total * es);
    return s;
  }

  absl::Status Broadcast(void* data, size_t count, DataType type, int root,
                         absl::Time deadline) override {
    if (root < 0 || root >= size_) {
      return absl::InvalidArgumentError(absl::StrCat("root ", root, " is not a rank of ", size_));
    }
    if (count == 0 || size_ == 1) return Check();
    if (absl::Status b = Check(); !b.ok()) return b;
    auto ctx = worker_->context;
    const size_t bytes = count * DataTypeSize(type);
    char* stage = worker_->Stage(data, bytes);
    absl::Status s = Run(deadline, [=, clock = clock_]() -> absl::Status {
      gloo::BroadcastOptions opts(ctx);
      WithElementType(type, [&](auto t) {
        using T = decltype(t);
        opts.setOutput(reinterpret_cast<T*>(stage), count);
      });
      opts.setRoot(root);
      opts.setTimeout(Until(deadline, clock));
      gloo::broadcast(opts);
      return absl::OkStatus();
    });
    if (s.ok()) std::memcpy(data, stage, bytes);
    return s;
  }

  absl::Status Barrier(absl::Time deadline) override {
    if (size_ == 1) return Check();
    if (absl::Status b = Check(); !b.ok()) return b;
    auto ctx = worker_->context;
    return Run(deadline, [=, clock = clock_]() -> absl::Status {
      gloo::BarrierOptions opts(ctx);
      opts.setTimeout(Until(deadline, clock));
      gloo::barrier(opts);
      return absl::OkStatus();
    });
  }

  std::vector<int> Unreachable() override {
    return probe_ != nullptr ? probe_->Unreachable(probe_timeout_) : std::vector<int>{};
  }

  void Abort(const absl::Status& why) override {
    absl::MutexLock lock(&worker_->mu);
    if (worker_->broken.ok()) {
      worker_->broken = absl::AbortedError(absl::StrCat("aborted: ", why.message()));
    }
  }

 private:
  absl::Status Check() {
    absl::MutexLock lock(&worker_->mu);
    return worker_->broken;
  }

  // Hands `fn` to the worker and waits for it, for an abort, or for the
  // deadline, whichever comes first.
  absl::Status Run(absl::Time deadline, std::function<absl::Status()> fn) {
    Worker* w = worker_.get();
    absl::MutexLock lock(&w->mu);
    if (!w->broken.ok()) return w->broken;
    w->job = std::move(fn);
    w->has_job = true;
    w->done = false;
    // An untimed wait, its deadline checked on the monotonic clock at least
    // every 10 ms by poker_ (absl's timed waits follow the wall clock).
    auto finished = [w, deadline, clock = clock_]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu) {
      return w->done || !w->broken.ok() || clock->Now() >= deadline;
    };
    w->mu.Await(absl::Condition(&finished));
    if (w->done) {
      if (!w->result.ok()) w->broken = w->result;
      return w->result;
    }
    // Return now; the transfer, blocked on a hung peer, goes on in the
    // background on the staging copy until its own timeout.
    if (w->broken.ok()) {
      w->broken = absl::DeadlineExceededError("gloo collective passed its deadline");
    }
    return w->broken;
  }

  std::shared_ptr<Worker> worker_;
  const int rank_;
  const int size_;
  Clock* const clock_;  // deadlines are times of its Now()
  const std::unique_ptr<ReachabilityProbe> probe_;  // null in a group of one
  const absl::Duration probe_timeout_;
  // Destroyed first: it locks worker_->mu.
  std::unique_ptr<MutexPoker> poker_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> NewGlooCommunicator(Store* store, int rank,
                                                                  int size,
                                                                  const GlooOptions& options,
                                                                  absl::Time deadline) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " of size ", size));
  }
  // Writing to a peer that died raises SIGPIPE, whose default action kills
  // this process without a word; the write's EPIPE is what we want instead.
  static std::once_flag ignore_sigpipe;
  std::call_once(ignore_sigpipe, [] { ::signal(SIGPIPE, SIG_IGN); });
  auto worker = std::make_shared<Worker>();
  GlooAddress own;
  if (options.iface.empty()) {
    absl::StatusOr<GlooAddress> address = ResolveGlooAddress(
        {options.hostname, options.observed_host, HostName()}, options.single_host);
    if (!address.ok()) return address.status();
    static std::once_flag warned;
    if (!address->warning.empty()) {
      std::call_once(warned, [&] { MUSTER_LOG(WARNING) << address->warning; });
    }
    own = *address;
  } else {
    absl::StatusOr<std::string> ip = InterfaceAddress(options.iface);
    if (!ip.ok()) return ip.status();
    own.ip = *ip;
  }
  // Every peer answers on the address it gives Gloo, or the world cannot
  // start: say whom this rank cannot reach now, rather than after Gloo's
  // connect waited out the whole deadline (reachability.h).
  std::unique_ptr<ReachabilityProbe> probe;
  if (size > 1) {
    absl::StatusOr<std::unique_ptr<ReachabilityProbe>> started = ReachabilityProbe::Start(
        store, own.ip, rank, size, options.world_rank >= 0 ? options.world_rank : rank, deadline,
        options.clock);
    if (!started.ok()) return started.status();
    probe = std::move(*started);
    const std::vector<int> unreachable = probe->Unreachable(options.probe_timeout);
    if (!unreachable.empty()) {
      std::vector<std::string> names;
      for (int r : unreachable) names.push_back(probe->Describe(r));
      absl::Status s = absl::UnavailableError(
          absl::StrCat("cannot reach ", absl::StrJoin(names, ", "), " from ", own.ip, " within ",
                       absl::FormatDuration(options.probe_timeout)));
      SetUnreachableRanks(&s, unreachable);
      return s;
    }
  }
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = own.ip;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(Until(deadline, options.clock));
    if (size > 1) {
      GlooStore gloo_store(store, deadline, options.clock);
      context->connectFullMesh(gloo_store, device);
    }
    worker->context = std::move(context);
  } catch (const std::exception& e) {
    const absl::Status s = FromException(e);
    return absl::Status(s.code(), absl::StrCat(s.message(), LoopbackHint(e.what(), own)));
  }
  worker->thread = std::thread([w = worker.get()] { w->Loop(); });
  return std::unique_ptr<Communicator>(
      new GlooCommunicator(worker, rank, size, options.clock, std::move(probe),
                           options.probe_timeout));
}

}  // namespace muster
