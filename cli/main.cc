// muster: command line client of a running job.
//
//   muster --coordinator HOST:PORT [--token-file F]
//          status|world|checkpoints|events|drain NODE|pull-weights|shutdown [--json] [--all]
//
// Exit codes: 0 success, 1 the rpc failed (the gRPC status is printed),
// 2 bad usage.
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cli/format.h"
#include "common/file_system.h"
#include "common/flag_names.h"
#include "common/token.h"
#include "muster/v1/coordinator.grpc.pb.h"
#include "muster/v1/state.grpc.pb.h"
#include "rpc/coordinator_channel.h"
#include "rpc/credentials.h"
#include "rpc/status.h"
#include "trainer/checkpoint/safetensors.h"

ABSL_FLAG(std::string, coordinator, "", "host:port of the coordinator (default $MUSTER_COORDINATOR)");
ABSL_FLAG(std::string, token_file, "", "job token file (default $MUSTER_TOKEN_FILE)");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA to verify a TLS coordinator");
ABSL_FLAG(std::string, tls_cert, "", "PEM client certificate (mutual TLS)");
ABSL_FLAG(std::string, tls_key, "", "PEM client key (mutual TLS)");
ABSL_FLAG(bool, json, false, "print JSON instead of tables");
ABSL_FLAG(bool, all, false, "checkpoints: include pending, aborted and retired ones");
ABSL_FLAG(bool, verify, false, "checkpoints: re-read every file and check its xxh3 checksum");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(10), "rpc deadline");
ABSL_FLAG(std::string, since, "",
          "events: only those since this time: a duration ago (10m, 2h) or an RFC 3339 time");
ABSL_FLAG(uint32_t, limit, 1000, "events: at most this many, the newest (up to 10,000)");
ABSL_FLAG(bool, watch, false,
          "status: redraw the table in place every --interval until Ctrl-C");
ABSL_FLAG(absl::Duration, interval, absl::Seconds(1), "status --watch: the redraw period");
ABSL_FLAG(std::string, out, "", "pull-weights: the safetensors file to write");
ABSL_FLAG(int64_t, at_step, 0,
          "pull-weights: the state after this step (the first step boundary at or after it; "
          "0: the next one)");
ABSL_FLAG(std::string, member, "",
          "pull-weights: pull from this member (default: the active member furthest ahead)");
ABSL_FLAG(absl::Duration, pull_timeout, absl::Seconds(120),
          "pull-weights: how long to wait for the step and the transfer");

namespace {

using muster::v1::Coordinator;

int Fail(const std::string& what, const grpc::Status& status) {
  std::cerr << "muster: " << what << " failed: "
            << absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code()))
            << ": " << status.error_message() << "\n";
  return 1;
}

std::atomic<bool> g_interrupted{false};

// muster status --watch: the status table and the newest events, redrawn in
// place every `interval` until SIGINT or SIGTERM; rpc errors are shown in
// the table's place (the coordinator may be restarting) and the address is
// looked up again each time (a file: target follows a failover). Exit 0.
int WatchStatus(const std::string& target, const muster::TlsFiles& tls, const std::string& token,
                absl::Duration interval) {
  std::signal(SIGINT, [](int) { g_interrupted = true; });
  std::signal(SIGTERM, [](int) { g_interrupted = true; });
  absl::StatusOr<std::unique_ptr<muster::CoordinatorChannel>> coordinator =
      muster::CoordinatorChannel::Create(target, tls);
  if (!coordinator.ok()) {
    std::cerr << "muster: " << coordinator.status() << "\n";
    return 2;
  }
  std::unique_ptr<Coordinator::Stub> stub = Coordinator::NewStub((*coordinator)->get());
  while (!g_interrupted) {
    std::string body;
    if ((*coordinator)->Refresh()) stub = Coordinator::NewStub((*coordinator)->get());
    muster::v1::GetStatusResponse status;
    grpc::ClientContext ctx;
    muster::AttachToken(&ctx, token);
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + std::max(interval, absl::Seconds(2))));
    const grpc::Status s = stub->GetStatus(&ctx, muster::v1::GetStatusRequest(), &status);
    if (s.ok()) {
      body = muster::FormatStatus(status);
      muster::v1::ListEventsRequest req;
      req.set_limit(8);
      muster::v1::ListEventsResponse events;
      grpc::ClientContext ectx;
      muster::AttachToken(&ectx, token);
      ectx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
      if (stub->ListEvents(&ectx, req, &events).ok()) {
        absl::StrAppend(&body, "\nnewest events:\n", muster::FormatEvents(events));
      }
    } else {
      body = absl::StrCat("(", (*coordinator)->address(), ": ",
                          absl::StatusCodeToString(static_cast<absl::StatusCode>(s.error_code())),
                          ": ", s.error_message(), ")\n");
    }
    // Home, clear, redraw: one write, so the terminal never shows half.
    std::cout << "\033[H\033[2J"
              << absl::FormatTime("muster status %H:%M:%S", absl::Now(), absl::LocalTimeZone())
              << "  every " << absl::FormatDuration(interval) << "  (Ctrl-C to quit)\n\n"
              << body << std::flush;
    for (absl::Time end = absl::Now() + interval; absl::Now() < end && !g_interrupted;) {
      absl::SleepFor(absl::Milliseconds(20));
    }
  }
  std::cout << "\n";
  return 0;
}

void Print(const google::protobuf::Message& msg) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(msg, &json, options);
  std::cout << json;
}

// muster pull-weights: the model of a running job, from a trainer's state
// service, written to --out after its checksum and format are verified.
int PullWeights(const muster::v1::GetStatusResponse& status, const std::string& token,
                const muster::TlsFiles& tls) {
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) {
    std::cerr << "muster: pull-weights needs --out FILE.safetensors\n";
    return 2;
  }
  const std::string wanted = absl::GetFlag(FLAGS_member);
  const muster::v1::MemberStatus* from = nullptr;
  for (const muster::v1::MemberStatus& m : status.members()) {
    if (m.state_address().empty()) continue;
    if (!wanted.empty() ? m.member().member_id() == wanted
                        : m.state() == "active" && (from == nullptr || m.step() > from->step())) {
      from = &m;
    }
  }
  if (from == nullptr) {
    std::cerr << "muster: pull-weights: "
              << (wanted.empty() ? "no active member serves its state"
                                 : "member " + wanted + " is unknown or serves no state")
              << "\n";
    return 1;
  }
  auto channel = muster::MakeChannel(from->state_address(), tls);
  if (!channel.ok()) {
    std::cerr << "muster: " << channel.status() << "\n";
    return 2;
  }
  const absl::Time start = absl::Now();
  auto stub = muster::v1::State::NewStub(*channel);
  grpc::ClientContext ctx;
  muster::AttachToken(&ctx, token);
  const absl::Duration timeout = absl::GetFlag(FLAGS_pull_timeout);
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  muster::v1::PullStateRequest req;
  req.set_at_step(absl::GetFlag(FLAGS_at_step));
  req.set_timeout_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(timeout)));
  auto reader = stub->PullState(&ctx, req);
  muster::v1::StateChunk chunk;
  std::string bytes, xxh3;
  int64_t step = -1;
  uint64_t total = 0;
  while (reader->Read(&chunk)) {
    if (chunk.offset() == 0 && bytes.empty()) {
      step = chunk.step();
      total = chunk.total_bytes();
      xxh3 = chunk.xxh3();
      bytes.reserve(total);
    }
    if (chunk.offset() != bytes.size() || bytes.size() + chunk.data().size() > total) {
      std::cerr << "muster: pull-weights: chunk at offset " << chunk.offset() << " of "
                << from->state_address() << " does not follow byte " << bytes.size() << " of "
                << total << "\n";
      return 1;
    }
    bytes += chunk.data();
  }
  grpc::Status s = reader->Finish();
  if (!s.ok()) return Fail("pull-weights from " + from->state_address(), s);
  if (bytes.size() != total || muster::Xxh3Hex(bytes.data(), bytes.size()) != xxh3) {
    std::cerr << "muster: pull-weights: the state from " << from->state_address()
              << " is damaged (" << bytes.size() << " of " << total
              << " bytes, checksum mismatch or short)\n";
    return 1;
  }
  auto parsed = muster::ParseSafetensors(bytes, from->state_address());
  if (!parsed.ok()) {
    std::cerr << "muster: pull-weights: " << parsed.status() << "\n";
    return 1;
  }
  // A reader never sees half a file, nor a crash one.
  if (absl::Status w = muster::WriteFileAtomically(muster::DefaultFileSystem(), out, bytes);
      !w.ok()) {
    std::cerr << "muster: pull-weights: writing " << out << ": " << w << "\n";
    return 1;
  }
  std::cout << "pulled " << parsed->tensors.size() << " tensors (" << bytes.size()
            << " bytes) after step " << step << " from " << from->member().member_id() << " at "
            << from->state_address() << " in " << absl::FormatDuration(absl::Now() - start)
            << " into " << out << "\n";
  return 0;
}

// `muster world`: every page of GetWorld, as one answer.
int World(Coordinator::Stub& stub, const std::string& token, bool json) {
  muster::v1::GetWorldResponse all;
  uint32_t next = 0;
  do {
    grpc::ClientContext ctx;
    muster::AttachToken(&ctx, token);
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::GetFlag(FLAGS_timeout)));
    muster::v1::GetWorldRequest req;
    // 0 for the first page (the current world); then that world's
    // generation, so a regroup between pages fails (NOT_FOUND) instead of
    // mixing two worlds.
    req.set_generation(all.world().generation());
    req.set_start_rank(next);
    req.set_max_members(10'000);
    muster::v1::GetWorldResponse page;
    grpc::Status s = stub.GetWorld(&ctx, req, &page);
    if (!s.ok()) return Fail("world", s);
    *all.mutable_world() = page.world();
    for (muster::v1::Assignment& a : *page.mutable_members()) *all.add_members() = std::move(a);
    next = page.next_rank();
    all.set_next_rank(next);
  } while (next < all.world().world_size());
  if (json) Print(all); else std::cout << muster::FormatWorld(all);
  return 0;
}

int Run(const std::vector<char*>& args) {
  if (args.size() < 2) {
    std::cerr << "muster: missing command (status, world, checkpoints, drain NODE, pull-weights --out FILE, shutdown)\n";
    return 2;
  }
  const std::string command = args[1];
  std::string target = absl::GetFlag(FLAGS_coordinator);
  if (target.empty() && std::getenv("MUSTER_COORDINATOR") != nullptr) {
    target = std::getenv("MUSTER_COORDINATOR");
  }
  if (target.empty()) {
    std::cerr << "muster: no coordinator: pass --coordinator HOST:PORT or set "
                 "MUSTER_COORDINATOR\n";
    return 2;
  }
  auto token = muster::ResolveToken(absl::GetFlag(FLAGS_token_file));
  if (!token.ok()) {
    std::cerr << "muster: " << token.status() << "\n";
    return 2;
  }
  muster::TlsFiles tls{absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
                       absl::GetFlag(FLAGS_tls_ca)};
  if (command == "status" && absl::GetFlag(FLAGS_watch)) {
    if (absl::GetFlag(FLAGS_interval) < absl::Milliseconds(100)) {
      std::cerr << "muster: --interval must be at least 100ms\n";
      return 2;
    }
    return WatchStatus(target, tls, *token, absl::GetFlag(FLAGS_interval));
  }
  // file:PATH: the address file the coordinator holding the lease wrote.
  const absl::StatusOr<std::string> address = muster::ResolveCoordinator(target);
  if (!address.ok()) {
    std::cerr << "muster: " << address.status() << "\n";
    return 2;
  }
  auto channel = muster::MakeChannel(*address, tls);
  if (!channel.ok()) {
    std::cerr << "muster: " << channel.status() << "\n";
    return 2;
  }
  auto stub = Coordinator::NewStub(*channel);
  grpc::ClientContext ctx;
  muster::AttachToken(&ctx, *token);
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::GetFlag(FLAGS_timeout)));
  const bool json = absl::GetFlag(FLAGS_json);

  if (command == "status") {
    muster::v1::GetStatusResponse resp;
    grpc::Status s = stub->GetStatus(&ctx, muster::v1::GetStatusRequest(), &resp);
    if (!s.ok()) return Fail("status", s);
    if (json) Print(resp); else std::cout << muster::FormatStatus(resp);
    return 0;
  }
  if (command == "checkpoints") {
    muster::v1::ListCheckpointsRequest req;
    req.set_include_all(absl::GetFlag(FLAGS_all));
    muster::v1::ListCheckpointsResponse resp;
    grpc::Status s = stub->ListCheckpoints(&ctx, req, &resp);
    if (!s.ok()) return Fail("checkpoints", s);
    if (json) Print(resp); else std::cout << muster::FormatCheckpoints(resp);
    if (!absl::GetFlag(FLAGS_verify)) return 0;
    int bad = 0;
    for (const muster::v1::Checkpoint& c : resp.checkpoints()) {
      if (c.state() != muster::v1::Checkpoint::COMMITTED) continue;
      const int bad_before = bad;
      for (const muster::v1::ShardFile& f : c.files()) {
        auto bytes = muster::DefaultFileSystem()->ReadFile(f.path(), uint64_t{64} << 30);
        std::string problem;
        if (!bytes.ok()) {
          problem = std::string(bytes.status().message());
        } else if (bytes->size() != f.bytes()) {
          problem = absl::StrCat("size ", bytes->size(), ", the catalog says ", f.bytes());
        } else if (muster::Xxh3Hex(bytes->data(), bytes->size()) != f.checksum()) {
          problem = "checksum mismatch";
        }
        if (!problem.empty()) {
          ++bad;
          std::cout << "BAD  step " << c.step() << "  " << f.path() << ": " << problem << "\n";
        }
      }
      if (bad == bad_before) {
        std::cout << "ok   step " << c.step() << "  " << c.files_size() << " files\n";
      }
    }
    return bad == 0 ? 0 : 1;
  }
  if (command == "drain") {
    if (args.size() != 3) {
      std::cerr << "muster: usage: muster drain NODE\n";
      return 2;
    }
    muster::v1::DrainRequest req;
    req.set_node(args[2]);
    muster::v1::DrainResponse resp;
    grpc::Status s = stub->Drain(&ctx, req, &resp);
    if (!s.ok()) return Fail("drain", s);
    if (json) Print(resp);
    else std::cout << "draining " << resp.members_drained() << " members of " << args[2] << "\n";
    return 0;
  }
  if (command == "world") return World(*stub, *token, json);
  if (command == "pull-weights") {
    muster::v1::GetStatusResponse status;
    grpc::Status s = stub->GetStatus(&ctx, muster::v1::GetStatusRequest(), &status);
    if (!s.ok()) return Fail("status", s);
    return PullWeights(status, *token, tls);
  }
  if (command == "events") {
    absl::StatusOr<int64_t> since = muster::ParseSince(absl::GetFlag(FLAGS_since), absl::Now());
    if (!since.ok()) {
      std::cerr << "muster: " << since.status().message() << "\n";
      return 2;
    }
    muster::v1::ListEventsRequest req;
    req.set_since_unix_ms(*since);
    req.set_limit(absl::GetFlag(FLAGS_limit));
    muster::v1::ListEventsResponse resp;
    grpc::Status s = stub->ListEvents(&ctx, req, &resp);
    if (!s.ok()) return Fail("events", s);
    if (!json) {
      std::cout << muster::FormatEvents(resp);
      return 0;
    }
    // JSON lines: one object per event.
    for (const muster::v1::Event& e : resp.events()) {
      std::string line;
      google::protobuf::util::JsonPrintOptions options;
      options.preserve_proto_field_names = true;
      (void)google::protobuf::util::MessageToJsonString(e, &line, options);
      std::cout << line << "\n";
    }
    return 0;
  }
  if (command == "shutdown") {
    muster::v1::ShutdownRequest req;
    req.set_reason("muster shutdown");
    muster::v1::ShutdownResponse resp;
    grpc::Status s = stub->Shutdown(&ctx, req, &resp);
    if (!s.ok()) return Fail("shutdown", s);
    if (json) Print(resp); else std::cout << "coordinator is shutting down\n";
    return 0;
  }
  std::cerr << "muster: unknown command " << command
            << " (status, world, checkpoints, events, drain NODE, pull-weights --out FILE, "
               "shutdown)\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  muster::ListOwnFlagsInHelp();
  absl::SetProgramUsageMessage(
      "muster --coordinator HOST:PORT [--token-file F] COMMAND [--json]\n"
      "COMMAND is one of\n"
      "  status [--watch [--interval D]]   the world, its members and recent events\n"
      "  world                  the current world's membership by rank (paged GetWorld)\n"
      "  checkpoints [--all] [--verify]   the checkpoint catalog (--verify re-reads the files)\n"
      "  events [--since T] [--limit N]   the coordinator's event log (--json: JSON lines)\n"
      "  drain NODE             the node's trainers leave at the next step boundary\n"
      "  pull-weights --out FILE [--at-step N]   a trainer's weights as safetensors\n"
      "  shutdown               stop the job");
  muster::DashesToUnderscores(argc, argv);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  return Run(args);
}
