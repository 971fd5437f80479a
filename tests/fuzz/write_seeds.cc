// Writes the seed corpora of the fuzz targets (checked in under
// tests/fuzz/corpus/): `fuzz_seeds DIR` creates DIR/coordinator_fuzz/,
// DIR/safetensors_fuzz/ and DIR/state_server_fuzz/. Coordinator seeds are
// call sequences in coordinator_input.h's format whose requests are valid
// serialized protos (a member joins, forms a world, uses the KV store,
// checkpoints, ...); safetensors seeds come from the project's own writer;
// state service seeds are pulls with and without a published state.
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "muster/v1/coordinator.pb.h"
#include "muster/v1/state.pb.h"
#include "tests/fuzz/coordinator_input.h"
#include "tests/fuzz/input_writer.h"
#include "trainer/checkpoint/safetensors.h"

namespace muster::fuzz {
namespace {

// A coordinator_fuzz input being written.
class Seed {
 public:
  struct Rules {
    uint32_t min_members = 1;
    uint32_t extra_members = 0;
    bool last_call = false;
  };
  explicit Seed(Rules rules) {
    w_.Uint(rules.min_members, 1, 3);
    w_.Uint(rules.extra_members, 0, 2);
    w_.Bool(rules.last_call);
    w_.Uint(/*multiple=*/1, 1, 2);
    w_.Uint(/*keep_last=*/2, 0, 3);
    w_.Uint(/*keep_best=*/1, 0, 2);  // "loss"
  }
  Seed() : Seed(Rules{}) {}

  template <typename Msg>
  Seed& Call(Op op, const Msg& m, Auth auth = Auth::kToken) {
    Head(op, auth);
    Slice(m);
    return *this;
  }
  Seed& Session(const std::vector<v1::SessionRequest>& messages, Auth auth = Auth::kToken) {
    Head(Op::kSessionOpen, auth);
    w_.Uint(messages.size(), 1, kMaxSessionMessages);
    for (const v1::SessionRequest& m : messages) Slice(m);
    return *this;
  }
  Seed& Tick(size_t step) {
    w_.Uint(static_cast<uint8_t>(Op::kTick), 0, kOpCount - 1);
    w_.Uint(step, 0, std::size(kTickSteps) - 1);
    return *this;
  }
  Seed& Restart() {
    w_.Uint(static_cast<uint8_t>(Op::kRestart), 0, kOpCount - 1);
    return *this;
  }
  std::string Finish() const { return w_.Finish(); }

 private:
  void Head(Op op, Auth auth) {
    w_.Uint(static_cast<uint8_t>(op), 0, kOpCount - 1);
    w_.Uint(static_cast<uint8_t>(auth), 0, 3);
    w_.Bool(/*parsed=*/true);
  }
  template <typename Msg>
  void Slice(const Msg& m) {
    const std::string bytes = m.SerializeAsString();
    w_.Uint(bytes.size(), 0, kMaxSliceBytes);
    w_.Bytes(bytes);
  }

  InputWriter w_;
};

void Ref(v1::MemberRef* ref, const std::string& id, uint64_t incarnation = 1) {
  ref->set_member_id(id);
  ref->set_incarnation(incarnation);
}

v1::JoinRequest Join(const std::string& id, const std::string& node, uint32_t local_rank = 0) {
  v1::JoinRequest r;
  Ref(r.mutable_member(), id);
  r.set_node(node);
  r.set_local_rank(local_rank);
  r.set_state_address("127.0.0.1:4000");
  return r;
}

v1::RendezvousRequest Rendezvous(const std::string& id, uint64_t after, int64_t step = 0) {
  v1::RendezvousRequest r;
  Ref(r.mutable_member(), id);
  r.set_after_generation(after);
  r.set_step(step);
  r.set_timeout_ms(1000);
  return r;
}

v1::SessionRequest Hello(const std::string& id) {
  v1::SessionRequest r;
  Ref(r.mutable_hello(), id);
  return r;
}

v1::SessionRequest Beat(int64_t step, uint64_t sequence) {
  v1::SessionRequest r;
  r.mutable_heartbeat()->set_step(step);
  r.mutable_heartbeat()->set_sequence(sequence);
  return r;
}

v1::SessionRequest NodeHello(const std::string& node) {
  v1::SessionRequest r;
  r.mutable_node_hello()->set_node(node);
  return r;
}

v1::SessionRequest Attach(const std::string& id) {
  v1::SessionRequest r;
  Ref(r.mutable_attach(), id);
  return r;
}

v1::KvSetRequest KvSet(uint64_t generation, const std::string& key, const std::string& value) {
  v1::KvSetRequest r;
  r.set_generation(generation);
  r.set_key(key);
  r.set_value(value);
  return r;
}

v1::KvGetRequest KvGet(uint64_t generation, const std::vector<std::string>& keys,
                       uint32_t wait_ms) {
  v1::KvGetRequest r;
  r.set_generation(generation);
  for (const std::string& k : keys) r.add_keys(k);
  r.set_wait_ms(wait_ms);
  return r;
}

v1::BarrierRequest Barrier(uint64_t generation, const std::string& id, const std::string& name) {
  v1::BarrierRequest r;
  r.set_generation(generation);
  Ref(r.mutable_member(), id);
  r.set_name(name);
  r.set_timeout_ms(1000);
  return r;
}

v1::BeginCheckpointRequest Begin(uint64_t generation, const std::string& id, int64_t step) {
  v1::BeginCheckpointRequest r;
  r.set_generation(generation);
  Ref(r.mutable_member(), id);
  r.set_step(step);
  return r;
}

v1::ReportShardRequest Report(uint64_t checkpoint, const std::string& id, double loss) {
  v1::ReportShardRequest r;
  r.set_checkpoint_id(checkpoint);
  Ref(r.mutable_member(), id);
  v1::ShardFile* f = r.add_files();
  f->set_path("/ckpt/step-10/" + id + ".safetensors");
  f->set_bytes(4096);
  f->set_checksum("0123456789abcdef");
  r.set_metric_name("loss");
  r.set_metric_value(loss);
  return r;
}

// Join m0 and form generation 1 with it.
Seed OneMemberWorld() {
  Seed s;
  s.Call(Op::kJoin, Join("m0", "n0")).Call(Op::kRendezvous, Rendezvous("m0", 0));
  return s;
}

std::map<std::string, std::string> CoordinatorSeeds() {
  std::map<std::string, std::string> seeds;
  seeds["join"] = Seed().Call(Op::kJoin, Join("m0", "n0")).Finish();
  seeds["join_wrong_token"] =
      Seed().Call(Op::kJoin, Join("m0", "n0"), Auth::kWrongToken).Finish();
  seeds["status_no_token"] =
      Seed().Call(Op::kGetStatus, v1::GetStatusRequest(), Auth::kNoToken).Finish();
  seeds["rendezvous"] = OneMemberWorld().Finish();

  v1::LeaveRequest leave;
  Ref(leave.mutable_member(), "m0");
  leave.set_step(7);
  leave.set_reason(v1::LeaveRequest::FINISHED);
  seeds["leave_finished"] = OneMemberWorld().Call(Op::kLeave, leave).Finish();
  leave.set_reason(v1::LeaveRequest::GRACEFUL);
  seeds["leave_graceful"] = OneMemberWorld().Call(Op::kLeave, leave).Finish();
  leave.set_reason(v1::LeaveRequest::STOPPED);
  seeds["leave_stopped"] = OneMemberWorld().Call(Op::kLeave, leave).Finish();

  v1::DrainRequest drain;
  drain.set_node("n0");
  seeds["drain"] = OneMemberWorld().Call(Op::kDrain, drain).Finish();

  v1::KvAddRequest add;
  add.set_generation(1);
  add.set_key("counter");
  add.set_delta(5);
  v1::KvCompareAndSetRequest cas;
  cas.set_generation(1);
  cas.set_key("k0");
  cas.set_expected("v");
  cas.set_desired("w");
  seeds["kv"] = OneMemberWorld()
                    .Call(Op::kKvGet, KvGet(1, {"k0", "k1"}, 5000))
                    .Call(Op::kKvSet, KvSet(1, "k0", "v"))
                    .Call(Op::kKvSet, KvSet(1, "k1", "nccl-unique-id"))
                    .Call(Op::kKvGet, KvGet(1, {"k0"}, 0))
                    .Call(Op::kKvAdd, add)
                    .Call(Op::kKvCompareAndSet, cas)
                    .Finish();
  seeds["barrier"] = OneMemberWorld().Call(Op::kBarrier, Barrier(1, "m0", "b0")).Finish();

  v1::ListCheckpointsRequest list;
  list.set_include_all(true);
  seeds["checkpoint"] = OneMemberWorld()
                            .Call(Op::kBeginCheckpoint, Begin(1, "m0", 10))
                            .Call(Op::kReportShard, Report(1, "m0", 0.5))
                            .Call(Op::kListCheckpoints, list)
                            .Call(Op::kGetStatus, v1::GetStatusRequest())
                            .Finish();
  v1::AbortCheckpointRequest abort;
  abort.set_checkpoint_id(1);
  Ref(abort.mutable_member(), "m0");
  abort.set_reason("disk full");
  seeds["abort_checkpoint"] = OneMemberWorld()
                                  .Call(Op::kBeginCheckpoint, Begin(1, "m0", 10))
                                  .Call(Op::kAbortCheckpoint, abort)
                                  .Finish();
  seeds["session"] = Seed()
                         .Call(Op::kJoin, Join("m0", "n0"))
                         .Session({Hello("m0"), Beat(1, 1), Beat(2, 2)})
                         .Call(Op::kRendezvous, Rendezvous("m0", 0))
                         .Tick(3)
                         .Finish();

  // A node session (muster-agent's) that stays open until its node closes
  // it: the harness once waited for the server to end it.
  seeds["node_session"] = Seed()
                              .Call(Op::kJoin, Join("m0", "n0"))
                              .Session({NodeHello("n0"), Attach("m0"), Beat(1, 1)})
                              .Call(Op::kRendezvous, Rendezvous("m0", 0))
                              .Finish();

  // Two members on two nodes, a last call, sessions, a full checkpoint, a
  // heartbeat timeout, then a coordinator restart and a reattach.
  seeds["two_members"] = Seed(Seed::Rules{2, 1, true})
                             .Call(Op::kJoin, Join("m0", "n0"))
                             .Call(Op::kJoin, Join("m1", "n1"))
                             .Session({Hello("m0"), Beat(0, 1)})
                             .Session({Hello("m1"), Beat(0, 1)})
                             .Call(Op::kRendezvous, Rendezvous("m0", 0))
                             .Call(Op::kRendezvous, Rendezvous("m1", 0, 3))
                             .Tick(2)
                             .Call(Op::kKvSet, KvSet(1, "k0", "v"))
                             .Call(Op::kBarrier, Barrier(1, "m0", "b0"))
                             .Call(Op::kBarrier, Barrier(1, "m1", "b0"))
                             .Call(Op::kBeginCheckpoint, Begin(1, "m0", 10))
                             .Call(Op::kBeginCheckpoint, Begin(1, "m1", 10))
                             .Call(Op::kReportShard, Report(1, "m0", 0.5))
                             .Call(Op::kReportShard, Report(1, "m1", 0.5))
                             .Call(Op::kListCheckpoints, list)
                             .Tick(4)
                             .Restart()
                             .Call(Op::kJoin, Join("m0", "n0"))
                             .Call(Op::kGetStatus, v1::GetStatusRequest())
                             .Finish();
  // Regression: adopting after_generation 2^64-1 made the next world
  // generation 0 (fixed in coordinator_regroup.cc).
  seeds["regression_generation_wrap"] = Seed()
                                            .Call(Op::kJoin, Join("m0", "n0"))
                                            .Call(Op::kRendezvous, Rendezvous("m0", ~uint64_t{0}))
                                            .Call(Op::kRendezvous, Rendezvous("m0", 0))
                                            .Finish();
  seeds["restart"] = OneMemberWorld()
                         .Call(Op::kBeginCheckpoint, Begin(1, "m0", 10))
                         .Call(Op::kReportShard, Report(1, "m0", 0.25))
                         .Restart()
                         .Call(Op::kJoin, Join("m0", "n0"))
                         .Session({Hello("m0"), Beat(10, 1)})
                         .Call(Op::kRendezvous, Rendezvous("m0", 1, 10))
                         .Call(Op::kListCheckpoints, list)
                         .Finish();
  return seeds;
}

// A safetensors file from the project's writer: `tensors` with
// deterministic data.
std::string Safetensors(const std::vector<TensorRef>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  std::string file = SafetensorsPrefix(tensors, metadata).value();
  for (const TensorRef& t : tensors) {
    size_t n = SafetensorsDtypeSize(t.dtype);
    for (int64_t d : t.shape) n *= static_cast<size_t>(d);
    for (size_t i = 0; i < n; ++i) file.push_back(static_cast<char>(i * 7 + t.name.size()));
  }
  return file;
}

std::map<std::string, std::string> SafetensorsSeeds() {
  std::map<std::string, std::string> seeds;
  seeds["model.safetensors"] =
      Safetensors({{"fc.weight", "F32", {2, 3}, nullptr}, {"fc.bias", "F32", {3}, nullptr}},
                  {{"step", "10"}, {"format", "pt"}});
  seeds["dtypes.safetensors"] = Safetensors({{"a", "I64", {2}, nullptr},
                                             {"b", "BF16", {2, 2}, nullptr},
                                             {"c", "BOOL", {3}, nullptr},
                                             {"d", "U8", {0}, nullptr},
                                             {"e", "F64", {}, nullptr},
                                             {"f", "I8", {1, 1, 2}, nullptr}},
                                            {});
  seeds["metadata_only.safetensors"] = Safetensors({}, {{"generation", "3"}});
  // Regression: 2^62 x 4 F32 elements wrapped to 0 bytes in 64 bits and were
  // accepted (fixed in safetensors.cc). Written by hand: the writer cannot.
  std::string header =
      R"({"w":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i) file[i] = static_cast<char>(header.size() >> (8 * i));
  seeds["regression_shape_overflow.safetensors"] = file + header;
  return seeds;
}

// A state_server_fuzz input: calls whose PullStateRequest is a serialized
// proto (format in state_server_fuzz.cc's Call()).
class StateSeed {
 public:
  StateSeed& Pull(int64_t at_step, uint32_t timeout_ms, uint8_t auth, bool publish,
                  const std::string& state, bool big = false) {
    v1::PullStateRequest req;
    req.set_at_step(at_step);
    req.set_timeout_ms(timeout_ms);
    const std::string bytes = req.SerializeAsString();
    w_.Uint(auth, 0, 3);
    w_.Bool(/*parsed=*/true);
    w_.Uint(bytes.size(), 0, 64);
    w_.Bytes(bytes);
    w_.Bool(publish);
    w_.Uint(state.size(), 0, 256);
    w_.Bytes(state);
    w_.Uint(big ? 0 : 1, 0, 15);
    return *this;
  }
  std::string Finish() const { return w_.Finish(); }

 private:
  InputWriter w_;
};

std::map<std::string, std::string> StateSeeds() {
  std::map<std::string, std::string> seeds;
  seeds["pull"] = StateSeed().Pull(1, 1000, 0, true, "model bytes").Finish();
  seeds["pull_two_chunks"] = StateSeed().Pull(0, 1000, 0, true, "x", /*big=*/true).Finish();
  seeds["pull_nothing_published"] = StateSeed().Pull(3, 5, 0, false, "").Finish();
  seeds["refused"] = StateSeed()
                         .Pull(0, 1000, /*auth=*/2, true, "a")
                         .Pull(0, 1000, /*auth=*/3, true, "b")
                         .Pull(-1, 1000, /*auth=*/0, true, "c")
                         .Finish();
  return seeds;
}

bool WriteAll(const std::string& dir, const std::map<std::string, std::string>& files) {
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    std::fprintf(stderr, "cannot create %s: %s\n", dir.c_str(), std::strerror(errno));
    return false;
  }
  for (const auto& [name, bytes] : files) {
    std::ofstream out(dir + "/" + name, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) {
      std::fprintf(stderr, "cannot write %s/%s\n", dir.c_str(), name.c_str());
      return false;
    }
  }
  return true;
}

}  // namespace
}  // namespace muster::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  const std::string root = argv[1];
  using namespace muster::fuzz;
  const bool ok = WriteAll(root, {}) && WriteAll(root + "/coordinator_fuzz", CoordinatorSeeds()) &&
                  WriteAll(root + "/safetensors_fuzz", SafetensorsSeeds()) &&
                  WriteAll(root + "/state_server_fuzz", StateSeeds());
  return ok ? 0 : 1;
}
