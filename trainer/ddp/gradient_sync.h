// GradientSync: what PyTorch's DistributedDataParallel does for gradients.
//
// Parameters are grouped, in reverse registration order (the order backward
// produces their gradients), into buckets of about `bucket_bytes`. A hook on
// every parameter copies its gradient into its bucket's flat buffer; when a
// bucket is complete it is handed to a communication thread that all-reduces
// it (average over the world) while backward goes on. On the GPU the
// buffers live on the parameters' device; a bucket's all-reduce follows the
// stream that filled it (a StreamMark recorded at launch), and a
// communicator on host memory gets staged copies (device_comm.h). Finish() waits for
// every bucket and writes the averaged gradients into the parameters' .grad.
// A pass may call backward several times (a GAN's real and fake losses, one
// backward per task): .grad then holds the pass's whole local sum, and that
// sum is what gets averaged. A bucket is launched at its parameters' first
// gradients; when a later backward of the pass reaches a parameter whose
// bucket is already launched, the bucket is marked for a refill. The last
// bucket waits for Finish and carries, besides the control words, one flag
// per bucket; after it, every rank reduces again, from .grad and in index
// order, each bucket that any rank flagged. A pass with one backward pays
// nothing for this; a bucket reduced again costs one more all-reduce of it,
// outside backward (StepCommStats::refilled_buckets counts them).
// A parameter that has no gradient on a rank (unused in its forward, none
// accumulated) contributes zeros; the last bucket also carries a flag per
// parameter, and one that no rank had a gradient for keeps its .grad as it
// was, none, as one process would (and as DDP leaves a globally unused
// parameter's): an optimizer then skips it instead of stepping it with
// zeros (AdamW's weight decay, momentum).
// Inside a no-sync step (gradient accumulation) the hooks do nothing and
// gradients accumulate locally; the next synchronised step reduces the
// accumulated sum. In a world of one there is nothing to reduce: a step
// leaves the gradients where autograd put them (the same values, bit for
// bit) and the control words are this rank's own.
//
// Gradient compression: buckets go through Communicator::AllReduceGradients,
// so a communicator built to compress (CommOptions::gradient_compression)
// carries their float32 gradients across nodes as bfloat16 or float16 and
// hands back float32 averages. The control words are never compressed (a
// count of ranks that is not exact in 8 bits would change a decision): a
// compressing communicator reduces the last bucket's gradients and then its
// control words, in float32, in a second, small all-reduce. Without
// compression the last bucket is one all-reduce as before.
//
// Reduce-scatter (Options::reduce_scatter_gradients): a sync made with a
// plan of buckets that carry ReduceScatter segments (the shards' parts of
// each bucket: shard_layout.h's PlanBuckets) reduce-scatters them instead;
// each rank then reads the average of its own segments from the buckets,
// and the .grad keep the rank's own sum (see the plan constructor). Given a
// `take` (GradientSyncOptions), each bucket's segments are handed to it as
// its reduce-scatter completes and its buffer goes back to a small pool for
// the next bucket: the sync then holds about two buckets' buffers rather
// than a copy of every gradient, and each rank keeps the reduced gradient
// of its own part only (ZeRO stage 2's partitioned gradients; the .grad,
// the rank's own sum, stay for a salvage to reduce again). A pooled bucket
// larger than a pool buffer (one parameter larger than bucket_bytes) is
// streamed: its hooks copy nothing, and it is read from its parameters'
// .grad once autograd has written them (at the next hook, or Finish) a
// pool buffer at a time, each part the next piece of every rank's segment
// (a balanced reduce-scatter, as a communicator's rounds are), reduced and
// taken in turn, so that no buffer the size of the parameter is made.
//
// The buckets' buffers are made at the first step that reduces: a sync
// that never does (a world of one) holds none.
//
// The sync hooks its parameters while it lives; its destructor removes the
// hooks, so the program's model outlives it safely.
//
// Thread-safety: Begin/Finish/BroadcastFrom are called by the training
// thread; hooks run on the autograd thread(s); the communication thread is
// internal. SetCommunicator only between steps.
#ifndef MUSTER_TRAINER_DDP_GRADIENT_SYNC_H_
#define MUSTER_TRAINER_DDP_GRADIENT_SYNC_H_

#include <torch/types.h>

#include <array>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "trainer/comm/communicator.h"
#include "trainer/ddp/device_comm.h"

namespace muster {

struct GradientSyncOptions {
  size_t bucket_bytes = 25u << 20;
  // false: no all-reduce during backward; Finish() reduces every bucket
  // (the "one all-reduce after backward" baseline).
  bool overlap = true;
  // Deadline of each bucket's all-reduce, from Begin().
  absl::Duration timeout = absl::Seconds(120);
  // Deadlines and the step's timings are on its Now(); required, not owned.
  Clock* clock = nullptr;
  // For a reduce-scattering plan: takes `part`, elements [offset, offset +
  // part.numel()) of bucket `i`'s gradients (in plan order), once its
  // reduce-scatter completed, this rank's segments in it then holding the
  // world's average: the whole bucket at once, or a streamed bucket a pool
  // buffer at a time. Called on the communication thread during a pass and
  // on the training thread for a bucket reduced again in Finish; the
  // buffer is reused after it returns, so bucket_gradients is not for such
  // a sync. Empty: every bucket keeps a buffer of its own.
  std::function<void(size_t i, int64_t offset, const torch::Tensor& part)> take;
};

struct StepCommStats {
  double comm_seconds = 0;  // time the communication thread spent reducing
  double wait_seconds = 0;  // time Finish() waited for it after backward
  int refilled_buckets = 0;  // buckets reduced a second time (see above)
};

class GradientSync {
 public:
  static constexpr int kControlWords = 5;  // trainer/elastic/step_policy.h's
  // As in DDP, the first bucket is capped at 1 MiB so that communication
  // starts early in backward.
  static constexpr size_t kFirstBucketBytes = 1u << 20;

  // `params`: the model's parameters in registration order (float32, all on
  // one device). `comm` may be null until SetCommunicator.
  GradientSync(std::vector<torch::Tensor> params, Communicator* comm,
               GradientSyncOptions options);

  // A bucket given by its user: its parameters, by index into `params`, in
  // the order their gradients lie in its buffer, and for a reduce-scattering
  // sync its Communicator::ReduceScatter segments over those gradients, one
  // per rank (empty: the bucket is all-reduced); with `columns` the rank
  // needs the segments of its column (Communicator::ReduceColumnsGradients:
  // two copies of sharded state), not its own alone. The first bucket's
  // `scatter` and `columns` are the whole plan's.
  struct BucketPlan {
    std::vector<size_t> params;
    std::vector<size_t> scatter;
    bool columns = false;
    // Where the bucket's gradients live, or undefined: the sync makes the
    // buffer. Given (for every bucket of a plan, or none): a flat float32
    // view into storage the caller keeps, its parameters' gradients one
    // after the other in plan order, and in the last bucket its
    // WordCount() words in front of them. After a step each .grad then
    // shares its slot's memory, not a copy (as DDP's gradient_as_bucket_view;
    // a storage alias, not an autograd view, which zero_grad would refuse):
    // the gradients take the buckets' memory and no more.
    torch::Tensor buffer = torch::Tensor();
  };
  // The words the last bucket carries besides its gradients, for a plan of
  // `buckets` over `params` parameters.
  static int64_t WordCount(size_t buckets, size_t params) {
    return static_cast<int64_t>(buckets + params) + kControlWords;
  }
  // A sync whose buckets are `plan`'s, launched in that order; every
  // parameter is in exactly one. With scatter segments (sharded optimizer
  // state, Options::reduce_scatter_gradients) a step reduce-scatters each
  // bucket's gradients instead (its last bucket's words are all-reduced
  // apart): after Finish each bucket's segment of this rank (with
  // `columns`, of each rank of its column) holds the world's average
  // (bucket_gradients), the others are unspecified, and
  // the parameters' .grad keep this rank's own sum. Resync all-reduces and
  // installs into .grad as the default sync does (the salvage steps the
  // whole state).
  GradientSync(std::vector<torch::Tensor> params, std::vector<BucketPlan> plan,
               Communicator* comm, GradientSyncOptions options);
  ~GradientSync();
  GradientSync(const GradientSync&) = delete;
  GradientSync& operator=(const GradientSync&) = delete;

  void SetCommunicator(Communicator* comm);
  // The deadline of the next steps' bucket all-reduces (from Begin). Only
  // between steps.
  void SetTimeout(absl::Duration timeout);

  // Starts a step; `sync` false = accumulate locally (no_sync). `control` is
  // a few small numbers carried by the step's all-reduce (e.g. 1 = "stop
  // after this step"); after Finish, control() holds their averages over the
  // world, the same on every rank.
  void Begin(bool sync, const std::array<float, kControlWords>& control = {});
  const std::array<float, kControlWords>& control() const { return control_; }
  // After backward: waits for every bucket and installs averaged gradients.
  // On error (deadline, abort) the gradients are unspecified and the step
  // must be dropped. `turn`, when given, is called every 100 ms of the wait
  // (the heartbeat's proof that this thread is alive: TrainingProgress).
  absl::Status Finish(absl::Time deadline, const std::function<void()>& turn = nullptr);
  const StepCommStats& last_stats() const { return stats_; }

  // Step salvage, after Finish failed and the world regrouped: reduces over
  // `comm` (the new world) the gradients the parameters still hold — their
  // .grad, this rank's local sum with any no_sync steps — or zeros when
  // `contribute` is false, bucket by bucket in index order as a step does,
  // with `control` in the control words. `contributors` of comm->size()
  // ranks contribute: the gradients become their average and control() the
  // world's average. When every rank contributes, this is bit for bit the
  // reduction a synchronised step in that world performs, compressed where
  // `comm` compresses (the .grad it starts from are the float32 ones). Runs
  // on the calling thread; nothing may be in flight. Errors: the
  // communicator's, INVALID_ARGUMENT for no contributors; the .grad are then
  // unchanged.
  absl::Status Resync(Communicator* comm, bool contribute, int contributors,
                      const std::array<float, kControlWords>& control, absl::Time deadline);

  // Runs `collective` over the sync's communicator in order with the
  // pass's bucket reductions: while a synchronised pass is in flight
  // (Begin ... Finish), on the communication thread after the buckets
  // launched before it, else on the calling thread. Every rank that runs
  // the same graph meets the buckets and these collectives in the same
  // order (a SyncBatchNorm's sums in forward and backward). Returns its
  // status; FAILED_PRECONDITION without a communicator. Training or
  // autograd thread; one at a time.
  absl::Status RunInOrder(const std::function<absl::Status(Communicator*)>& collective);

  size_t bucket_count() const { return buckets_.size(); }
  // Whether a step reduce-scatters (a plan with scatter segments).
  bool scatters() const { return scatter_; }
  // Bucket `i`'s gradients (its buffer without the words), in its plan's
  // order; after a reduce-scattering Finish, this rank's segment of them is
  // the world's average. Not for a sync with GradientSyncOptions::take,
  // whose buckets hold a buffer only while they are reduced.
  torch::Tensor bucket_gradients(size_t i) const;
  // The parameters it reduces, as given.
  const std::vector<torch::Tensor>& params() const { return params_; }
  // Whether its buckets are the caller's storage (BucketPlan::buffer).
  bool views() const { return views_; }
  // Drops the buffers it made (MakeBuffers makes them again at the next
  // reduction): for a sync that another takes the place of while the
  // state is sharded. Only between steps; not for given buffers.
  void ReleaseBuffers();
  // The buffers it holds now (given ones included; none before the first
  // reduction and after ReleaseBuffers).
  std::vector<torch::Tensor> buffers() const;

 private:
  struct Bucket {
    int64_t elements = 0;          // its gradients' and (the last) the words
    torch::Tensor buffer;          // flat float32; made at the first reduction
                                   // (pooled: from the pool, while filled and reduced)
    std::vector<size_t> params;    // indices into params_
    std::vector<size_t> scatter;   // BucketPlan::scatter
    std::vector<int64_t> offsets;  // element offset of each param
    int ready = 0;
    bool launched = false;
    StreamMark filled;             // the launcher's stream has written the buffer
    bool done = false;
    bool refill = false;           // a later backward of the pass touched it after launch
    // Pooled and larger than a pool buffer: read from .grad a part at a
    // time when reduced (ForEachPart), never copied whole.
    bool streamed = false;
    absl::Status status;
  };

  // The words after the last bucket's gradients: a refill flag per bucket,
  // a flag per parameter (it has a gradient on the rank), then the control
  // words.
  int64_t words() const { return WordCount(buckets_.size(), params_.size()); }
  // Whether the words ride in the last bucket's buffer (else in words_:
  // the pooled buckets of a sync with GradientSyncOptions::take).
  bool words_in_last() const { return !pooled_; }
  // Where bucket `i`'s gradients begin in its buffer: after the words in
  // the last bucket of given buffers, else at its start.
  int64_t gradients_begin(size_t i) const {
    return views_ && i + 1 == buckets_.size() ? words() : 0;
  }
  // The words after a bucket's gradients in its buffer (the last's, where
  // they ride in it).
  int64_t words_after(size_t i) const {
    return words_in_last() && !views_ && i + 1 == buckets_.size() ? words() : 0;
  }
  // Pooled buckets: gives `b` a buffer (a streamed one, a whole pool
  // buffer for its parts), from the pool where one is free,
  // else by waiting for a bucket in flight to give its back, else (none in
  // flight, so none will come back: buckets filled out of order, no
  // overlap; or the pass has waited kPoolWait already) a new one. Waiting
  // only on a launched bucket cannot deadlock: it completes without this
  // rank's autograd.
  void Acquire(Bucket& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Pooled buckets: `b`'s buffer back to the pool (at most kPooled kept;
  // one made past them is freed here).
  void GiveBack(Bucket& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A streamed bucket's hook left its gradient to autograd: once autograd
  // has written its .grad (the next hook of the pass, or Finish), the
  // bucket counts it ready and buckets go out (LaunchReady).
  void Settle() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Launches, in index order, the buckets whose gradients are all in; the
  // last waits for Finish.
  void LaunchReady() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static constexpr size_t kNoBucket = static_cast<size_t>(-1);
  static constexpr size_t kPooled = 2;
  static constexpr absl::Duration kPoolWait = absl::Milliseconds(200);
  // The last bucket's words: behind its gradients, or in front of them in
  // given buffers.
  torch::Tensor WordsView() const;

  void OnGradient(size_t param, const torch::Tensor& grad);
  void SetControl(const std::array<float, kControlWords>& control);
  // Writes the flags into the last bucket: each bucket's `refill`
  // (`from_buckets`), else zeros; then `used`, one per parameter.
  void SetFlags(bool from_buckets, const std::vector<char>& used);
  // The last bucket's words on the host (the refill flags, then the
  // control words): one copy, one device synchronisation. Empty without
  // buckets.
  std::vector<float> ReadWords() const;
  // After every bucket is done: reduces again, over `comm`, each bucket
  // whose flag in `words` (ReadWords) some rank set, refilled from .grad.
  // Training thread; nothing in flight.
  absl::Status ReduceRefilled(Communicator* comm, const std::vector<float>& words,
                              absl::Time deadline);
  // Puts slot `j` of `b` to its parameter's .grad (`use_grad` and defined),
  // else to zeros.
  void FillFromGrad(Bucket& b, size_t j, bool use_grad);
  // Puts `slot` to the elements of `p`'s flat .grad from `from` (`use_grad`
  // and defined), else to zeros.
  static void FillSlot(const torch::Tensor& p, int64_t from, torch::Tensor slot, bool use_grad);
  // `n` elements of a bucket's gradients from `offset`.
  struct Piece {
    int64_t offset = 0;
    int64_t n = 0;
  };
  // Pooled: runs `use` on `b`'s gradients a part at a time, each part its
  // pieces one after another in `b`'s buffer: the whole bucket, or a
  // streamed bucket's pool buffer after pool buffer, with `by_segments`
  // the next piece of each of its scatter segments (the part's counts for
  // a reduce-scatter), else a contiguous piece. Each part is filled from
  // the parameters' .grad first (`use_grad` and defined, else zeros) where
  // `fill`; a bucket's hooks filled it otherwise.
  absl::Status ForEachPart(
      Bucket& b, bool by_segments, bool fill, bool use_grad,
      const std::function<absl::Status(const std::vector<Piece>&, const torch::Tensor&)>& use);
  // ForEachPart's parts of `b`.
  std::vector<std::vector<Piece>> Parts(const Bucket& b, bool by_segments) const;
  // Pooled: reduce-scatters bucket `i` (the words after the last) over
  // `comm` and hands it to take, a part at a time (ForEachPart, filled
  // from .grad where `fill`).
  absl::Status ReduceAndTake(Communicator* comm, size_t i, bool fill, absl::Time deadline);
  // Makes the buffers not made yet: at the first synchronised Begin or
  // Resync, so that a sync that never reduces (a world of one; the
  // all-reducing sync beside a reduce-scattering one) holds no buffers.
  void MakeBuffers();
  // The default plan: reverse registration order, buckets of about
  // `bucket_bytes`, the first of at most kFirstBucketBytes.
  static std::vector<BucketPlan> DefaultPlan(const std::vector<torch::Tensor>& params,
                                             size_t bucket_bytes);
  // Takes the control words from `words` (ReadWords) and, with `grads`,
  // writes the bucket buffers into the .grad.
  void Install(const std::vector<float>& words, bool grads);
  // Install's writing of bucket `b`'s slots into the .grad.
  void InstallBucket(const Bucket& b, const std::vector<float>& words);
  // The elements [first, second) of `b`'s gradients that slot `j` and
  // `piece` share (none where second <= first).
  std::pair<int64_t, int64_t> SlotInPiece(const Bucket& b, size_t j, const Piece& piece) const;
  // Pooled: puts `values`, `piece` of `b`'s gradients, to the parameters'
  // .grad (FillSlot).
  void FillPiece(const Bucket& b, const Piece& piece, const torch::Tensor& values, bool use_grad);
  // Pooled: writes `values`, `piece` of `b`'s gradients, into the .grad of
  // the parameters any rank had a gradient for (`words`), as InstallBucket.
  void InstallPiece(const Bucket& b, const Piece& piece, const torch::Tensor& values,
                    const std::vector<float>& words);
  // Runs `use` with `b` holding a buffer: its own, or, pooled, one from the
  // pool that goes back after. Training thread, nothing in flight.
  absl::Status WithBuffer(Bucket& b, const std::function<absl::Status()>& use);
  // Resync for pooled buckets: the words first, then each bucket filled
  // from .grad (`contribute`), all-reduced by `op`, divided by `divide_by`
  // (0: not) and installed, one buffer at a time.
  absl::Status ResyncPooled(Communicator* comm, bool contribute, int divide_by, ReduceOp op,
                            absl::Time deadline);
  void Launch(size_t bucket) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // All-reduces bucket `i` over `comm`: its gradients with
  // AllReduceGradients, and the control words of the last bucket with
  // them, or apart in float32 when `comm` compresses gradients. With
  // `scatter`, reduce-scatters its gradients by its segments instead, and
  // all-reduces the words apart. Not for pooled buckets (ReduceAndTake).
  absl::Status ReduceBucket(Communicator* comm, size_t i, ReduceOp op, absl::Time deadline,
                            bool scatter);
  void CommLoop();
  // A RunInOrder collective waiting in the queue (queue_ holds kErrand).
  struct Errand {
    const std::function<absl::Status(Communicator*)>* collective = nullptr;
    absl::Status status;
    bool done = false;
  };
  static constexpr size_t kErrand = static_cast<size_t>(-1);

  std::vector<torch::Tensor> params_;
  std::vector<unsigned> hooks_;    // param -> its hook's handle (removed with the sync)
  std::vector<size_t> bucket_of_;  // param -> bucket
  std::vector<size_t> slot_of_;    // param -> index inside its bucket
  std::vector<Bucket> buckets_;
  bool scatter_ = false;  // the plan's buckets reduce-scatter in a step
  bool columns_ = false;  // ... keeping the segments of this rank's column
  bool views_ = false;    // the plan gave the buffers (BucketPlan::buffer)
  bool pooled_ = false;   // reduce-scattered buckets through a pool (options.take)
  // Pooled: a pool buffer's (the largest bucket of bucket_bytes; all of
  // them where a bucket is streamed).
  int64_t pool_elements_ = 0;
  torch::Tensor words_;   // pooled: the words, apart from the buckets
  GradientSyncOptions options_;
  StepCommStats stats_;
  std::array<float, kControlWords> control_{};

  mutable Mutex mu_;
  CondVar cv_;
  Communicator* comm_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool syncing_ ABSL_GUARDED_BY(mu_) = false;
  bool solo_ ABSL_GUARDED_BY(mu_) = false;  // a synchronised step in a world of one
  std::array<float, kControlWords> local_control_ ABSL_GUARDED_BY(mu_){};
  std::vector<char> got_gradient_ ABSL_GUARDED_BY(mu_);  // per param, this step
  absl::Time deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  std::deque<size_t> queue_ ABSL_GUARDED_BY(mu_);  // buckets to reduce, kErrand
  std::deque<Errand*> errands_ ABSL_GUARDED_BY(mu_);  // the callers wait for them
  std::vector<torch::Tensor> pool_ ABSL_GUARDED_BY(mu_);  // pooled: free buffers
  // Pooled: this pass's waits for a buffer; at kPoolWait, buffers are made.
  absl::Duration pool_waited_ ABSL_GUARDED_BY(mu_);
  // A streamed bucket whose last hook has not yet been followed by
  // autograd's write of its .grad (Settle), or kNoBucket.
  size_t unsettled_ ABSL_GUARDED_BY(mu_) = kNoBucket;
  size_t next_launch_ ABSL_GUARDED_BY(mu_) = 0;    // buckets below it are launched
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  double comm_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread comm_thread_;
};

}  // namespace muster

#endif  // MUSTER_TRAINER_DDP_GRADIENT_SYNC_H_
