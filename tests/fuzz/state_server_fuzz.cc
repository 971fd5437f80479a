// libFuzzer target over the trainer's state service (PullState): one
// StateServer per process on 127.0.0.1 (it serves TCP only), and per input
// up to kMaxCalls calls, each with the job token, a wrong one or none, its
// request parsed from the input or drawn field by field, while this thread
// plays the training thread (Wanted / Publish). Invariants (abort()):
//   - no crash, no sanitizer report;
//   - a wrong or missing token is UNAUTHENTICATED; a negative at_step with
//     the token is INVALID_ARGUMENT; nothing else but OK, DEADLINE_EXCEEDED
//     and CANCELLED is answered;
//   - a successful stream is the state last published, at a step at or
//     after at_step: contiguous chunks, total_bytes and xxh3 as announced;
//   - once its caller is gone, no call still waits (Wanted() turns false).
#include <fuzzer/FuzzedDataProvider.h>
#include <google/protobuf/stubs/logging.h>
#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "muster/v1/state.grpc.pb.h"
#include "rpc/credentials.h"
#include "trainer/checkpoint/safetensors.h"
#include "trainer/elastic/state_server.h"

namespace muster {
namespace {

constexpr char kToken[] = "fuzz-state-token";
constexpr char kMemberId[] = "fuzz/0";
constexpr int kMaxCalls = 4;
constexpr uint16_t kMaxSliceBytes = 64;
// Wanted(kAnyStep): does any call wait (for a step below the largest, which
// Wanted() uses to mean nobody)?
constexpr int64_t kAnyStep = std::numeric_limits<int64_t>::max() - 1;

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "\n==== state_server_fuzz: invariant violated ====\n%s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

// Waits up to `limit` for `done()`.
template <typename F>
bool Eventually(F done, absl::Duration limit) {
  const absl::Time end = absl::Now() + limit;
  while (!done()) {
    if (absl::Now() > end) return false;
    absl::SleepFor(absl::Microseconds(200));
  }
  return true;
}

class Harness {
 public:
  Harness() {
    auto server = StateServer::Start({"127.0.0.1:0", kToken, {}, kMemberId, RealClock::Get()});
    if (!server.ok()) Fail(server.status().ToString());
    server_ = *std::move(server);
    auto channel = MakeChannel(absl::StrCat("127.0.0.1:", server_->port()), {});
    if (!channel.ok()) Fail(channel.status().ToString());
    stub_ = v1::State::NewStub(*channel);
  }

  void Input(FuzzedDataProvider* in) {
    for (int i = 0; i < kMaxCalls && in->remaining_bytes() > 0; ++i) Call(in);
    // Every caller is gone now: none may still be waited for.
    if (!Eventually([this] { return !server_->Wanted(kAnyStep); }, absl::Seconds(2))) {
      Fail("a PullState call still waits for the state 2 s after its caller went away");
    }
  }

 private:
  // One call, read as: auth ConsumeIntegralInRange<uint8_t>(0, 3) (0, 1: the
  // token, 2: a wrong one, 3: none); parsed ConsumeBool(); then either a
  // slice (length ConsumeIntegralInRange<uint16_t>(0, kMaxSliceBytes), bytes)
  // holding the PullStateRequest, or its fields drawn one by one; publish
  // ConsumeBool(); the state (length ConsumeIntegralInRange<uint16_t>(0, 256),
  // bytes); big ConsumeIntegralInRange<uint8_t>(0, 15) (0: grow the state
  // past one chunk). write_seeds.cc writes the same format.
  void Call(FuzzedDataProvider* in) {
    const uint8_t auth = in->ConsumeIntegralInRange<uint8_t>(0, 3);
    v1::PullStateRequest req;
    if (in->ConsumeBool()) {
      if (!req.ParseFromString(in->ConsumeBytesAsString(
              in->ConsumeIntegralInRange<uint16_t>(0, kMaxSliceBytes)))) {
        return;
      }
    } else {
      switch (in->ConsumeIntegralInRange<uint8_t>(0, 3)) {
        case 0: req.set_at_step(0); break;
        case 1: req.set_at_step(last_step_ + in->ConsumeIntegralInRange<int64_t>(1, 3)); break;
        case 2: req.set_at_step(-1); break;
        default: req.set_at_step(in->ConsumeIntegral<int64_t>());
      }
      const uint8_t t = in->ConsumeIntegralInRange<uint8_t>(0, 2);
      req.set_timeout_ms(t == 0 ? 0 : t == 1 ? 5 : in->ConsumeIntegral<uint32_t>());
    }
    const bool publish = in->ConsumeBool();
    std::string state = in->ConsumeBytesAsString(in->ConsumeIntegralInRange<uint16_t>(0, 256));
    if (in->ConsumeIntegralInRange<uint8_t>(0, 15) == 0) state.resize((1 << 20) + 77, 's');

    // A call that may wait gives up after 30 ms (then the server must let it
    // go); one that must be refused gets time enough to be answered.
    const bool valid = auth < 2 && req.at_step() >= 0;
    grpc::ClientContext ctx;
    ctx.set_deadline(
        absl::ToChronoTime(absl::Now() + (valid ? absl::Milliseconds(30) : absl::Seconds(10))));
    if (auth < 2) AttachToken(&ctx, kToken);
    if (auth == 2) AttachToken(&ctx, "fuzz-state-tokeN");
    auto reader = stub_->PullState(&ctx, req);

    // The training thread: at the next few step boundaries, publish if a
    // call wants the state.
    if (valid && publish &&
        Eventually([this] { return server_->Wanted(kAnyStep); }, absl::Milliseconds(20))) {
      for (int64_t s = last_step_ + 1; s <= last_step_ + 4; ++s) {
        if (!server_->Wanted(s)) continue;
        server_->Publish(s, /*generation=*/7, state);
        last_step_ = s;
        last_state_ = state;
        break;
      }
    }
    Read(req, auth, reader.get());
  }

  void Read(const v1::PullStateRequest& req, uint8_t auth,
            grpc::ClientReader<v1::StateChunk>* reader) {
    v1::StateChunk chunk;
    v1::StateChunk first;
    std::string bytes;
    bool any = false;
    while (reader->Read(&chunk)) {
      if (!any) first = chunk;
      any = true;
      if (chunk.offset() != bytes.size()) Fail("chunks are not contiguous");
      bytes += chunk.data();
    }
    const grpc::Status s = reader->Finish();
    const std::string what =
        absl::StrCat("PullState {", req.ShortDebugString(), "} with auth ", auth, " answered ",
                     s.error_code(), ": ", s.error_message());
    if (auth >= 2) {
      if (s.error_code() != grpc::StatusCode::UNAUTHENTICATED) Fail(what);
      return;
    }
    if (req.at_step() < 0) {
      if (s.error_code() != grpc::StatusCode::INVALID_ARGUMENT) Fail(what);
      return;
    }
    if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
        s.error_code() == grpc::StatusCode::CANCELLED) {
      return;
    }
    if (!s.ok() || !any) Fail(what);
    if (first.member_id() != kMemberId || first.generation() != 7 ||
        first.step() < req.at_step() || first.step() != last_step_ ||
        first.total_bytes() != bytes.size() || bytes != last_state_ ||
        first.xxh3() != Xxh3Hex(bytes.data(), bytes.size())) {
      Fail(what + "\nbut not with the state last published: " + first.ShortDebugString());
    }
  }

  std::unique_ptr<StateServer> server_;
  std::unique_ptr<v1::State::Stub> stub_;
  int64_t last_step_ = 0;  // the training thread's last published step
  std::string last_state_;
};

}  // namespace
}  // namespace muster

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  muster::SetMinLogLevel(muster::LogLevel::kError);
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static muster::Harness* harness = new muster::Harness();
  FuzzedDataProvider in(data, size);
  harness->Input(&in);
  return 0;
}
