// libFuzzer target over every rpc of the coordinator but Shutdown: each input
// is a fresh Coordinator and a sequence of calls (format in
// coordinator_input.h), each with the job token, a wrong one or none, whose
// requests are parsed from the input's bytes or drawn field by field. The
// invariants are checked by CoordinatorHarness (coordinator_harness.h).
#include <fuzzer/FuzzedDataProvider.h>
#include <google/protobuf/stubs/logging.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "tests/fuzz/coordinator_draw.h"
#include "tests/fuzz/coordinator_harness.h"
#include "tests/fuzz/coordinator_input.h"

namespace muster::fuzz {
namespace {

using Stub = CoordinatorHarness::Stub;

// Fills `req` from a slice of the input; false when it does not parse.
template <typename Req>
bool Parse(FuzzedDataProvider* in, Req* req) {
  const uint16_t n = in->ConsumeIntegralInRange<uint16_t>(0, kMaxSliceBytes);
  return req->ParseFromString(in->ConsumeBytesAsString(n));
}

// ---------------------------------------------------------------- answers

void CheckWorld(const v1::RendezvousRequest& req, const v1::RendezvousResponse& resp) {
  const v1::World& w = resp.world();
  auto fail = [&](const char* what) {
    Fail(absl::StrCat("Rendezvous answered a bad world (", what, ")\nrequest: ",
                      req.ShortDebugString(), "\nanswer: ", resp.ShortDebugString()));
  };
  if (w.generation() <= req.after_generation()) fail("generation not after after_generation");
  if (resp.has_delta()) {
    // The member derives its place from the world it holds (a delta of the
    // base world); the answer itself holds only the summary.
    const v1::WorldDelta& d = resp.delta();
    if (!req.takes_delta()) fail("a delta to a caller that does not take one");
    if (d.base_generation() >= w.generation()) fail("delta's base is not older");
    if (resp.node_members_size() != 0 || resp.has_self()) fail("a delta with an assignment");
    for (int i = 1; i < d.removed_ranks_size(); ++i) {
      if (d.removed_ranks(i) <= d.removed_ranks(i - 1)) fail("removed ranks not ascending");
    }
    for (int i = 1; i < d.removed_nodes_size(); ++i) {
      if (d.removed_nodes(i) <= d.removed_nodes(i - 1)) fail("removed nodes not ascending");
    }
    if (d.appended_count() > w.world_size()) fail("more appended than members");
    return;
  }
  if (resp.rank() >= w.world_size()) fail("rank out of range");
  const v1::Assignment& self = resp.self();
  if (self.rank() != resp.rank()) fail("self is not at the answered rank");
  if (self.member().member_id() != req.member().member_id() ||
      self.member().incarnation() != req.member().incarnation()) {
    fail("the caller is not at its rank");
  }
  if (w.state_source_rank() >= w.world_size()) fail("state_source_rank out of range");
  if (w.state_source().rank() != w.state_source_rank()) fail("state_source's rank");
  if (w.node_count() == 0 || w.node_count() > w.world_size()) fail("node_count");
  if (w.node_sizes_size() == 0) fail("no node_sizes");
  if (self.local_world_size() != static_cast<uint32_t>(resp.node_members_size())) {
    fail("node_members is not the caller's node");
  }
  for (int i = 0; i < resp.node_members_size(); ++i) {
    const v1::Assignment& a = resp.node_members(i);
    if (a.local_rank() != static_cast<uint32_t>(i)) fail("node_members not in local rank order");
    if (a.node() != self.node() || a.node_rank() != self.node_rank()) {
      fail("node_members on another node");
    }
    if (a.rank() != self.rank() - self.local_rank() + a.local_rank()) {
      fail("ranks of a node are not contiguous");
    }
    if (a.node_rank() >= w.node_count()) fail("node_rank >= node_count");
  }
}

void CheckWorldPage(const v1::GetWorldRequest& req, const v1::GetWorldResponse& resp) {
  auto fail = [&](const char* what) {
    Fail(absl::StrCat("GetWorld answered a bad page (", what, ")\nrequest: ",
                      req.ShortDebugString(), "\nanswer: ", resp.ShortDebugString()));
  };
  const uint32_t limit = req.max_members() == 0 ? 1'000 : std::min(req.max_members(), 10'000u);
  if (static_cast<uint32_t>(resp.members_size()) > limit) fail("more members than asked");
  if (resp.next_rank() != req.start_rank() + static_cast<uint32_t>(resp.members_size())) {
    fail("next_rank");
  }
  if (resp.next_rank() > resp.world().world_size()) fail("next_rank beyond the world");
  for (int i = 0; i < resp.members_size(); ++i) {
    if (resp.members(i).rank() != req.start_rank() + static_cast<uint32_t>(i)) {
      fail("members not in rank order");
    }
  }
}

void CheckList(const v1::ListCheckpointsRequest& req, const v1::ListCheckpointsResponse& resp) {
  for (int i = 0; i < resp.checkpoints_size(); ++i) {
    const v1::Checkpoint& c = resp.checkpoints(i);
    if (!req.include_all() && c.state() != v1::Checkpoint::COMMITTED) {
      Fail("ListCheckpoints(include_all=false) listed a checkpoint that is not committed: " +
           c.ShortDebugString());
    }
    if (i > 0 && c.step() > resp.checkpoints(i - 1).step()) {
      Fail("ListCheckpoints is not newest first: " + resp.ShortDebugString());
    }
  }
}

// ---------------------------------------------------------------- ops

class Runner {
 public:
  Runner(FuzzedDataProvider* in, CoordinatorHarness* h, const CoordinatorOptions& options)
      : in_(in), h_(h), options_(options) {}

  void Step() {
    const Op op = static_cast<Op>(in_->ConsumeIntegralInRange<uint8_t>(0, kOpCount - 1));
    switch (op) {
      case Op::kTick:
        h_->Tick(absl::Milliseconds(
            kTickSteps[in_->ConsumeIntegralInRange<size_t>(0, std::size(kTickSteps) - 1)]));
        return;
      case Op::kRestart:
        h_->Restart();
        return;
      case Op::kSessionHeartbeat: {
        const uint8_t index = in_->ConsumeIntegralInRange<uint8_t>(0, kMaxSessions - 1);
        Draw d(in_, h_->coordinator());
        h_->SessionHeartbeat(index, d.Step(), in_->ConsumeIntegral<uint64_t>());
        return;
      }
      case Op::kSessionClose:
        h_->CloseSession(in_->ConsumeIntegralInRange<uint8_t>(0, kMaxSessions - 1));
        return;
      default:
        break;
    }
    const Auth auth = static_cast<Auth>(in_->ConsumeIntegralInRange<uint8_t>(0, 3));
    const bool parsed = in_->ConsumeBool();
    Draw d(in_, h_->coordinator());
    switch (op) {
      case Op::kJoin: {
        v1::JoinRequest r;
        if (parsed) {
          if (!Parse(in_, &r)) return;
        } else {
          JoinFields(&d, &r);
        }
        const CoordinatorOptions o = options_;
        h_->Unary<v1::JoinRequest, v1::JoinResponse>(
            "Join", &Stub::async::Join, r, auth, /*blocks=*/false,
            [o](const v1::JoinRequest& req, const v1::JoinResponse& resp) {
              // The interval grows with the open streams, up to a third of
              // the timeout (HeartbeatIntervalFor).
              const int64_t interval = resp.heartbeat_interval_ms();
              if (interval < absl::ToInt64Milliseconds(o.heartbeat_interval) ||
                  interval > absl::ToInt64Milliseconds(
                                 std::max(o.heartbeat_interval, o.heartbeat_timeout / 3)) ||
                  resp.heartbeat_timeout_ms() != absl::ToInt64Milliseconds(o.heartbeat_timeout)) {
                Fail("Join answered other heartbeat settings than configured: " +
                     resp.ShortDebugString() + " for " + req.ShortDebugString());
              }
            });
        return;
      }
      case Op::kRendezvous: {
        v1::RendezvousRequest r;
        if (parsed) {
          if (!Parse(in_, &r)) return;
        } else {
          d.Member(r.mutable_member());
          r.set_after_generation(d.Generation());
          r.set_step(d.Step());
          r.set_timeout_ms(d.Millis());
        }
        h_->Unary<v1::RendezvousRequest, v1::RendezvousResponse>(
            "Rendezvous", &Stub::async::Rendezvous, r, auth, /*blocks=*/true, CheckWorld);
        return;
      }
      case Op::kLeave: {
        v1::LeaveRequest r;
        if (parsed) {
          if (!Parse(in_, &r)) return;
        } else {
          d.Member(r.mutable_member());
          r.set_reason(static_cast<v1::LeaveRequest::Reason>(d.Choice(4)));
          r.set_step(d.Step());
        }
        h_->Unary<v1::LeaveRequest, v1::LeaveResponse>("Leave", &Stub::async::Leave, r, auth,
                                                       /*blocks=*/false);
        return;
      }
      case Op::kDrain: {
        v1::DrainRequest r;
        if (parsed) {
          if (!Parse(in_, &r)) return;
        } else {
          r.set_node(d.Node());
        }
        h_->Unary<v1::DrainRequest, v1::DrainResponse>("Drain", &Stub::async::Drain, r, auth,
                                                       /*blocks=*/false);
        return;
      }
      default:
        KvOrCatalog(op, auth, parsed, &d);
    }
  }

 private:
  static void JoinFields(Draw* d, v1::JoinRequest* r) {
    d->Member(r->mutable_member());
    r->set_node(d->Node());
    const uint8_t local = d->Choice(4);
    r->set_local_rank(local < 3 ? local : 1'000'000);
    switch (d->Choice(3)) {
      case 0: break;
      case 1: r->set_state_address("127.0.0.1:4000"); break;
      default: r->set_state_address(d->Text(300));
    }
    r->set_step(d->Step());
  }

  void KvOrCatalog(Op op, Auth auth, bool parsed, Draw* d) {
    switch (op) {
      case Op::kKvSet: {
        v1::KvSetRequest r;
        if (parsed) {
          if (!Parse(in_, &r)) return;
        } else {
          r.set_generation(d->Generation());
          r.set_key(d->Key());
          r.set_value(d->Value());
        }
        h_->Unary<v1::KvSetRequest, v1::KvSetResponse>("KvSet", &Stub::async::KvSet, r, auth,
                                                       /*blocks=*/false);
        return;
      }
      case Op::kKvGet: {
        v1::KvGetRequest r;
        if (parsed) {
          if (!Parse(in_, &r)) return;
        } else {
          r.set_generation(d->Generation());
          const uint8_t n = d->Choice(10);
          for (uint8_t i = 0; i < n; ++i) r.add_keys(d->Key());
          r.set_wait_ms(d->Millis());
        }
        h_->Unary<v1::KvGetRequest, v1::KvGetResponse>(
            "KvGet", &Stub::async::KvGet, r, auth, /*blocks=*/r.wait_ms() > 0,
            [](const v1::KvGetRequest& req, const v1::KvGetResponse& resp) {
              if (resp.values_size() != req.keys_size()) {
                Fail("KvGet answered " + std::to_string(resp.values_size()) + " values for " +
                     std::to_string(req.keys_size()) + " keys");
              }
            });
        return;
      }
      case Op::kKvAdd: {
        v1::KvAddRequest r;
        if (parsed) {
          if (!Parse(in_, &r)) return;
        } else {
          r.set_generation(d->Generation());
          r.set_key(d->Key());
          const uint8_t c = d->Choice(3);
          r.set_delta(c == 0 ? 1 : c == 1 ? -1 : in_->ConsumeIntegral<int64_t>());
        }
        h_->Unary<v1::KvAddRequest, v1::KvAddResponse>("KvAdd", &Stub::async::KvAdd, r, auth,
                                                       /*blocks=*/false);
        return;
      }
      case Op::kKvCompareAndSet: {
        v1::KvCompareAndSetRequest r;
        if (parsed) {
          if (!Parse(in_, &r)) return;
        } else {
          r.set_generation(d->Generation());
          r.set_key(d->Key());
          r.set_expected(d->Value());
          r.set_expect_absent(in_->ConsumeBool());
          r.set_desired(d->Value());
        }
        h_->Unary<v1::KvCompareAndSetRequest, v1::KvCompareAndSetResponse>(
            "KvCompareAndSet", &Stub::async::KvCompareAndSet, r, auth, /*blocks=*/false,
            [](const v1::KvCompareAndSetRequest& req, const v1::KvCompareAndSetResponse& resp) {
              if (resp.swapped() && (!resp.present() || resp.current() != req.desired())) {
                Fail("KvCompareAndSet swapped but does not hold the desired value: " +
                     resp.ShortDebugString());
              }
            });
        return;
      }
      case Op::kBarrier: {
        v1::BarrierRequest r;
        if (parsed) {
          if (!Parse(in_, &r)) return;
        } else {
          r.set_generation(d->Generation());
          d->Member(r.mutable_member());
          const uint8_t c = d->Choice(3);
          r.set_name(c == 0 ? "b0" : c == 1 ? "" : d->Text(160));
          r.set_timeout_ms(d->Millis());
        }
        h_->Unary<v1::BarrierRequest, v1::BarrierResponse>("Barrier", &Stub::async::Barrier, r,
                                                           auth, /*blocks=*/true);
        return;
      }
      default:
        Catalog(op, auth, parsed, d);
    }
  }

  void Catalog(Op op, Auth auth, bool parsed, Draw* d) {
    switch (op) {
      case Op::kBeginCheckpoint: {
        v1::BeginCheckpointRequest r;
        if (parsed) {
          if (!Parse(in_, &r)) return;
        } else {
          r.set_generation(d->Generation());
          d->Member(r.mutable_member());
          r.set_step(d->Step());
        }
        h_->Unary<v1::BeginCheckpointRequest, v1::BeginCheckpointResponse>(
            "BeginCheckpoint", &Stub::async::BeginCheckpoint, r, auth, /*blocks=*/false);
        return;
      }
      case Op::kReportShard: {
        v1::ReportShardRequest r;
        if (parsed) {
          if (!Parse(in_, &r)) return;
        } else {
          r.set_checkpoint_id(d->CheckpointId());
          d->Member(r.mutable_member());
          const uint8_t files = d->Choice(10);
          for (uint8_t i = 0; i < files; ++i) {
            v1::ShardFile* f = r.add_files();
            f->set_path(d->Choice(2) == 0 ? absl::StrCat("/ckpt/", i) : d->Text(600));
            f->set_bytes(d->Choice(2) == 0 ? 1024 : in_->ConsumeIntegral<uint64_t>());
            f->set_checksum(d->Choice(2) == 0 ? "0123456789abcdef" : d->Text(24));
          }
          const uint8_t metric = d->Choice(4);
          r.set_metric_name(metric == 0 ? "" : metric == 1 ? "loss"
                            : metric == 2 ? "accuracy" : d->Text(40));
          r.set_metric_value(d->Metric());
        }
        h_->Unary<v1::ReportShardRequest, v1::ReportShardResponse>(
            "ReportShard", &Stub::async::ReportShard, r, auth, /*blocks=*/false);
        return;
      }
      case Op::kAbortCheckpoint: {
        v1::AbortCheckpointRequest r;
        if (parsed) {
          if (!Parse(in_, &r)) return;
        } else {
          r.set_checkpoint_id(d->CheckpointId());
          d->Member(r.mutable_member());
          r.set_reason(d->Text(300));
        }
        h_->Unary<v1::AbortCheckpointRequest, v1::AbortCheckpointResponse>(
            "AbortCheckpoint", &Stub::async::AbortCheckpoint, r, auth, /*blocks=*/false);
        return;
      }
      case Op::kListCheckpoints: {
        v1::ListCheckpointsRequest r;
        if (parsed) {
          if (!Parse(in_, &r)) return;
        } else {
          r.set_include_all(in_->ConsumeBool());
        }
        h_->Unary<v1::ListCheckpointsRequest, v1::ListCheckpointsResponse>(
            "ListCheckpoints", &Stub::async::ListCheckpoints, r, auth, /*blocks=*/false,
            CheckList);
        return;
      }
      case Op::kGetStatus: {
        v1::GetStatusRequest r;
        if (parsed && !Parse(in_, &r)) return;
        const CoordinatorOptions o = options_;
        h_->Unary<v1::GetStatusRequest, v1::GetStatusResponse>(
            "GetStatus", &Stub::async::GetStatus, r, auth, /*blocks=*/false,
            [o](const v1::GetStatusRequest&, const v1::GetStatusResponse& resp) {
              if (resp.min_members() != o.rules.min_members ||
                  resp.max_members() != o.rules.max_members || resp.job_state().empty() ||
                  static_cast<size_t>(resp.members_size()) > o.limits.max_members) {
                Fail("GetStatus answered a bad status: " + resp.ShortDebugString());
              }
            });
        return;
      }
      case Op::kGetWorld: {
        v1::GetWorldRequest r;
        if (parsed && !Parse(in_, &r)) return;
        h_->Unary<v1::GetWorldRequest, v1::GetWorldResponse>(
            "GetWorld", &Stub::async::GetWorld, r, auth, /*blocks=*/false, CheckWorldPage);
        return;
      }
      case Op::kSessionOpen:
        OpenSession(auth, parsed, d);
        return;
      default:
        return;
    }
  }

  void OpenSession(Auth auth, bool parsed, Draw* d) {
    std::vector<v1::SessionRequest> messages;
    if (parsed) {
      const uint8_t n = in_->ConsumeIntegralInRange<uint8_t>(1, kMaxSessionMessages);
      for (uint8_t i = 0; i < n; ++i) {
        v1::SessionRequest m;
        if (!Parse(in_, &m)) return;
        messages.push_back(std::move(m));
      }
    } else {
      v1::SessionRequest first;
      switch (d->Choice(4)) {
        case 0: break;  // no body
        case 1: first.mutable_heartbeat()->set_step(d->Step()); break;
        default: d->Member(first.mutable_hello());
      }
      messages.push_back(first);
      const uint8_t beats = d->Choice(4);
      for (uint8_t i = 0; i < beats; ++i) {
        v1::SessionRequest m;
        m.mutable_heartbeat()->set_step(d->Step());
        m.mutable_heartbeat()->set_sequence(i);
        messages.push_back(m);
      }
      if (d->Choice(4) == 0) messages.push_back(first);  // a second hello
    }
    h_->OpenSession(messages, auth);
  }

  FuzzedDataProvider* const in_;
  CoordinatorHarness* const h_;
  const CoordinatorOptions options_;
};

}  // namespace
}  // namespace muster::fuzz

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  // Every rejected request would log a line, and protobuf every slice that
  // is not UTF-8 where a string is expected; keep the fuzzer's output readable.
  muster::SetMinLogLevel(muster::LogLevel::kError);
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace muster::fuzz;
  FuzzedDataProvider in(data, size);
  const muster::CoordinatorOptions options = ReadOptions(&in);
  CoordinatorHarness& h = CoordinatorHarness::Get();
  if (!h.Begin(options)) return -1;  // invalid rules: not worth keeping
  Runner runner(&in, &h, options);
  for (size_t i = 0; i < kMaxOps && in.remaining_bytes() > 0; ++i) {
    runner.Step();
    h.AfterOp();
  }
  h.End();
  return 0;
}
