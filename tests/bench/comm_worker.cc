// muster-bench comm-worker: one rank of a communicator job, as a process.
// Used by `muster-bench allreduce` (timings) and by the process tests
// (--check: correctness; --abort-test: fail, abort, rebuild).
//
// It joins the coordinator like a trainer (session, rendezvous), builds the
// communicator for its world through the coordinator's KV, and writes what it
// saw to --report (one line per event) and, on rank 0, timing lines to stdout.
#include <fstream>
#include <iostream>
#include <mutex>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "tests/bench/process_stats.h"
#include "trainer/client/coordinator_client.h"
#include "trainer/comm/factory.h"

ABSL_FLAG(std::string, coordinator, "", "host:port");
ABSL_FLAG(std::string, token_file, "", "job token file");
ABSL_FLAG(std::string, member, "", "member id");
ABSL_FLAG(std::string, node, "node0", "node name");
ABSL_FLAG(int, local_rank, 0, "local rank");
ABSL_FLAG(std::string, backend, "auto", "gloo, shm, hier, nccl, auto");
ABSL_FLAG(std::string, job, "bench", "job name (shared memory names)");
ABSL_FLAG(std::string, sizes, "4K,1M,4M,16M,64M", "message sizes in bytes (K, M suffixes)");
ABSL_FLAG(bool, check, false, "verify results against the reference sum");
ABSL_FLAG(bool, abort_test, false, "loop until a collective fails, then rebuild");
ABSL_FLAG(std::string, report, "", "file to append event lines to");
ABSL_FLAG(int, nodes, 1, "node count (for the output line)");

namespace muster {
namespace {

void Report(const std::string& line) {
  const std::string path = absl::GetFlag(FLAGS_report);
  if (path.empty()) return;
  std::ofstream(path, std::ios::app) << line << std::endl;
}

absl::StatusOr<std::vector<size_t>> ParseSizes(const std::string& spec) {
  std::vector<size_t> out;
  for (absl::string_view part : absl::StrSplit(spec, ',', absl::SkipEmpty())) {
    size_t mult = 1;
    if (absl::EndsWith(part, "K")) mult = 1 << 10;
    if (absl::EndsWith(part, "M")) mult = 1 << 20;
    if (mult != 1) part.remove_suffix(1);
    size_t v = 0;
    if (!absl::SimpleAtoi(part, &v)) {
      return absl::InvalidArgumentError(absl::StrCat("bad size '", part, "'"));
    }
    out.push_back(v * mult);
  }
  return out;
}

// The live communicator, so the session thread can abort it.
struct Current {
  std::mutex mu;
  Communicator* comm = nullptr;
  absl::Time notice = absl::InfinitePast();
};

absl::Status Fill(Communicator& comm, std::vector<float>& data, int rank) {
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(rank + 1 + (i % 5));
  (void)comm;
  return absl::OkStatus();
}

bool Verify(const std::vector<float>& data, int world) {
  for (size_t i = 0; i < data.size(); ++i) {
    float expected = 0;
    for (int r = 0; r < world; ++r) expected += static_cast<float>(r + 1 + (i % 5));
    if (data[i] != expected) return false;
  }
  return true;
}

}  // namespace

int RunCommWorker() {
  ClientOptions co;
  co.target = absl::GetFlag(FLAGS_coordinator);
  co.member_id = absl::GetFlag(FLAGS_member);
  co.node = absl::GetFlag(FLAGS_node);
  co.local_rank = static_cast<uint32_t>(absl::GetFlag(FLAGS_local_rank));
  if (!absl::GetFlag(FLAGS_token_file).empty()) {
    std::ifstream in(absl::GetFlag(FLAGS_token_file));
    std::getline(in, co.token);
  }
  auto backend = ParseBackend(absl::GetFlag(FLAGS_backend));
  auto sizes = ParseSizes(absl::GetFlag(FLAGS_sizes));
  if (!backend.ok() || !sizes.ok()) {
    std::cerr << "comm-worker: " << (backend.ok() ? sizes.status() : backend.status()) << "\n";
    return 2;
  }
  auto client_or = CoordinatorClient::Create(co);
  if (!client_or.ok()) return 2;
  std::unique_ptr<CoordinatorClient> client = std::move(*client_or);
  Current current;
  if (!client->Join(0, absl::Now() + absl::Seconds(30)).ok()) return 3;
  client->StartSession([&](const SessionNotice& n) {
    if (n.kind == SessionNotice::Kind::kRegroup && !n.abort) return;
    std::lock_guard<std::mutex> lock(current.mu);
    current.notice = absl::Now();
    if (current.comm != nullptr) current.comm->Abort(absl::AbortedError(n.reason));
  }).IgnoreError();

  CommOptions options;
  options.backend = *backend;
  options.job = absl::GetFlag(FLAGS_job);
  options.gloo.hostname = "127.0.0.1";
  uint64_t after = 0;
  bool rebuilt = false;
  while (true) {
    auto world = client->Rendezvous(after, 0, absl::Now() + absl::Seconds(60));
    if (!world.ok()) {
      Report(absl::StrCat("rendezvous_failed ", world.status().ToString()));
      return 4;
    }
    auto store = NewCoordinatorStore(client.get(), world->generation);
    auto comm = BuildCommunicator(*world, store.get(), options, absl::Now() + absl::Seconds(60));
    if (!comm.ok()) {
      Report(absl::StrCat("build_failed ", comm.status().ToString()));
      return 5;
    }
    {
      std::lock_guard<std::mutex> lock(current.mu);
      current.comm = comm->get();
    }
    const int rank = world->rank, w = world->world_size;
    Report(absl::StrCat("ready generation=", world->generation, " rank=", rank, " world=", w,
                        " backend=", (*comm)->name()));
    int exit_code = 0;
    if (absl::GetFlag(FLAGS_abort_test) && !rebuilt && world->generation == 1) {
      // Run until a collective fails (a peer was killed or stopped).
      std::vector<float> data(1 << 20);
      absl::Status s;
      while (s.ok()) {
        Fill(**comm, data, rank).IgnoreError();
        s = (*comm)->AllReduce(data.data(), data.size(), DataType::kFloat32, ReduceOp::kSum,
                               absl::Now() + absl::Seconds(60));
      }
      const absl::Time failed = absl::Now();
      // Wait (briefly) for the coordinator's notice, to time the return from it.
      absl::Time notice;
      for (int i = 0; i < 500; ++i) {
        {
          std::lock_guard<std::mutex> lock(current.mu);
          notice = current.notice;
        }
        if (notice != absl::InfinitePast()) break;
        absl::SleepFor(absl::Milliseconds(10));
      }
      Report(absl::StrFormat("error code=%s return_after_notice_ms=%.1f message=%s",
                             absl::StatusCodeToString(s.code()),
                             absl::ToDoubleMilliseconds(failed - notice),
                             std::string(s.message())));
      after = world->generation;
      rebuilt = true;
      std::lock_guard<std::mutex> lock(current.mu);
      current.comm = nullptr;
      continue;
    }
    if (absl::GetFlag(FLAGS_check) || rebuilt || absl::GetFlag(FLAGS_abort_test)) {
      for (size_t bytes : *sizes) {
        std::vector<float> data(bytes / sizeof(float));
        Fill(**comm, data, rank).IgnoreError();
        absl::Status s = (*comm)->AllReduce(data.data(), data.size(), DataType::kFloat32,
                                            ReduceOp::kSum, absl::Now() + absl::Seconds(60));
        const bool ok = s.ok() && Verify(data, w);
        Report(absl::StrCat(ok ? "check_ok" : "check_failed", " bytes=", bytes, " ",
                            s.ToString()));
        if (!ok) exit_code = 6;
      }
    } else {
      // Timing: median over repeats of a barrier-separated all-reduce.
      for (size_t bytes : *sizes) {
        std::vector<float> data(std::max<size_t>(1, bytes / sizeof(float)), 1.0f);
        const int reps = static_cast<int>(std::clamp<size_t>((512u << 20) / std::max<size_t>(bytes, 1), 5, 50));
        std::vector<double> times;
        for (int i = 0; i < reps + 2; ++i) {
          if (!(*comm)->Barrier(absl::Now() + absl::Seconds(60)).ok()) return 7;
          const absl::Time t0 = absl::Now();
          if (!(*comm)->AllReduce(data.data(), data.size(), DataType::kFloat32, ReduceOp::kSum,
                                  absl::Now() + absl::Seconds(120)).ok()) {
            return 7;
          }
          if (i >= 2) times.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
        }
        // Average each repeat over the ranks, then take the median repeat.
        if (!(*comm)->AllReduce(times.data(), times.size(), DataType::kFloat64, ReduceOp::kSum,
                                absl::Now() + absl::Seconds(60)).ok()) {
          return 7;
        }
        for (double& t : times) t /= w;  // mean over ranks of each repeat
        const double median = Percentile(times, 50);
        const double algbw = bytes / median / 1e9;
        if (rank == 0) {
          std::cout << absl::StrFormat(
                           "allreduce backend=%s world=%d nodes=%d bytes=%d median_s=%.6f "
                           "algbw_GBps=%.3f busbw_GBps=%.3f",
                           absl::GetFlag(FLAGS_backend), w, absl::GetFlag(FLAGS_nodes), bytes,
                           median, algbw, algbw * 2.0 * (w - 1) / w)
                    << std::endl;
        }
      }
    }
    {
      std::lock_guard<std::mutex> lock(current.mu);
      current.comm = nullptr;
    }
    comm->reset();
    client->Leave(/*finished=*/true, 0).IgnoreError();
    Report(absl::StrCat(rebuilt ? "rebuilt_done" : "done", " exit=", exit_code));
    return exit_code;
  }
}

}  // namespace muster
