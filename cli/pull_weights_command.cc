// muster pull-weights --out FILE [--at-step N] [--member ID]: the model of a
// running job, from a trainer's state service, written to FILE after its
// checksum and format are verified.
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "cli/command.h"
#include "common/clock.h"
#include "common/file_system.h"
#include "common/status_macros.h"
#include "muster/v1/state.grpc.pb.h"
#include "rpc/coordinator_channel.h"
#include "rpc/credentials.h"
#include "rpc/status.h"
#include "trainer/checkpoint/safetensors.h"

namespace muster::cli {
namespace {

// --member, or the active member furthest ahead; null when none serves.
const v1::MemberStatus* Source(const v1::GetStatusResponse& status, const std::string& wanted) {
  const v1::MemberStatus* from = nullptr;
  for (const v1::MemberStatus& m : status.members()) {
    if (m.state_address().empty()) continue;
    if (!wanted.empty() ? m.member().member_id() == wanted
                        : m.state() == "active" && (from == nullptr || m.step() > from->step())) {
      from = &m;
    }
  }
  return from;
}

struct Pulled {
  int64_t step = -1;
  std::string bytes;  // a safetensors image, its checksum verified
};

// The state after --at-step from `address`, in order and whole.
absl::StatusOr<Pulled> Receive(v1::State::Stub& stub, const std::string& address,
                               const std::string& token, Clock* clock) {
  grpc::ClientContext ctx;
  AttachToken(&ctx, token);
  const absl::Duration timeout = absl::GetFlag(FLAGS_pull_timeout);
  ctx.set_deadline(SystemDeadline(clock->Now() + timeout, clock));
  v1::PullStateRequest req;
  req.set_at_step(absl::GetFlag(FLAGS_at_step));
  req.set_timeout_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(timeout)));
  auto reader = stub.PullState(&ctx, req);
  v1::StateChunk chunk;
  Pulled out;
  std::string xxh3;
  uint64_t total = 0;
  while (reader->Read(&chunk)) {
    if (chunk.offset() == 0 && out.bytes.empty()) {
      out.step = chunk.step();
      total = chunk.total_bytes();
      xxh3 = chunk.xxh3();
      out.bytes.reserve(total);
    }
    if (chunk.offset() != out.bytes.size() || out.bytes.size() + chunk.data().size() > total) {
      ctx.TryCancel();
      return absl::DataLossError(absl::StrCat("chunk at offset ", chunk.offset(), " of ", address,
                                              " does not follow byte ", out.bytes.size(), " of ",
                                              total));
    }
    out.bytes += chunk.data();
  }
  MUSTER_RETURN_IF_ERROR(FromGrpcStatus(reader->Finish()));
  if (out.bytes.size() != total || Xxh3Hex(out.bytes.data(), out.bytes.size()) != xxh3) {
    return absl::DataLossError(absl::StrCat("the state from ", address, " is damaged (",
                                            out.bytes.size(), " of ", total,
                                            " bytes, checksum mismatch or short)"));
  }
  return out;
}

}  // namespace

int PullWeights(const Invocation& in) {
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) {
    std::cerr << "muster: pull-weights needs --out FILE.safetensors\n";
    return 2;
  }
  v1::GetStatusResponse status;
  grpc::Status s = in.stub->GetStatus(in.ctx, v1::GetStatusRequest(), &status);
  if (!s.ok()) return Fail("status", s);
  const std::string wanted = absl::GetFlag(FLAGS_member);
  const v1::MemberStatus* from = Source(status, wanted);
  if (from == nullptr) {
    std::cerr << "muster: pull-weights: "
              << (wanted.empty() ? "no active member serves its state"
                                 : "member " + wanted + " is unknown or serves no state")
              << "\n";
    return 1;
  }
  auto channel = MakeChannel(from->state_address(), in.tls);
  if (!channel.ok()) {
    std::cerr << "muster: " << channel.status() << "\n";
    return 2;
  }
  const absl::Time start = in.clock->Now();
  auto stub = v1::State::NewStub(*channel);
  absl::StatusOr<Pulled> pulled = Receive(*stub, from->state_address(), in.token, in.clock);
  if (!pulled.ok()) {
    std::cerr << "muster: pull-weights from " << from->state_address() << ": " << pulled.status()
              << "\n";
    return 1;
  }
  auto parsed = ParseSafetensors(pulled->bytes, from->state_address());
  if (!parsed.ok()) {
    std::cerr << "muster: pull-weights: " << parsed.status() << "\n";
    return 1;
  }
  // A reader never sees half a file, nor a crash one.
  if (absl::Status w = WriteFileAtomically(DefaultFileSystem(), out, pulled->bytes); !w.ok()) {
    std::cerr << "muster: pull-weights: writing " << out << ": " << w << "\n";
    return 1;
  }
  std::cout << "pulled " << parsed->tensors.size() << " tensors (" << pulled->bytes.size()
            << " bytes) after step " << pulled->step << " from " << from->member().member_id()
            << " at " << from->state_address() << " in "
            << absl::FormatDuration(in.clock->Now() - start) << " into " << out << "\n";
  return 0;
}

}  // namespace muster::cli
