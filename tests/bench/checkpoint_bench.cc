// muster-bench checkpoint --state-mb N: the asynchronous checkpointer on N MB
// of training state (parameters + SGD momentum, float32) under a synthetic,
// memory-bound training step. Prints
//   checkpoint state_mb=.. blocking_s=.. write_s=.. write_MBps=.. dd_direct_MBps=..
//   step_overhead_pct=..
// blocking_s: the step's pause while state is copied to host buffers (median
// of the checkpoints after the first, which allocates them); write_s: the
// background write; step_overhead_pct: steady-state step time with a
// checkpoint every 50 steps vs none; dd_direct_MBps: `dd oflag=direct` into the
// same directory, for comparison.
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
  explicit BigState(int64_t floats) {
    const int64_t chunk = 25'000'000;  // 100 MB tensors
    for (int i = 0; floats > 0; ++i) {
      params_.push_back(register_parameter(absl::StrCat("w", i),
                                           torch::zeros({std::min(chunk, floats)})));
      floats -= chunk;
    }
  }
  std::vector<torch::Tensor> params_;
};

}  // namespace

int RunCheckpointBench() {
  const int state_mb = absl::GetFlag(FLAGS_state_mb);
  std::string dir = absl::GetFlag(FLAGS_dir);
  if (dir.empty()) dir = absl::StrCat("/var/tmp/muster-bench-checkpoint-", ::getpid());
  DefaultFileSystem()->CreateDir(dir).IgnoreError();
  torch::set_num_threads(1);
  // Half the state is parameters, half SGD momentum.
  BigState model(int64_t{state_mb} * 1'000'000 / 4 / 2);
  torch::optim::SGD optimizer(model.parameters(), torch::optim::SGDOptions(1e-9).momentum(0.9));
  for (auto& p : model.parameters()) p.mutable_grad() = torch::ones_like(p);
  auto step = [&] { optimizer.step(); };
  step();  // creates the momentum buffers

  const int kSteps = 100, kEvery = 50;
  absl::Time t0 = absl::Now();
  for (int i = 0; i < kSteps; ++i) step();
  const double base = absl::ToDoubleSeconds(absl::Now() - t0) / kSteps;

  Checkpointer ckpt(dir, model, optimizer);
  std::mutex mu;
  std::vector<double> blocking, writing;
  uint64_t bytes = 0;
  auto done = [&](absl::StatusOr<std::vector<FileReport>> files, CheckpointTiming t) {
    std::lock_guard<std::mutex> lock(mu);
    if (!files.ok()) {
      std::cerr << "checkpoint failed: " << files.status() << "\n";
      return;
    }
    blocking.push_back(t.blocking_seconds);
    writing.push_back(t.write_seconds);
    bytes = t.bytes;
  };
  // Warm-up checkpoint: allocates the reused host buffers.
  CheckpointMeta meta;
  meta.model = "bench";
  meta.optimizer = "sgd";
  if (!ckpt.Snapshot(meta, done).ok()) return 1;
  ckpt.Wait();
  {
    std::lock_guard<std::mutex> lock(mu);
    blocking.clear();
    writing.clear();
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
  ckpt.Wait();
  const double with = absl::ToDoubleSeconds(absl::Now() - t0) / (kRounds * kEvery);
  const double write_s = Median(writing);
  std::cout << absl::StrFormat(
                   "checkpoint state_mb=%d blocking_s=%.3f write_s=%.3f write_MBps=%.0f "
                   "dd_direct_MBps=%.0f step_s=%.4f step_overhead_pct=%.1f",
                   state_mb, Median(blocking), write_s, bytes / std::max(write_s, 1e-9) / 1e6,
                   DdDirectMBps(dir), base, 100.0 * (with / base - 1.0))
            << std::endl;
  DefaultFileSystem()->RemoveAll(dir).IgnoreError();
  return 0;
}

}  // namespace muster
