// muster-bench checkpoint --state-mb N [--device cuda]: the asynchronous
// checkpointer on N MB of training state (parameters + SGD momentum,
// float32) under a synthetic, memory-bound training step. Prints
//   checkpoint device=.. state_mb=.. blocking_s=.. backlog_s=.. write_s=..
//   write_MBps=.. dd_direct_MBps=.. step_overhead_pct=.. [d2h_GBps=..
//   pinned_memcpy_GBps=..]
// backlog_s: a snapshot's wait for the previous checkpoint's write, when
// checkpoints come faster than the disk takes them.
// On the GPU the state lives in device memory; d2h_GBps is the snapshot's
// device-to-host rate (its side-stream copies), pinned_memcpy_GBps a plain
// cudaMemcpy of the same bytes into pinned memory.
// blocking_s: the step's pause while state is copied to host buffers (median
// of the checkpoints after the first, which allocates them); write_s: the
// background write; step_overhead_pct: steady-state step time with a
// checkpoint every 50 steps vs none; dd_direct_MBps: `dd oflag=direct` into the
// same directory, for comparison.
#include <torch/cuda.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <mutex>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "trainer/checkpoint/checkpointer.h"

ABSL_DECLARE_FLAG(int, state_mb);
ABSL_DECLARE_FLAG(std::string, dir);
ABSL_DECLARE_FLAG(std::string, device);

namespace muster {
namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double DdDirectMBps(const std::string& dir) {
  const std::string cmd = absl::StrCat("dd if=/dev/zero of=", dir,
                                       "/dd.test bs=64M count=8 oflag=direct 2>&1; rm -f ", dir,
                                       "/dd.test");
  FILE* p = ::popen(cmd.c_str(), "r");
  char line[512];
  double mbps = 0;
  while (std::fgets(line, sizeof(line), p) != nullptr) {
    // "536870912 bytes (537 MB, 512 MiB) copied, 0.68 s, 790 MB/s"
    double bytes = 0, secs = 0;
    const char* copied = std::strstr(line, "copied, ");
    if (copied != nullptr && std::sscanf(line, "%lf", &bytes) == 1 &&
        std::sscanf(copied + 8, "%lf", &secs) == 1 && secs > 0) {
      mbps = bytes / secs / 1e6;
    }
  }
  ::pclose(p);
  return mbps;
}

class BigState : public torch::nn::Module {
 public:
  BigState(int64_t floats, const torch::Device& device) {
    const int64_t chunk = 25'000'000;  // 100 MB tensors
    for (int i = 0; floats > 0; ++i) {
      params_.push_back(register_parameter(
          absl::StrCat("w", i), torch::zeros({std::min(chunk, floats)}, torch::Device(device))));
      floats -= chunk;
    }
  }
  std::vector<torch::Tensor> params_;
};

void Synchronize(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

// A plain copy of `bytes` from the GPU into pinned host memory: GB/s, the
// best of 5.
double PinnedMemcpyGBps(size_t bytes, const torch::Device& device) {
  torch::Tensor src = torch::ones({static_cast<int64_t>(bytes)},
                                  torch::TensorOptions().dtype(torch::kUInt8).device(device));
  torch::Tensor dst = torch::empty({static_cast<int64_t>(bytes)},
                                   torch::TensorOptions().dtype(torch::kUInt8).pinned_memory(true));
  double best = 0;
  for (int i = 0; i < 5; ++i) {
    Synchronize(device);
    const absl::Time t0 = absl::Now();
    dst.copy_(src);
    Synchronize(device);
    best = std::max(best, bytes / absl::ToDoubleSeconds(absl::Now() - t0) / 1e9);
  }
  return best;
}

}  // namespace

int RunCheckpointBench() {
  const int state_mb = absl::GetFlag(FLAGS_state_mb);
  std::string dir = absl::GetFlag(FLAGS_dir);
  if (dir.empty()) dir = absl::StrCat("/var/tmp/muster-bench-checkpoint-", ::getpid());
  DefaultFileSystem()->CreateDir(dir).IgnoreError();
  torch::set_num_threads(1);
  const torch::Device device(absl::GetFlag(FLAGS_device));
  // Half the state is parameters, half SGD momentum.
  BigState model(int64_t{state_mb} * 1'000'000 / 4 / 2, device);
  torch::optim::SGD optimizer(model.parameters(), torch::optim::SGDOptions(1e-9).momentum(0.9));
  for (auto& p : model.parameters()) p.mutable_grad() = torch::ones_like(p);
  Checkpointer ckpt(dir, model, optimizer, RealClock::Get());
  auto step = [&] {
    ckpt.BeforeUpdate();
    optimizer.step();
  };
  step();  // creates the momentum buffers

  const int kSteps = 100, kEvery = 50;
  Synchronize(device);
  absl::Time t0 = absl::Now();
  for (int i = 0; i < kSteps; ++i) step();
  Synchronize(device);
  const double base = absl::ToDoubleSeconds(absl::Now() - t0) / kSteps;

  std::mutex mu;
  std::vector<double> blocking, backlog, writing, copying;
  uint64_t bytes = 0, device_bytes = 0;
  auto done = [&](absl::StatusOr<std::vector<FileReport>> files, CheckpointTiming t) {
    std::lock_guard<std::mutex> lock(mu);
    if (!files.ok()) {
      std::cerr << "checkpoint failed: " << files.status() << "\n";
      return;
    }
    blocking.push_back(t.blocking_seconds);
    backlog.push_back(t.backlog_seconds);
    writing.push_back(t.write_seconds);
    copying.push_back(t.copy_seconds);
    bytes = t.bytes;
    device_bytes = t.device_bytes;
  };
  // Warm-up checkpoint: allocates the reused host buffers.
  CheckpointMeta meta;
  meta.model = "bench";
  meta.optimizer = "sgd";
  if (!ckpt.Snapshot(meta, done).ok() || !ckpt.Wait().ok()) return 1;
  {
    std::lock_guard<std::mutex> lock(mu);
    blocking.clear();
    backlog.clear();
    writing.clear();
    copying.clear();
  }
  const int kRounds = 4;
  t0 = absl::Now();
  for (int i = 1; i <= kRounds * kEvery; ++i) {
    step();
    if (i % kEvery == 0) {
      meta.step = i;
      if (!ckpt.Snapshot(meta, done).ok()) return 1;
    }
  }
  if (absl::Status s = ckpt.Wait(); !s.ok()) {
    std::cerr << "checkpoint failed: " << s << "\n";
    return 1;
  }
  Synchronize(device);
  const double with = absl::ToDoubleSeconds(absl::Now() - t0) / (kRounds * kEvery);
  const double write_s = Median(writing);
  std::string gpu;
  if (device.is_cuda()) {
    gpu = absl::StrFormat(" d2h_GBps=%.2f pinned_memcpy_GBps=%.2f",
                          device_bytes / std::max(Median(copying), 1e-9) / 1e9,
                          PinnedMemcpyGBps(device_bytes, device));
  }
  std::cout << absl::StrFormat(
                   "checkpoint device=%s state_mb=%d blocking_s=%.4f backlog_s=%.3f write_s=%.3f "
                   "write_MBps=%.0f dd_direct_MBps=%.0f step_s=%.4f step_overhead_pct=%.1f%s",
                   device.str(), state_mb, Median(blocking), Median(backlog), write_s,
                   bytes / std::max(write_s, 1e-9) / 1e6, DdDirectMBps(dir), base,
                   100.0 * (with / base - 1.0), gpu)
            << std::endl;
  DefaultFileSystem()->RemoveAll(dir).IgnoreError();
  return 0;
}

}  // namespace muster
