// Options, the launcher's environment and the placement: everything Start
// resolves before it joins (launch_options.h, and muster/options.h's
// ResolvePlacement and Options::Validate).
#include "trainer/lib/launch_options.h"

#include <dlfcn.h>
#include <sched.h>
#include <unistd.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <string_view>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/host_name.h"
#include "common/launch_env.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/token.h"
#include "muster/muster.h"
#include "rpc/agent_protocol.h"
#include "trainer/ddp/device_comm.h"

namespace muster {
namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

// The collective deadline of Options::collective_timeout_s: the world
// changes' (a step's and the long waits) and the membership's build timeout
// (its long wait) come from the same one.
CollectiveDeadlineOptions DeadlineOptionsFrom(const Options& o) {
  return CollectiveDeadlineOptions{absl::Seconds(o.collective_timeout_s)};
}

// The resolved path of the library that defines sgemm_, empty when none
// does dynamically (PyPI's LibTorch links MKL into itself).
std::string BlasLibrary() {
  void* sgemm = ::dlsym(RTLD_DEFAULT, "sgemm_");
  Dl_info info{};
  if (sgemm == nullptr || ::dladdr(sgemm, &info) == 0 || info.dli_fname == nullptr) return "";
  char* real = ::realpath(info.dli_fname, nullptr);
  std::string path = real != nullptr ? real : info.dli_fname;
  std::free(real);
  return path;
}

}  // namespace

absl::StatusOr<ClientOptions> ClientOptionsFrom(const Options& o, Clock* clock) {
  ClientOptions co;
  co.clock = clock;
  co.target = o.coordinator.empty() ? Env("MUSTER_COORDINATOR") : o.coordinator;
  if (co.target.empty()) {
    return absl::InvalidArgumentError(
        "no coordinator: set Options::coordinator or $MUSTER_COORDINATOR");
  }
  if (!o.token.empty()) {
    co.token = o.token;
  } else {
    MUSTER_ASSIGN_OR_RETURN(co.token, ResolveToken(o.token_file));
  }
  co.tls.ca = o.tls_ca;
  MUSTER_ASSIGN_OR_RETURN(Placement place, ResolvePlacement(o));
  co.member_id = place.member_id;
  co.node = place.node;
  co.local_rank = static_cast<uint32_t>(place.local_rank);
  co.spare = place.spare;
  co.incarnation = o.incarnation;
  co.session_via = Env(kAgentSessionEnv);
  return co;
}

CommOptions CommOptionsFrom(const Options& o, int local_rank, Clock* clock) {
  CommOptions comm;
  comm.clock = clock;
  comm.backend = o.backend;
  comm.job = !o.job.empty()                 ? o.job
             : !Env("MUSTER_JOB").empty()   ? Env("MUSTER_JOB")
             : !Env("SLURM_JOB_ID").empty() ? Env("SLURM_JOB_ID")
                                            : "muster";
  comm.gloo.hostname = o.address;
  comm.gloo.iface = !o.interface.empty() ? o.interface : Env("MUSTER_SOCKET_IFNAME");
  if (!o.address.empty()) comm.gloo.iface.clear();  // an explicit address wins
  comm.gradient_compression = o.gradient_compression;
  comm.cuda = o.cuda;
  if (o.cuda) {
    comm.cuda_device = std::max(0, CudaDeviceForLocalRank(local_rank));
    comm.cuda_stream = CurrentCudaStream(comm.cuda_device);
  }
  comm.check_buffers = Env("MUSTER_CHECK_BUFFERS") == "1";
  comm.staging_chunk_bytes = StagingChunkBytes(std::getenv("MUSTER_STAGING_CHUNK_KB"));
  return comm;
}

int UsableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

int IntraOpThreads(int requested, int usable_cpus, int node_trainers, bool omp_env_set) {
  if (requested != 0) return requested;
  if (omp_env_set) return -1;
  return std::max(1, usable_cpus / std::max(1, node_trainers));
}

WorldChangesOptions WorldChangesOptionsFrom(const Options& o, bool several_passes, Clock* clock) {
  WorldChangesOptions wo;
  wo.salvage = o.salvage;
  wo.several_passes = several_passes;
  wo.scale_lr = o.elastic_lr == ElasticLr::kScale;
  wo.batch_per_rank = o.batch_per_rank;
  wo.deadline = DeadlineOptionsFrom(o);
  wo.clock = clock;
  wo.stop_after_step = o.stop_after_step;
  return wo;
}

ElasticWorldOptions ElasticWorldOptionsFrom(const Options& o, ClientOptions client,
                                            Clock* clock) {
  ElasticWorldOptions wo;
  wo.comm = CommOptionsFrom(o, static_cast<int>(client.local_rank), clock);
  wo.client = std::move(client);
  wo.build_timeout = CollectiveDeadline(DeadlineOptionsFrom(o)).Long();
  wo.join_timeout = absl::Seconds(o.join_timeout_s);
  wo.rendezvous_timeout = absl::Seconds(o.rendezvous_timeout_s);
  wo.clock = clock;
  wo.settings = JobSettings(o);
  return wo;
}

std::string JobSettings(const Options& o) {
  const auto number = [](double v) { return absl::StrFormat("%.17g", v); };
  std::string out;
  const auto add = [&out](const char* name, const std::string& value) {
    absl::StrAppend(&out, name, "=", value, "\n");
  };
  add("backend", std::to_string(static_cast<int>(o.backend)));
  add("cuda", std::to_string(o.cuda));
  add("bucket_mb", number(o.bucket_mb));
  add("gradient_compression", std::to_string(static_cast<int>(o.gradient_compression)));
  add("broadcast_buffers", std::to_string(o.broadcast_buffers));
  add("check_state_every", std::to_string(o.check_state_every));
  add("salvage", std::to_string(o.salvage));
  add("shard_optimizer_state", std::to_string(o.shard_optimizer_state));
  add("optimizer_state_copies", std::to_string(o.optimizer_state_copies));
  add("reduce_scatter_gradients", std::to_string(o.reduce_scatter_gradients));
  add("clip_grad_norm", number(o.clip_grad_norm));
  add("dataset_size", std::to_string(o.dataset_size));
  add("batch_per_rank", std::to_string(o.batch_per_rank));
  add("seed", std::to_string(o.seed));
  add("steps", std::to_string(o.steps));
  add("epochs", std::to_string(o.epochs));
  add("elastic_lr", std::to_string(static_cast<int>(o.elastic_lr)));
  return out;
}

ReplicaOptions ReplicaOptionsFrom(const Options& o, Clock* clock, GradScaler* scaler) {
  ReplicaOptions r;
  r.bucket_bytes = static_cast<size_t>(o.bucket_mb * (1 << 20));
  r.overlap = o.overlap;
  r.broadcast_buffers = o.broadcast_buffers;
  r.clock = clock;
  r.shard_copies = o.shard_optimizer_state ? o.optimizer_state_copies : 0;
  r.reduce_scatter = o.reduce_scatter_gradients;
  r.clip_norm = o.clip_grad_norm;
  if (scaler != nullptr && scaler->enabled()) {
    r.inverse_loss_scale = [scaler] { return scaler->inverse_scale(); };
    r.unscaled = [scaler](bool found) { scaler->RecordUnscaledPass(found); };
  }
  return r;
}

CatalogCheckpointerOptions CheckpointOptionsFrom(const Options& o, Clock* clock) {
  CatalogCheckpointerOptions co;
  co.dir = o.checkpoint_dir;
  co.every_steps = o.checkpoint_every;
  co.interval_seconds = o.checkpoint_interval_s;
  co.model_name = o.model_name;
  co.optimizer_name = o.optimizer_name;
  co.fs = o.checkpoint_fs;
  co.clock = clock;
  return co;
}

ProgressOptions ProgressOptionsFrom(const Options& o, Clock* clock) {
  ProgressOptions po;
  po.clock = clock;
  if (!o.quiet) po.output = o.output;
  po.log_every = o.log_every;
  po.log_dir = o.log_dir;
  po.model_name = o.model_name;
  po.batch_per_rank = o.batch_per_rank;
  return po;
}

bool IsReferenceBlas(std::string_view library) {
  const size_t slash = library.rfind('/');
  const std::string_view file =
      slash == std::string_view::npos ? library : library.substr(slash + 1);
  if (file.rfind("libblas.", 0) != 0) return false;  // C++17 for Debian's LibTorch
  std::string dir(library.substr(0, slash == std::string_view::npos ? 0 : slash));
  std::transform(dir.begin(), dir.end(), dir.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  for (std::string_view optimized : {"openblas", "blis", "atlas", "mkl"}) {
    if (dir.find(optimized) != std::string::npos) return false;
  }
  return true;
}

void ShareIntraOpThreads(const Options& o, int node_trainers) {
  static std::once_flag blas_checked;
  std::call_once(blas_checked, [] {
    const std::string blas = BlasLibrary();
    if (!IsReferenceBlas(blas)) return;
    MUSTER_LOG(WARNING) << "LibTorch multiplies matrices with the reference BLAS (" << blas
                        << "), several times slower than an optimized one; on Debian, install "
                           "libopenblas0-openmp";
  });
  const int cpus = UsableCpus();
  const int threads = IntraOpThreads(o.intra_op_threads, cpus, node_trainers,
                                     std::getenv("OMP_NUM_THREADS") != nullptr);
  if (threads < 1 || threads == at::get_num_threads()) return;
  at::set_num_threads(threads);
  MUSTER_LOG(INFO) << "LibTorch intra-op threads: " << threads
                   << (o.intra_op_threads > 0 ? std::string(" (Options::intra_op_threads)")
                                              : absl::StrCat(" (", cpus, " CPUs shared by ",
                                                             node_trainers,
                                                             " trainers on this node)"));
}

absl::StatusOr<std::unique_ptr<StateServer>> StartStateService(const Options& o,
                                                               ClientOptions* client,
                                                               Clock* clock) {
  if (o.state_listen.empty()) return nullptr;
  const std::string listen = StateListenAddress(o.state_listen, client->token);
  if (listen != o.state_listen) {
    MUSTER_LOG(WARNING) << "no job token: the state service listens on " << listen
                        << " only (give a token to serve the weights to other hosts)";
  }
  MUSTER_ASSIGN_OR_RETURN(
      std::unique_ptr<StateServer> server,
      StateServer::Start({listen, client->token, {o.state_tls_cert, o.state_tls_key, ""},
                          client->member_id, clock}));
  // Without an address of its own, this member is reached where the
  // coordinator sees it (":port": the coordinator fills in the host).
  const std::string host = listen.rfind("127.0.0.1:", 0) == 0 ? "127.0.0.1" : o.address;
  client->state_address = absl::StrCat(host, ":", server->port());
  return server;
}

absl::StatusOr<Placement> ResolvePlacement(const Options& o) {
  MUSTER_ASSIGN_OR_RETURN(LaunchIdentity id,
                          ResolveLaunchIdentity({o.node_id, o.local_rank},
                                                [](const char* n) { return std::getenv(n); },
                                                HostName()));
  Placement p;
  p.member_id = id.member_id();
  p.node = id.node;
  p.local_rank = id.local_rank;
  p.local_world_size = id.local_world_size;
  p.spare = id.spare;
  p.source = id.source;
  return p;
}

absl::Status Options::Validate() const {
  auto bad = [](const std::string& what) { return absl::InvalidArgumentError("Options::" + what); };
  if (dataset_size <= 0) return bad("dataset_size must be positive");
  if (batch_per_rank <= 0) return bad("batch_per_rank must be positive");
  if (steps < 0) return bad("steps must not be negative");
  if (steps == 0 && epochs <= 0) return bad("epochs must be positive when steps is 0");
  if (!(bucket_mb > 0)) return bad("bucket_mb must be positive");
  if (!address.empty() && !interface.empty()) {
    return bad("address and interface both name where other nodes reach this one: set one");
  }
  switch (gradient_compression) {
    case GradientCompression::kNone:
    case GradientCompression::kBf16:
    case GradientCompression::kFp16:
      break;
    default:
      return bad(absl::StrCat("gradient_compression must be kNone, kBf16 or kFp16, not ",
                              static_cast<int>(gradient_compression)));
  }
  if (!(join_timeout_s > 0)) return bad("join_timeout_s must be positive");
  if (!(rendezvous_timeout_s > 0)) return bad("rendezvous_timeout_s must be positive");
  if (!(collective_timeout_s >= 0)) {
    return bad("collective_timeout_s must be 0 (follow the job) or positive");
  }
  if (checkpoint_every < 0) return bad("checkpoint_every must not be negative");
  if (check_state_every < 0) {
    return bad("check_state_every must be 0 (before checkpoints only) or positive");
  }
  if (checkpoint_interval_s < 0) return bad("checkpoint_interval_s must not be negative");
  if (log_every < 1) return bad("log_every must be at least 1");
  if (local_rank < -1) return bad("local_rank must be -1 (from the launcher) or a rank");
  if (stop_after_step < 0) return bad("stop_after_step must not be negative");
  if (intra_op_threads < -1) return bad("intra_op_threads must be -1 (untouched), 0 (shared) or N");
  if (optimizer_state_copies != 1 && optimizer_state_copies != 2) {
    return bad(absl::StrCat("optimizer_state_copies must be 1 or 2, not ", optimizer_state_copies));
  }
  if (!(clip_grad_norm >= 0) || !std::isfinite(clip_grad_norm)) {
    return bad(absl::StrCat("clip_grad_norm must be 0 (no clipping) or a positive finite norm, "
                            "not ", clip_grad_norm));
  }
  if (reduce_scatter_gradients && !shard_optimizer_state) {
    return bad("reduce_scatter_gradients needs shard_optimizer_state (it is off)");
  }
  return absl::OkStatus();
}

absl::StatusOr<torch::Device> TrainingDevice(const Options& options) {
  if (!options.cuda) return torch::Device(torch::kCPU);
  MUSTER_ASSIGN_OR_RETURN(const Placement place, ResolvePlacement(options));
  const int device = CudaDeviceForLocalRank(place.local_rank);
  if (device < 0) {
    return absl::FailedPreconditionError("cuda was asked for, but this process sees no GPU");
  }
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(device));
}

}  // namespace muster
