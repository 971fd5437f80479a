// muster-bench train: W muster-train processes (M nodes) on loopback against
// a real coordinator process, SGD with momentum, batch 64 per rank,
// Fashion-MNIST. Runs twice — buckets overlapped with backward, and one
// all-reduce after backward — and prints a line for each:
//   train model=.. world=.. nodes=.. batch_per_rank=64 steps=.. overlap=..
//   gradient_compression=.. steps_per_s=.. samples_per_s=.. comm_overlap_pct=..
//   test_accuracy=..
// and after each, rank 0's step timeline (Distributed::step_timeline):
//   phases rank=0 steps=.. step_ms=.. forward_ms=.. ... gather_ms=..
// --gradient-compression bf16|fp16 is passed to every trainer (buckets
// cross nodes compressed); tests/bench/pytorch_step.py --comm-hook is
// PyTorch DDP's side of the same comparison.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <iostream>
#include <regex>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tests/bench/process_stats.h"

ABSL_FLAG(std::string, model, "cnn", "mlp, cnn or resnet18");
ABSL_FLAG(std::string, dataset, "fashion-mnist", "fashion-mnist or synthetic");
ABSL_FLAG(int, batch, 64, "batch per rank");
ABSL_FLAG(bool, compare_buffers, false,
          "compare buffer broadcasting on and off (overlapped buckets both times) instead of "
          "overlap on and off");
ABSL_FLAG(int64_t, steps, 100, "training steps");
ABSL_FLAG(double, bucket_mb, 25, "gradient bucket size in MiB");
ABSL_FLAG(bool, compare_backward_calls, false,
          "instead of overlap on/off: one backward per step against --backward-calls backward "
          "calls in its one synchronised pass (each rank's batch in that many parts)");
ABSL_FLAG(int, backward_calls, 2, "with --compare-backward-calls: the parts of the batch");
ABSL_FLAG(bool, compare_sharding, false,
          "AdamW unsharded, then with --shard-optimizer: step rate, the optimizer state elements, "
          "and the peak and steady-state (median sample) RSS of the largest rank");
ABSL_FLAG(std::vector<std::string>, sharded_flags, {},
          "with --compare-sharding: more muster-train flags for the sharded run alone, "
          "comma-separated (e.g. --optimizer-state-copies=1,--reduce-scatter)");
ABSL_DECLARE_FLAG(std::vector<std::string>, trainer_flags);
ABSL_DECLARE_FLAG(int, world);
ABSL_DECLARE_FLAG(int, nodes);
ABSL_DECLARE_FLAG(std::string, gradient_compression);

namespace muster {
namespace {

double Field(const std::string& json, const std::string& name) {
  const std::string v = JsonNumber(json, name);
  return v.empty() ? 0 : std::stod(v);
}

// A trainer's step timeline (its summary's phase_* fields) as one line:
//   phases rank=0 steps=.. step_ms=.. forward_ms=.. ... gather_ms=..
std::string PhasesLine(const std::string& json) {
  std::string line = "phases rank=0";
  for (const char* f : {"steps", "step_ms", "forward_ms", "before_backward_ms", "backward_ms",
                        "after_backward_ms", "optimizer_ms", "boundary_ms", "reduce_ms",
                        "gather_ms"}) {
    absl::StrAppend(&line, " ", f, "=", JsonNumber(json, absl::StrCat("phase_", f)));
  }
  return line;
}

// Each trainer's resident memory, sampled every 250 ms from its start
// until Stop: a trainer's steady state is its median sample (what it holds
// from step to step, without the start and the end's moments), and the
// figure is the largest of any trainer's.
class RssSampler {
 public:
  explicit RssSampler(std::vector<pid_t> pids)
      : samples_(pids.size()), thread_([this, pids] {
          while (!stop_.load()) {
            for (size_t i = 0; i < pids.size(); ++i) {
              if (const double mb = ProcessRssMb(pids[i]); mb > 0) samples_[i].push_back(mb);
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(250));
          }
        }) {}
  ~RssSampler() { Stop(); }
  // Stops sampling; the largest trainer's median sample in MB.
  double SteadyMb() {
    Stop();
    double steady = 0;
    for (std::vector<double>& s : samples_) steady = std::max(steady, Percentile(s, 50));
    return steady;
  }

 private:
  void Stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  std::atomic<bool> stop_{false};
  std::vector<std::vector<double>> samples_;
  std::thread thread_;
};

// Reaps `trainers`: how many failed, and the largest peak RSS in KiB.
int WaitTrainers(const std::vector<pid_t>& trainers, long* peak_rss_kb) {  // NOLINT(runtime/int)
  int failures = 0;
  for (pid_t p : trainers) {
    int status = 0;
    struct rusage usage {};
    ::wait4(p, &status, 0, &usage);
    *peak_rss_kb = std::max(*peak_rss_kb, usage.ru_maxrss);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failures;
  }
  return failures;
}

// A trainer's memory account (its summary's memory_* fields), in MB.
std::string MemoryLine(const std::string& json) {
  std::string line = "memory_account";
  for (const char* category : {"parameters", "gradients", "optimizer_state", "communication",
                               "staging", "transfer", "total"}) {
    absl::StrAppendFormat(&line, " %s_mb=%.1f", category,
                          Field(json, absl::StrCat("memory_", category)) / 1e6);
  }
  return line;
}

// The flags every trainer gets after the run's own: --trainer-flags, the
// host's cores shared out, and the optimizer `shard` names (RunOnce).
std::vector<std::string> MoreTrainerFlags(int world, int shard) {
  std::vector<std::string> more = absl::GetFlag(FLAGS_trainer_flags);
  // Every trainer runs on this one host, but each "node" would share out
  // all of its cores among its own trainers: two nodes of one trainer on
  // two cores ran four threads, and the CNN's step took several times as
  // long (docs/benchmarks.md, "Training").
  // The host's cores are shared among all the trainers instead, unless
  // --trainer-flags names --threads.
  if (std::none_of(more.begin(), more.end(),
                   [](const std::string& f) { return f.rfind("--threads", 0) == 0; })) {
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    more.push_back(absl::StrCat("--threads=", std::max(1, cores / world)));
  }
  if (shard >= 0) more.push_back("--optimizer=adamw");
  if (shard > 0) {
    more.push_back("--shard-optimizer");
    for (const std::string& f : absl::GetFlag(FLAGS_sharded_flags)) more.push_back(f);
  }
  return more;
}

// What the trainers' summaries say of the run, taken together.
struct Summaries {
  double steps_per_s = 1e30;  // the slowest trainer's
  double overlap_pct = 0;     // the mean over the trainers
  double accuracy = 0;        // rank 0's
  double state_elements = 0;  // the largest
  std::string phases;         // rank 0's step timeline
  std::string memory;         // the memory account of the rank that held the most
};

Summaries ReadSummaries(const std::string& dir, int world) {
  Summaries sum;
  double most_held = -1;
  for (int i = 0; i < world; ++i) {
    std::ifstream in(absl::StrCat(dir, "/summary", i, ".json"));
    std::stringstream ss;
    ss << in.rdbuf();
    sum.steps_per_s = std::min(sum.steps_per_s, Field(ss.str(), "steps_per_s"));
    sum.overlap_pct += Field(ss.str(), "comm_overlap_pct") / world;
    if (Field(ss.str(), "rank") == 0) {
      sum.accuracy = Field(ss.str(), "test_accuracy");
      sum.phases = PhasesLine(ss.str());
    }
    sum.state_elements = std::max(sum.state_elements, Field(ss.str(), "optimizer_state_elements"));
    if (Field(ss.str(), "memory_total") > most_held) {
      most_held = Field(ss.str(), "memory_total");
      sum.memory = MemoryLine(ss.str());
    }
  }
  return sum;
}

// `shard`: -1 the optimizer of the trainers' default (SGD); 0 AdamW; 1
// AdamW with its state sharded (--shard-optimizer).
int RunOnce(bool overlap, bool broadcast_buffers, int backward_calls = 1, int shard = -1) {
  const int world = absl::GetFlag(FLAGS_world), nodes = absl::GetFlag(FLAGS_nodes);
  const std::string dir =
      absl::StrCat("/tmp/muster-bench-train-", ::getpid(), overlap ? "-o" : "-n");
  std::system(("mkdir -p " + dir).c_str());
  const std::string target = "127.0.0.1:" + std::to_string(FreeLoopbackPort());
  const pid_t coordinator = SpawnLogged({SelfDir() + "/muster-coordinator", "--listen=" + target,
                                         "--no-auth", absl::StrCat("--min-members=", world),
                                         absl::StrCat("--max-members=", world), "--last-call=0s"},
                                        dir + "/coordinator.log");
  std::vector<pid_t> trainers;
  const int per_node = world / nodes;
  const std::vector<std::string> more = MoreTrainerFlags(world, shard);
  for (int i = 0; i < world; ++i) {
    std::vector<std::string> argv = {SelfDir() + "/muster-train", "--coordinator=" + target,
         absl::StrCat("--node-id=node", i / per_node), absl::StrCat("--local-rank=", i % per_node),
         "--model=" + absl::GetFlag(FLAGS_model), "--dataset=" + absl::GetFlag(FLAGS_dataset),
         absl::StrCat("--batch-size=", absl::GetFlag(FLAGS_batch)),
         absl::StrCat("--broadcast-buffers=", broadcast_buffers ? "true" : "false"),
         absl::StrCat("--steps=", absl::GetFlag(FLAGS_steps)), "--lr=0.01",
         absl::StrCat("--overlap=", overlap ? "true" : "false"), "--quiet",
         absl::StrCat("--backward-calls=", backward_calls),
         absl::StrCat("--bucket-mb=", absl::GetFlag(FLAGS_bucket_mb)),
         "--gradient-compression=" + absl::GetFlag(FLAGS_gradient_compression),
         absl::StrCat("--job=tb", ::getpid()),
         absl::StrCat("--summary-json=", dir, "/summary", i, ".json")};
    argv.insert(argv.end(), more.begin(), more.end());
    trainers.push_back(SpawnLogged(argv, absl::StrCat(dir, "/trainer", i, ".log")));
  }
  RssSampler rss(trainers);
  long peak_rss_kb = 0;  // NOLINT(runtime/int): rusage's type
  const int failures = WaitTrainers(trainers, &peak_rss_kb);
  const double steady_rss_mb = rss.SteadyMb();
  StopProcess(coordinator);
  if (failures > 0) {
    std::cerr << "muster-bench train: " << failures << " trainers failed; see " << dir << "\n";
    return 1;
  }
  const Summaries sum = ReadSummaries(dir, world);
  const double steps_per_s = sum.steps_per_s;
  std::cout << absl::StrFormat(
                   "train model=%s world=%d nodes=%d batch_per_rank=%d steps=%lld bucket_mb=%g "
                   "overlap=%s "
                   "broadcast_buffers=%s gradient_compression=%s backward_calls=%d "
                   "steps_per_s=%.2f "
                   "samples_per_s=%.0f comm_overlap_pct=%.1f test_accuracy=%.4f",
                   absl::GetFlag(FLAGS_model), world, nodes, absl::GetFlag(FLAGS_batch),
                   static_cast<long long>(absl::GetFlag(FLAGS_steps)),
                   absl::GetFlag(FLAGS_bucket_mb), overlap ? "buckets" : "after_backward",
                   broadcast_buffers ? "on" : "off", absl::GetFlag(FLAGS_gradient_compression),
                   backward_calls, steps_per_s, steps_per_s * absl::GetFlag(FLAGS_batch) * world,
                   sum.overlap_pct, sum.accuracy)
            << (shard < 0 ? ""
                          : absl::StrFormat(" optimizer=adamw shard_optimizer=%s "
                                            "optimizer_state_elements=%.0f peak_rss_mb=%.0f "
                                            "steady_rss_mb=%.0f",
                                            shard > 0 ? "on" : "off", sum.state_elements,
                                            peak_rss_kb / 1024.0, steady_rss_mb))
            << std::endl
            << sum.phases << std::endl;
  if (shard >= 0) std::cout << sum.memory << std::endl;
  std::system(("rm -rf " + dir).c_str());
  return 0;
}

}  // namespace

int RunTrainBench() {
  if (absl::GetFlag(FLAGS_compare_sharding)) {
    if (int rc = RunOnce(/*overlap=*/true, /*broadcast_buffers=*/true, 1, /*shard=*/0); rc != 0) {
      return rc;
    }
    return RunOnce(/*overlap=*/true, /*broadcast_buffers=*/true, 1, /*shard=*/1);
  }
  if (absl::GetFlag(FLAGS_compare_backward_calls)) {
    if (int rc = RunOnce(/*overlap=*/true, /*broadcast_buffers=*/true); rc != 0) return rc;
    return RunOnce(/*overlap=*/true, /*broadcast_buffers=*/true,
                   std::max(1, absl::GetFlag(FLAGS_backward_calls)));
  }
  if (absl::GetFlag(FLAGS_compare_buffers)) {
    if (int rc = RunOnce(/*overlap=*/true, /*broadcast_buffers=*/true); rc != 0) return rc;
    return RunOnce(/*overlap=*/true, /*broadcast_buffers=*/false);
  }
  if (int rc = RunOnce(/*overlap=*/true, /*broadcast_buffers=*/true); rc != 0) return rc;
  return RunOnce(/*overlap=*/false, /*broadcast_buffers=*/true);
}

}  // namespace muster
