// Distributed::memory_account() against the bytes LibTorch's CPU allocator
// really holds: four ranks (threads of this process, real coordinator and
// communicators) train an MLP with AdamW while a counting allocator wraps
// LibTorch's own; after the same AfterBackward on every rank, the live bytes
// of the process and the sum of the four accounts agree within 5%, whole,
// sharded with two copies and reduce-scattered with one.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <c10/core/CPUAllocator.h>
#include <torch/version.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <iostream>
#include <mutex>
#include <regex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "muster/muster.h"
#include "tests/integration/coordinator_fixture.h"
#include "tests/integration/quiet_options.h"

namespace muster {
namespace {

// LibTorch's CPU allocator, counting the bytes of the blocks it has handed
// out and not yet had back. Installed for the life of the test process
// (tensors it made may outlive a test); counts only while installed.
class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}

#if TORCH_VERSION_MAJOR >= 2
  c10::DataPtr allocate(size_t n) override { return Wrap(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#else
  c10::DataPtr allocate(size_t n) const override { return Wrap(n); }
#endif

  int64_t live() const { return live_.load(); }

 private:
  struct Block {
    c10::DataPtr inner;
    size_t bytes;
    std::atomic<int64_t>* live;
  };
  static void Free(void* ctx) {
    auto* block = static_cast<Block*>(ctx);
    block->live->fetch_sub(static_cast<int64_t>(block->bytes));
    delete block;  // and the inner pointer with it
  }
  c10::DataPtr Wrap(size_t n) const {
    c10::DataPtr inner = base_->allocate(n);
    void* data = inner.get();
    const c10::Device device = inner.device();
    live_.fetch_add(static_cast<int64_t>(n));
    return {data, new Block{std::move(inner), n, &live_}, &Free, device};
  }

  c10::Allocator* base_;
  mutable std::atomic<int64_t> live_{0};
};

CountingAllocator* Counting() {
  static CountingAllocator* counting = [] {
    auto* c = new CountingAllocator(c10::GetCPUAllocator());
    c10::SetCPUAllocator(c, /*priority=*/1);
    return c;
  }();
  return counting;
}

// The ranks meet here after an AfterBackward; the last to arrive measures.
class Meeting {
 public:
  explicit Meeting(int n) : n_(n) {}
  void Arrive(const std::function<void()>& last) {
    std::unique_lock<std::mutex> lock(mu_);
    if (++arrived_ == n_) {
      last();
      done_ = true;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [this] { return done_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_, arrived_ = 0;
  bool done_ = false;
};

struct Measured {
  int64_t live = 0;
  int64_t accounted = 0;
  int64_t largest = 0;    // the largest rank's account total
  double exported = -1;   // the coordinator's muster_rank_memory_bytes, summed
};

// The sum of muster_rank_memory_bytes over its categories in `metrics`.
double ExportedMemory(const std::string& metrics) {
  static const std::regex line("muster_rank_memory_bytes\\{category=\"[a-z_]+\"\\} ([0-9.e+]+)");
  double sum = 0;
  for (auto it = std::sregex_iterator(metrics.begin(), metrics.end(), line);
       it != std::sregex_iterator(); ++it) {
    sum += std::stod((*it)[1].str());
  }
  return sum;
}

Measured TrainAndMeasure(int copies, bool reduce_scatter) {
  constexpr int kWorld = 4, kMeasureAt = 3;
  CountingAllocator* counting = Counting();
  auto server = InProcessCoordinator::Start(kWorld);
  std::atomic<int64_t> accounted{0}, largest{0};
  Measured out;
  Meeting meeting(kWorld), ended(kWorld);
  std::vector<std::thread> ranks;
  for (int i = 0; i < kWorld; ++i) {
    ranks.emplace_back([&, i] {
      torch::nn::Sequential model(torch::nn::Linear(512, 1024), torch::nn::Tanh(),
                                  torch::nn::Linear(1024, 1024), torch::nn::Tanh(),
                                  torch::nn::Linear(1024, 512));
      torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));
      Options o = QuietOptions(server->port(),
                               absl::StrCat("account", ::getpid(), copies, reduce_scatter));
      o.node_id = absl::StrCat("n", i / 2);
      o.local_rank = i % 2;
      o.backend = Backend::kHier;
      o.batch_per_rank = 2;
      o.steps = kMeasureAt + 1;
      o.shard_optimizer_state = copies > 0;
      o.optimizer_state_copies = std::max(copies, 1);
      o.reduce_scatter_gradients = reduce_scatter;
      State state;
      state.model = model.ptr().get();
      state.optimizer = &optimizer;
      auto job = Distributed::Start(o, state);
      ASSERT_TRUE(job.ok()) << job.status();
      Distributed& d = **job;
      while (!d.ShouldStop()) {
        const int64_t step = d.step();
        const torch::Tensor x = torch::randn({2, 512});
        optimizer.zero_grad();
        d.BeforeBackward();
        model->forward(x).pow(2).mean().backward();
        ASSERT_TRUE(d.AfterBackward().ok());
        if (step == kMeasureAt) {
          accounted += d.memory_account().total();
          meeting.Arrive([&] {
            out.live = counting->live();
            out.accounted = accounted.load();
          });
        }
        optimizer.step();
      }
      // Still members: the heartbeats carry each rank's account to the
      // coordinator, whose /metrics gives the largest rank's.
      const int64_t total = d.memory_account().total();
      for (int64_t seen = largest.load(); total > seen && !largest.compare_exchange_weak(seen, total);) {
      }
      ended.Arrive([&] {
        out.largest = largest.load();
        for (int tries = 0; tries < 150 && out.exported != static_cast<double>(out.largest);
             ++tries) {
          out.exported = ExportedMemory(server->MetricsText());
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
      });
      EXPECT_EQ(Distributed::ExitCode(d.Finish()), 0);
    });
  }
  for (std::thread& t : ranks) t.join();
  return out;
}

TEST(MemoryAccountTest, TheAccountsAddUpToWhatTheAllocatorHolds) {
  const int64_t before = Counting()->live();
  for (auto [copies, scatter] : {std::pair{0, false}, {2, false}, {1, true}}) {
    const Measured m = TrainAndMeasure(copies, scatter);
    const double live = static_cast<double>(m.live - before);
    ASSERT_GT(live, 100e6) << "four ranks hold more than 100 MB";
    std::cout << copies << " copies" << (scatter ? ", reduce-scattered" : "") << ": accounted "
              << m.accounted / 1e6 << " MB, the allocator holds " << live / 1e6 << " MB\n";
    EXPECT_NEAR(static_cast<double>(m.accounted), live, 0.05 * live)
        << copies << " copies" << (scatter ? ", reduce-scattered" : "") << ": accounted "
        << m.accounted / 1e6 << " MB, the allocator holds " << live / 1e6 << " MB";
    // The coordinator's /metrics carries the largest rank's account.
    EXPECT_EQ(m.exported, static_cast<double>(m.largest))
        << copies << " copies: muster_rank_memory_bytes sums to " << m.exported
        << ", the largest rank holds " << m.largest;
  }
}

}  // namespace
}  // namespace muster
