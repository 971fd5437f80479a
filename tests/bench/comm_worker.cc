// muster-bench comm-worker: one rank of a communicator job, as a process.
// Used by `muster-bench allreduce` (timings; --gradient-compression) and by
// the process tests (--check: correctness; --abort-test: fail, abort,
// rebuild).
//
// It joins the coordinator like a trainer (session, rendezvous), builds the
// communicator for its world through the coordinator's KV, and writes what it
// saw to --report (one line per event) and, on rank 0, timing lines to stdout.
#include <cstdlib>
#include <cstring>
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
#include "common/clock.h"
#include "tests/bench/process_stats.h"
#include "trainer/client/coordinator_store.h"
#include "trainer/comm/factory.h"
#include "trainer/comm/reduce.h"
#include "trainer/comm/values.h"
#ifdef MUSTER_HAVE_CUDA
#include <cuda_runtime.h>

#include "trainer/comm/nccl/nccl_communicator.h"
#endif

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
ABSL_FLAG(std::string, device, "cpu",
          "allreduce, comm-worker, recovery: cpu, or cuda (buffers and training on the GPU)");
ABSL_FLAG(std::string, dtypes, "float32", "--check: float32, bfloat16, float16 (comma list)");
ABSL_FLAG(std::string, collective, "allreduce",
          "allreduce, comm-worker: what is timed, allreduce (the gradients' call), allgather "
          "(even segments, one per rank: the sharded optimizer's gather of the parameters) or "
          "reducescatter (even segments: the sharded optimizer's gradients, compressed across "
          "nodes with --gradient-compression)");
ABSL_FLAG(std::string, gradient_compression, "none",
          "allreduce, train: none, bf16 or fp16 (gradients across nodes; busbw counts the "
          "float32 bytes before compression)");

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

absl::StatusOr<DataType> ParseDataType(absl::string_view name) {
  if (name == "float32") return DataType::kFloat32;
  if (name == "bfloat16") return DataType::kBFloat16;
  if (name == "float16") return DataType::kFloat16;
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype '", name, "'"));
}

// A collective's buffer: float values held as `type`, in host memory or on
// the GPU (--device cuda).
class TestBuffer {
 public:
  TestBuffer(DataType type, size_t count, bool cuda)
      : type_(type), count_(count), bytes_(std::max<size_t>(1, count) * DataTypeSize(type)),
        host_(bytes_) {
#ifdef MUSTER_HAVE_CUDA
    if (cuda && cudaMalloc(&device_, bytes_) != cudaSuccess) device_ = nullptr;
#else
    (void)cuda;
#endif
  }
  ~TestBuffer() {
#ifdef MUSTER_HAVE_CUDA
    if (device_ != nullptr) cudaFree(device_);
#endif
  }
  TestBuffer(const TestBuffer&) = delete;
  TestBuffer& operator=(const TestBuffer&) = delete;

  void* data() { return device_ != nullptr ? device_ : host_.data(); }
  size_t count() const { return count_; }
  DataType type() const { return type_; }

  void Store(const std::vector<float>& values) {
    for (size_t i = 0; i < count_; ++i) {
      char* at = host_.data() + i * DataTypeSize(type_);
      if (type_ == DataType::kFloat32) {
        std::memcpy(at, &values[i], 4);
      } else {
        const uint16_t h = type_ == DataType::kFloat16 ? FloatToHalf(values[i])
                                                       : FloatToBFloat16(values[i]);
        std::memcpy(at, &h, 2);
      }
    }
#ifdef MUSTER_HAVE_CUDA
    if (device_ != nullptr) cudaMemcpy(device_, host_.data(), bytes_, cudaMemcpyHostToDevice);
#endif
  }

  std::vector<float> Load() {
#ifdef MUSTER_HAVE_CUDA
    if (device_ != nullptr) cudaMemcpy(host_.data(), device_, bytes_, cudaMemcpyDeviceToHost);
#endif
    std::vector<float> out(count_);
    for (size_t i = 0; i < count_; ++i) {
      const char* at = host_.data() + i * DataTypeSize(type_);
      if (type_ == DataType::kFloat32) {
        std::memcpy(&out[i], at, 4);
      } else {
        uint16_t h;
        std::memcpy(&h, at, 2);
        out[i] = type_ == DataType::kFloat16 ? HalfToFloat(h) : BFloat16ToFloat(h);
      }
    }
    return out;
  }

 private:
  const DataType type_;
  const size_t count_;
  const size_t bytes_;
  std::vector<char> host_;
  void* device_ = nullptr;
};

// The live communicator, so the session thread can abort it.
struct Current {
  std::mutex mu;
  Communicator* comm = nullptr;
  absl::Time notice = absl::InfinitePast();
};

// Rank r's value at i: small integers, so that sums of up to 8 ranks are
// exact in float16 and bfloat16 too.
float Value(int rank, size_t i) { return static_cast<float>(rank + 1 + (i % 5)); }

void Fill(TestBuffer& buffer, int rank) {
  std::vector<float> values(buffer.count());
  for (size_t i = 0; i < values.size(); ++i) values[i] = Value(rank, i);
  buffer.Store(values);
}

// After an all-reduce (sum): the sum of every rank's values.
bool VerifySum(TestBuffer& buffer, int world) {
  const std::vector<float> data = buffer.Load();
  for (size_t i = 0; i < data.size(); ++i) {
    float expected = 0;
    for (int r = 0; r < world; ++r) expected += Value(r, i);
    if (data[i] != expected) return false;
  }
  return true;
}

// After a broadcast from `root`: root's values.
bool VerifyRoot(TestBuffer& buffer, int root) {
  const std::vector<float> data = buffer.Load();
  for (size_t i = 0; i < data.size(); ++i) {
    if (data[i] != Value(root, i)) return false;
  }
  return true;
}

// --check: all-reduce and broadcast of every size in every dtype; one
// report line each. Returns false on any mismatch.
bool CheckCollectives(Communicator& comm, const std::vector<size_t>& sizes, bool cuda) {
  bool all_ok = true;
  const int rank = comm.rank(), w = comm.size();
  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_dtypes), ',')) {
    const DataType type = ParseDataType(name).value_or(DataType::kFloat32);
    for (size_t bytes : sizes) {
      TestBuffer buffer(type, bytes / DataTypeSize(type), cuda);
      Fill(buffer, rank);
      absl::Status s = comm.AllReduce(buffer.data(), buffer.count(), type, ReduceOp::kSum,
                                      absl::Now() + absl::Seconds(60));
      bool ok = s.ok() && VerifySum(buffer, w);
      Fill(buffer, rank);
      if (ok) {
        s = comm.Broadcast(buffer.data(), buffer.count(), type, w - 1,
                           absl::Now() + absl::Seconds(60));
        ok = s.ok() && VerifyRoot(buffer, w - 1);
      }
      Report(absl::StrCat(ok ? "check_ok" : "check_failed", " dtype=", name, " bytes=", bytes,
                          " ", s.ToString()));
      all_ok &= ok;
    }
  }
  return all_ok;
}

// Timing: median over repeats of a barrier-separated all-reduce of float32
// values (AllReduceGradients, or ReduceScatterGradients: compressed across
// nodes with --gradient-compression); rank 0 prints a line per size. bytes, algbw and
// busbw count the float32 bytes, before any compression. False on a failed
// collective.
bool TimeAllReduces(Communicator* comm, const std::vector<size_t>& sizes, bool cuda) {
  const int rank = comm->rank(), w = comm->size();
  const std::string collective = absl::GetFlag(FLAGS_collective);
  const bool gather = collective == "allgather", scatter = collective == "reducescatter";
  for (size_t bytes : sizes) {
    TestBuffer data(DataType::kFloat32, std::max<size_t>(1, bytes / sizeof(float)), cuda);
    Fill(data, rank);
    const std::vector<size_t> segments = EvenSplit(data.count(), w);
    const int reps =
        static_cast<int>(std::clamp<size_t>((512u << 20) / std::max<size_t>(bytes, 1), 5, 50));
    std::vector<double> times;
    for (int i = 0; i < reps + 2; ++i) {
      if (!comm->Barrier(absl::Now() + absl::Seconds(60)).ok()) return false;
      const absl::Time t0 = absl::Now();
      const absl::Time deadline = absl::Now() + absl::Seconds(120);
      absl::Status s =
          gather    ? comm->AllGather(data.data(), segments, DataType::kFloat32, deadline)
          : scatter ? comm->ReduceScatterGradients(data.data(), segments, ReduceOp::kSum,
                                                   deadline)
                    : comm->AllReduceGradients(data.data(), data.count(), ReduceOp::kSum,
                                               deadline);
      if (!s.ok()) {
        return false;
      }
      if (i >= 2) times.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
    }
    // Average each repeat over the ranks, then take the median repeat.
    if (!AllReduceValues(comm, times.data(), times.size(), DataType::kFloat64, ReduceOp::kSum,
                         absl::Now() + absl::Seconds(60)).ok()) {
      return false;
    }
    for (double& t : times) t /= w;  // mean over ranks of each repeat
    const double median = Percentile(times, 50);
    const double algbw = bytes / median / 1e9;
    // An all-gather or a reduce-scatter moves each byte once to each other
    // rank, an all-reduce twice (reduce-scatter, then all-gather).
    const double bus = (gather || scatter ? 1.0 : 2.0) * (w - 1) / w;
    if (rank == 0) {
      std::cout << absl::StrFormat(
                       "%s backend=%s device=%s world=%d nodes=%d bytes=%d "
                       "compression=%s wire=%s median_s=%.6f algbw_GBps=%.3f busbw_GBps=%.3f",
                       collective, absl::GetFlag(FLAGS_backend),
                       absl::GetFlag(FLAGS_device), w,
                       absl::GetFlag(FLAGS_nodes), bytes,
                       absl::GetFlag(FLAGS_gradient_compression),
                       DataTypeName(comm->gradient_wire()), median, algbw,
                       algbw * bus)
                << std::endl;
    }
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
  co.clock = RealClock::Get();
  if (!absl::GetFlag(FLAGS_token_file).empty()) {
    std::ifstream in(absl::GetFlag(FLAGS_token_file));
    std::getline(in, co.token);
  }
  auto backend = ParseBackend(absl::GetFlag(FLAGS_backend));
  auto sizes = ParseSizes(absl::GetFlag(FLAGS_sizes));
  auto compression = ParseGradientCompression(absl::GetFlag(FLAGS_gradient_compression));
  if (!backend.ok() || !sizes.ok() || !compression.ok()) {
    std::cerr << "comm-worker: "
              << (!backend.ok() ? backend.status()
                  : !sizes.ok() ? sizes.status()
                                : compression.status())
              << "\n";
    return 2;
  }
  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_dtypes), ',')) {
    if (auto t = ParseDataType(name); !t.ok()) {
      std::cerr << "comm-worker: " << t.status() << "\n";
      return 2;
    }
  }
  const bool cuda = absl::GetFlag(FLAGS_device) == "cuda";
  if (!cuda && absl::GetFlag(FLAGS_device) != "cpu") {
    std::cerr << "comm-worker: --device must be cpu or cuda\n";
    return 2;
  }
  if (const std::string c = absl::GetFlag(FLAGS_collective);
      c != "allreduce" && c != "allgather" && c != "reducescatter") {
    std::cerr << "comm-worker: --collective must be allreduce, allgather or reducescatter, not '"
              << c << "'\n";
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
  options.clock = RealClock::Get();
  // Where the coordinator sees this worker: loopback, or its lab host's
  // address (allreduce --lab-rate).
  options.gloo.observed_host = client->observed_host();
  options.gradient_compression = *compression;
  options.check_buffers = std::getenv("MUSTER_CHECK_BUFFERS") != nullptr &&
                          std::string(std::getenv("MUSTER_CHECK_BUFFERS")) == "1";
  options.staging_chunk_bytes = StagingChunkBytes(std::getenv("MUSTER_STAGING_CHUNK_KB"));
  if (cuda) {
#ifdef MUSTER_HAVE_CUDA
    const int gpus = CudaDeviceCount();
    if (gpus == 0) {
      std::cerr << "comm-worker: --device cuda, but no GPU is visible\n";
      return 2;
    }
    options.cuda = true;
    options.cuda_device = absl::GetFlag(FLAGS_local_rank) % gpus;
#else
    std::cerr << "comm-worker: this build has no CUDA support\n";
    return 2;
#endif
  }
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
      TestBuffer data(DataType::kFloat32, 1 << 20, cuda);
      absl::Status s;
      while (s.ok()) {
        Fill(data, rank);
        s = (*comm)->AllReduce(data.data(), data.count(), DataType::kFloat32, ReduceOp::kSum,
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
      if (!CheckCollectives(**comm, *sizes, cuda)) exit_code = 6;
    } else if (!TimeAllReduces(comm->get(), *sizes, cuda)) {
      return 7;
    }
    {
      std::lock_guard<std::mutex> lock(current.mu);
      current.comm = nullptr;
    }
    comm->reset();
    client->Leave(Departure::kFinished, 0).IgnoreError();
    Report(absl::StrCat(rebuilt ? "rebuilt_done" : "done", " exit=", exit_code));
    return exit_code;
  }
}

}  // namespace muster
