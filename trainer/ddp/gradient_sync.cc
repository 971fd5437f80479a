#include "trainer/ddp/gradient_sync.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/status_macros.h"
#include "trainer/ddp/storage_alias.h"

namespace muster {
std::vector<GradientSync::BucketPlan> GradientSync::DefaultPlan(
    const std::vector<torch::Tensor>& params, size_t bucket_bytes) {
  // Reverse registration order: backward reaches the last layers first.
  std::vector<BucketPlan> plan;
  size_t current_bytes = 0;
  for (size_t k = params.size(); k-- > 0;) {
    const size_t bytes = static_cast<size_t>(params[k].numel()) * sizeof(float);
    const size_t cap =
        plan.size() <= 1 ? std::min(bucket_bytes, kFirstBucketBytes) : bucket_bytes;
    if (plan.empty() || (current_bytes > 0 && current_bytes + bytes > cap)) {
      plan.emplace_back();
      current_bytes = 0;
    }
    plan.back().params.push_back(k);
    current_bytes += bytes;
  }
  return plan;
}

GradientSync::GradientSync(std::vector<torch::Tensor> params, Communicator* comm,
                           GradientSyncOptions options)
    : GradientSync(params, DefaultPlan(params, options.bucket_bytes), comm, options) {}

GradientSync::GradientSync(std::vector<torch::Tensor> params, std::vector<BucketPlan> plan,
                           Communicator* comm, GradientSyncOptions options)
    : params_(std::move(params)),
      scatter_(!plan.empty() && !plan.front().scatter.empty()),
      columns_(scatter_ && plan.front().columns),
      views_(!plan.empty() && plan.front().buffer.defined()),
      pooled_(scatter_ && !views_ && static_cast<bool>(options.take)),
      options_(options),
      comm_(comm) {
  bucket_of_.resize(params_.size());
  slot_of_.resize(params_.size());
  for (BucketPlan& p : plan) {
    Bucket& b = buckets_.emplace_back();
    b.scatter = std::move(p.scatter);
    b.buffer = std::move(p.buffer);
    int64_t at = 0;
    for (size_t k : p.params) {
      bucket_of_[k] = buckets_.size() - 1;
      slot_of_[k] = b.params.size();
      b.params.push_back(k);
      b.offsets.push_back(at);
      at += params_[k].numel();
    }
  }
  const auto bucket_elements = static_cast<int64_t>(options_.bucket_bytes / sizeof(float));
  for (size_t i = 0; i < buckets_.size(); ++i) {
    Bucket& b = buckets_[i];
    for (size_t k : b.params) b.elements += params_[k].numel();
    // A pooled bucket larger than a bucket (a parameter larger than one)
    // is streamed through pool buffers.
    if (b.elements <= bucket_elements) {
      pool_elements_ = std::max(pool_elements_, b.elements);
    } else {
      b.streamed = pooled_;
    }
    // The words ride in the last bucket, or apart where buckets are pooled.
    if (i + 1 == buckets_.size() && words_in_last()) b.elements += words();
    for (int64_t& offset : b.offsets) offset += gradients_begin(i);
    TORCH_CHECK(b.buffer.defined() == views_ &&
                    (!views_ || (b.buffer.numel() == b.elements && b.buffer.is_contiguous() &&
                                 b.buffer.scalar_type() == torch::kFloat32)),
                "GradientSync: bucket ", i, " of a plan with given buffers needs a contiguous "
                "float32 buffer of ", b.elements, " elements");
  }
  if (std::any_of(buckets_.begin(), buckets_.end(), [](const Bucket& b) { return b.streamed; })) {
    pool_elements_ = std::max<int64_t>(1, bucket_elements);
  }
  hooks_.reserve(params_.size());
  for (size_t k = 0; k < params_.size(); ++k) {
    hooks_.push_back(params_[k].register_hook([this, k](torch::Tensor grad) {
      OnGradient(k, grad);
      return torch::Tensor();
    }));
  }
  comm_thread_ = std::thread([this] { CommLoop(); });
}

void GradientSync::MakeBuffers() {
  const torch::TensorOptions options = params_.empty()
                                           ? torch::TensorOptions().dtype(torch::kFloat32)
                                           : params_[0].options().dtype(torch::kFloat32);
  if (pooled_) {  // the buckets take buffers from the pool as they fill
    if (!words_.defined() && !buckets_.empty()) words_ = torch::zeros({words()}, options);
    return;
  }
  for (Bucket& b : buckets_) {
    if (!b.buffer.defined()) b.buffer = torch::zeros({b.elements}, options);
  }
}

void GradientSync::Settle() {
  if (unsettled_ == kNoBucket) return;
  ++buckets_[std::exchange(unsettled_, kNoBucket)].ready;
  if (options_.overlap) LaunchReady();
}

void GradientSync::LaunchReady() {
  // Buckets go out in index order, as DDP's reducer launches them: with a
  // data-dependent graph ranks can fill them in different orders, and
  // every rank must reduce the same bucket in the same collective. The
  // last one, which carries the words, waits for Finish: only then is it
  // known which buckets another backward of the pass touched again.
  while (next_launch_ + 1 < buckets_.size() &&
         buckets_[next_launch_].ready == static_cast<int>(buckets_[next_launch_].params.size())) {
    Bucket& b = buckets_[next_launch_];
    if (b.streamed) Acquire(b);  // its hooks took none
    Launch(next_launch_++);
  }
}

void GradientSync::ReleaseBuffers() {
  if (views_) return;
  MutexLock lock(&mu_);
  for (Bucket& b : buckets_) b.buffer = torch::Tensor();
  pool_.clear();
  words_ = torch::Tensor();
}

std::vector<torch::Tensor> GradientSync::buffers() const {
  std::vector<torch::Tensor> out;
  MutexLock lock(&mu_);
  for (const Bucket& b : buckets_) {
    if (b.buffer.defined()) out.push_back(b.buffer);
  }
  for (const torch::Tensor& t : pool_) out.push_back(t);
  if (words_.defined()) out.push_back(words_);
  return out;
}

torch::Tensor GradientSync::bucket_gradients(size_t i) const {
  const torch::Tensor& buffer = buckets_[i].buffer;
  return buffer.narrow(0, gradients_begin(i),
                       buffer.numel() - gradients_begin(i) - words_after(i));
}

torch::Tensor GradientSync::WordsView() const {
  if (!words_in_last()) return words_;
  const torch::Tensor& last = buckets_.back().buffer;
  return last.narrow(0, views_ ? 0 : last.numel() - words(), words());
}

GradientSync::~GradientSync() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.NotifyAll();
  comm_thread_.join();
  // The parameters outlive the sync (the program's model): a later
  // backward must not call into it.
  for (size_t k = 0; k < params_.size(); ++k) params_[k].remove_hook(hooks_[k]);
}

void GradientSync::SetCommunicator(Communicator* comm) {
  MutexLock lock(&mu_);
  comm_ = comm;
}

void GradientSync::SetControl(const std::array<float, kControlWords>& control) {
  if (buckets_.empty()) return;
  torch::Tensor words = WordsView();
  for (int i = 0; i < kControlWords; ++i) {
    words.narrow(0, words.numel() - kControlWords + i, 1).fill_(control[i]);
  }
}

void GradientSync::SetFlags(bool from_buckets, const std::vector<char>& used) {
  if (buckets_.empty()) return;
  std::vector<float> flags(buckets_.size() + params_.size(), 0.0f);
  if (from_buckets) {
    for (size_t i = 0; i < buckets_.size(); ++i) flags[i] = buckets_[i].refill ? 1.0f : 0.0f;
  }
  for (size_t k = 0; k < params_.size(); ++k) flags[buckets_.size() + k] = used[k] ? 1.0f : 0.0f;
  WordsView()
      .narrow(0, 0, static_cast<int64_t>(flags.size()))
      .copy_(torch::from_blob(flags.data(), {static_cast<int64_t>(flags.size())},
                              torch::kFloat32));
}

void GradientSync::SetTimeout(absl::Duration timeout) {
  MutexLock lock(&mu_);
  options_.timeout = timeout;
}

void GradientSync::Begin(bool sync, const std::array<float, kControlWords>& control) {
  MutexLock lock(&mu_);
  // A world of one has nothing to reduce: its gradients are the average.
  solo_ = sync && comm_ != nullptr && comm_->size() == 1;
  syncing_ = sync && !solo_;
  local_control_ = control;
  control_ = {};
  if (syncing_) {
    MakeBuffers();
    SetControl(control);
  }
  deadline_ = options_.clock->Now() + options_.timeout;
  pool_waited_ = absl::ZeroDuration();
  unsettled_ = kNoBucket;
  for (Bucket& b : buckets_) {
    // A bucket of a pass that failed before its launch; not one in flight.
    if (pooled_ && !(b.launched && !b.done)) GiveBack(b);
    b.ready = 0;
    b.launched = false;
    b.done = false;
    b.refill = false;
    b.status = absl::OkStatus();
  }
  queue_.clear();
  next_launch_ = 0;
  comm_seconds_ = 0;
  got_gradient_.assign(params_.size(), 0);
}

void GradientSync::OnGradient(size_t k, const torch::Tensor& grad) {
  Bucket& b = buckets_[bucket_of_[k]];
  {
    MutexLock lock(&mu_);
    if (solo_) got_gradient_[k] = 1;
    if (!syncing_) return;
    Settle();  // autograd wrote the .grad of the hook before this one
    if (b.launched) {
      // Another backward of the pass reached a parameter whose bucket is
      // already on its way: autograd adds the gradient to .grad, and Finish
      // reduces the bucket again from .grad, the pass's whole local sum.
      b.refill = true;
      return;
    }
    if (b.streamed) {
      // Read from .grad when reduced, once autograd has added this gradient
      // to it, with whatever it held before (no_sync steps, an earlier
      // backward of the pass).
      if (!got_gradient_[k]) unsettled_ = bucket_of_[k];
      got_gradient_[k] = 1;
      return;
    }
    if (pooled_) Acquire(b);
  }
  torch::NoGradGuard no_grad;
  torch::Tensor slot = b.buffer.narrow(0, b.offsets[slot_of_[k]], params_[k].numel());
  // Given buffers: a .grad that is still a view of the bucket (a later
  // pass of the step over this sync) becomes a tensor of its own, so that
  // autograd, which adds this gradient to it after the hook, does not
  // write into a buffer on its way to the other ranks.
  if (views_ && params_[k].grad().defined() && params_[k].grad().is_alias_of(b.buffer)) {
    params_[k].mutable_grad() = params_[k].grad().clone();
  }
  slot.copy_(grad.reshape({-1}));
  // What .grad holds already is part of the sum: gradients accumulated by
  // earlier no-sync steps, and an earlier backward of this pass.
  const torch::Tensor& previous = params_[k].grad();
  if (previous.defined()) slot.add_(previous.reshape({-1}));
  MutexLock lock(&mu_);
  if (got_gradient_[k]) return;  // a second backward of the pass: counted once
  got_gradient_[k] = 1;
  if (++b.ready == static_cast<int>(b.params.size()) && options_.overlap) LaunchReady();
}

void GradientSync::Launch(size_t bucket) {
  Bucket& b = buckets_[bucket];
  if (b.launched) return;
  b.launched = true;
  b.filled = StreamMark::Record(b.buffer.device());
  queue_.push_back(bucket);
  cv_.NotifyAll();
}

void GradientSync::CommLoop() {
  MutexLock lock(&mu_);
  while (true) {
    while (!stop_ && queue_.empty()) cv_.Wait(&mu_);
    if (stop_) return;
    const size_t bucket = queue_.front();
    queue_.pop_front();
    Communicator* comm = comm_;
    if (bucket == kErrand) {  // a RunInOrder collective
      Errand* errand = errands_.front();
      errands_.pop_front();
      lock.Unlock();
      absl::Status s = comm == nullptr ? absl::FailedPreconditionError("no communicator")
                                       : (*errand->collective)(comm);
      lock.Lock();
      errand->status = std::move(s);
      errand->done = true;
      cv_.NotifyAll();
      continue;
    }
    const absl::Time deadline = deadline_;
    Bucket& b = buckets_[bucket];
    lock.Unlock();
    const absl::Time start = options_.clock->Now();
    b.filled.WaitOnCurrentStream();
    absl::Status s =
        comm == nullptr ? absl::FailedPreconditionError("no communicator")
        : pooled_       ? ReduceAndTake(comm, bucket, /*fill=*/b.streamed, deadline)
                        : ReduceBucket(comm, bucket, ReduceOp::kAverage, deadline, scatter_);
    const double seconds = absl::ToDoubleSeconds(options_.clock->Now() - start);
    lock.Lock();
    comm_seconds_ += seconds;
    b.status = s;
    b.done = true;
    if (pooled_) GiveBack(b);
    cv_.NotifyAll();
  }
}

absl::Status GradientSync::RunInOrder(
    const std::function<absl::Status(Communicator*)>& collective) {
  MutexLock lock(&mu_);
  Communicator* comm = comm_;
  if (comm == nullptr) return absl::FailedPreconditionError("no communicator");
  if (!syncing_) {  // nothing in flight: the communicator is this thread's
    lock.Unlock();
    return collective(comm);
  }
  Errand errand;
  errand.collective = &collective;
  errands_.push_back(&errand);
  queue_.push_back(kErrand);
  cv_.NotifyAll();
  while (!errand.done) cv_.Wait(&mu_);
  return errand.status;
}

absl::Status GradientSync::ReduceBucket(Communicator* comm, size_t i, ReduceOp op,
                                        absl::Time deadline, bool scatter) {
  const torch::Tensor& buffer = buckets_[i].buffer;
  const bool last = i + 1 == buckets_.size();
  const torch::Tensor gradients = bucket_gradients(i);
  if (scatter) {
    if (gradients.numel() > 0) {
      MUSTER_RETURN_IF_ERROR(ReduceScatterGradientTensor(comm, gradients, buckets_[i].scatter,
                                                         op, deadline, columns_));
    }
    if (!last) return absl::OkStatus();
    return AllReduceTensor(comm, WordsView(), op, deadline);
  }
  if (!last || (words_in_last() && comm->gradient_wire() == DataType::kFloat32)) {
    return AllReduceGradientTensor(comm, buffer, op, deadline);
  }
  MUSTER_RETURN_IF_ERROR(AllReduceGradientTensor(comm, gradients, op, deadline));
  return AllReduceTensor(comm, WordsView(), op, deadline);
}

absl::Status GradientSync::Finish(absl::Time deadline, const std::function<void()>& turn) {
  const absl::Time start = options_.clock->Now();
  MutexLock lock(&mu_);
  if (solo_) {
    // As Install leaves them: a parameter without a gradient keeps none.
    control_ = local_control_;
    stats_ = StepCommStats{};
    solo_ = false;
    return absl::OkStatus();
  }
  if (!syncing_) return absl::OkStatus();
  Settle();  // backward is over: autograd wrote every .grad
  deadline_ = std::min(deadline_, deadline);
  // Which launched buckets a later backward of the pass touched again ride
  // in the last bucket: every rank then reduces the same ones again. So
  // does which parameters have a gradient on this rank.
  std::vector<char> used = got_gradient_;
  for (size_t k = 0; k < params_.size(); ++k) used[k] |= params_[k].grad().defined() ? 1 : 0;
  SetFlags(/*from_buckets=*/true, used);
  // A parameter whose hook did not run this step (unused in the forward
  // pass) contributes what it accumulated locally, or zeros.
  for (size_t i = 0; i < buckets_.size(); ++i) {
    Bucket& b = buckets_[i];
    if (b.launched) continue;
    if (pooled_) Acquire(b);
    if (b.ready < static_cast<int>(b.params.size()) && !b.streamed) {
      for (size_t j = 0; j < b.params.size(); ++j) {
        if (!got_gradient_[b.params[j]]) FillFromGrad(b, j, /*use_grad=*/true);
      }
    }
    Launch(i);
  }
  const auto all_done = [this] {
    return std::all_of(buckets_.begin(), buckets_.end(), [](const Bucket& b) { return b.done; });
  };
  // `turn` every 100 ms of waiting, however often a finished bucket wakes
  // the wait: a quiet 100 ms (on any clock), or 100 ms on the sync's clock.
  constexpr absl::Duration kTurnEvery = absl::Milliseconds(100);
  absl::Time last_turn = options_.clock->Now();
  while (!all_done()) {
    const bool quiet = !cv_.WaitFor(&mu_, kTurnEvery);
    if (all_done() || !turn) continue;
    if (quiet || options_.clock->Now() - last_turn >= kTurnEvery) {
      turn();
      last_turn = options_.clock->Now();
    }
  }
  // The pass is over: hooks stay quiet until the next Begin (another
  // sync's pass may run backward through these parameters).
  syncing_ = false;
  const absl::Time reduce_deadline = deadline_;
  Communicator* const comm = comm_;
  double comm_seconds = comm_seconds_;
  for (const Bucket& b : buckets_) {
    if (!b.status.ok()) return b.status;
  }
  lock.Unlock();
  const absl::Time refill_start = options_.clock->Now();
  const std::vector<float> words = ReadWords();
  absl::Status s = ReduceRefilled(comm, words, reduce_deadline);
  comm_seconds += absl::ToDoubleSeconds(options_.clock->Now() - refill_start);
  stats_.comm_seconds = comm_seconds;
  stats_.wait_seconds = absl::ToDoubleSeconds(options_.clock->Now() - start);
  MUSTER_RETURN_IF_ERROR(s);
  // The refills leave the last bucket, and so the words, as they were.
  // Reduce-scattered buckets hold the average only in this rank's segments:
  // the .grad keep this rank's sum.
  Install(words, /*grads=*/!scatter_);
  return absl::OkStatus();
}

std::vector<float> GradientSync::ReadWords() const {
  if (buckets_.empty()) return {};
  const torch::Tensor host = WordsView().to(torch::kCPU);
  const float* w = host.data_ptr<float>();
  return std::vector<float>(w, w + host.numel());
}

absl::Status GradientSync::ReduceRefilled(Communicator* comm, const std::vector<float>& words,
                                          absl::Time deadline) {
  stats_.refilled_buckets = 0;
  for (size_t i = 0; i + 1 < buckets_.size(); ++i) {
    if (words[i] <= 0) continue;  // no rank touched it again
    Bucket& b = buckets_[i];
    MUSTER_RETURN_IF_ERROR(WithBuffer(b, [&] {
      if (pooled_) return ReduceAndTake(comm, i, /*fill=*/true, deadline);
      for (size_t j = 0; j < b.params.size(); ++j) FillFromGrad(b, j, /*use_grad=*/true);
      return ReduceBucket(comm, i, ReduceOp::kAverage, deadline, scatter_);
    }));
    ++stats_.refilled_buckets;
  }
  return absl::OkStatus();
}

void GradientSync::FillFromGrad(Bucket& b, size_t j, bool use_grad) {
  const torch::Tensor& p = params_[b.params[j]];
  FillSlot(p, 0, b.buffer.narrow(0, b.offsets[j], p.numel()), use_grad);
}

void GradientSync::FillSlot(const torch::Tensor& p, int64_t from, torch::Tensor slot,
                            bool use_grad) {
  torch::NoGradGuard no_grad;
  if (use_grad && p.grad().defined()) {
    slot.copy_(p.grad().reshape({-1}).narrow(0, from, slot.numel()));
  } else {
    slot.zero_();
  }
}

void GradientSync::Install(const std::vector<float>& words, bool grads) {
  if (!words.empty()) {
    for (int i = 0; i < kControlWords; ++i) {
      control_[i] = words[words.size() - kControlWords + static_cast<size_t>(i)];
    }
  }
  if (!grads) return;
  for (Bucket& b : buckets_) InstallBucket(b, words);
}

void GradientSync::InstallBucket(const Bucket& b, const std::vector<float>& words) {
  torch::NoGradGuard no_grad;
  const size_t used_at = buckets_.size();
  for (size_t j = 0; j < b.params.size(); ++j) {
    // No rank had a gradient for it (unused in every rank's forward, or
    // frozen): its .grad is left as it is, none, as one process leaves
    // it, so that the optimizer skips it rather than step it with zeros.
    if (words[used_at + b.params[j]] <= 0) continue;
    torch::Tensor& p = params_[b.params[j]];
    if (views_) {
      // The slot is the gradient: whatever backward made is let go.
      p.mutable_grad() = AliasOf(b.buffer, b.offsets[j], p.sizes());
      continue;
    }
    torch::Tensor slot = b.buffer.narrow(0, b.offsets[j], p.numel()).view(p.sizes());
    if (p.grad().defined()) {
      p.mutable_grad().copy_(slot);
    } else {
      p.mutable_grad() = slot.clone();
    }
  }
}

absl::Status GradientSync::Resync(Communicator* comm, bool contribute, int contributors,
                                  const std::array<float, kControlWords>& control,
                                  absl::Time deadline) {
  if (contributors <= 0 || contributors > comm->size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("salvage with ", contributors, " contributors of ", comm->size()));
  }
  MakeBuffers();
  for (Bucket& b : buckets_) {
    if (pooled_) break;  // filled one at a time: ResyncPooled
    for (size_t j = 0; j < b.params.size(); ++j) FillFromGrad(b, j, contribute);
  }
  SetControl(control);
  // Every bucket is filled from .grad already; a rank that does not
  // contribute has no gradient to declare.
  std::vector<char> used(params_.size(), 0);
  for (size_t k = 0; k < params_.size(); ++k) {
    used[k] = contribute && params_[k].grad().defined() ? 1 : 0;
  }
  SetFlags(/*from_buckets=*/false, used);
  // All contribute: the very reduction of a step, so that a salvaged step
  // equals one taken in this world. Otherwise sum, then divide.
  const bool all = contributors == comm->size();
  const ReduceOp op = all ? ReduceOp::kAverage : ReduceOp::kSum;
  if (pooled_) return ResyncPooled(comm, contribute, all ? 0 : contributors, op, deadline);
  for (size_t i = 0; i < buckets_.size(); ++i) {
    MUSTER_RETURN_IF_ERROR(ReduceBucket(comm, i, op, deadline, /*scatter=*/false));
  }
  if (!all && !buckets_.empty()) {
    for (size_t i = 0; i < buckets_.size(); ++i) bucket_gradients(i).div_(contributors);
    WordsView().div_(comm->size());
  }
  Install(ReadWords(), /*grads=*/true);
  return absl::OkStatus();
}

}  // namespace muster
