// muster: command line client of a running job.
//
//   muster --coordinator HOST:PORT [--token-file F] status|checkpoints|drain NODE|shutdown
//          [--json] [--all]
//
// Exit codes: 0 success, 1 the rpc failed (the gRPC status is printed),
// 2 bad usage.
#include <google/protobuf/util/json_util.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "cli/format.h"
#include "common/file_system.h"
#include "common/flag_names.h"
#include "common/token.h"
#include "muster/v1/coordinator.grpc.pb.h"
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

namespace {

using muster::v1::Coordinator;

int Fail(const std::string& what, const grpc::Status& status) {
  std::cerr << "muster: " << what << " failed: "
            << absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code()))
            << ": " << status.error_message() << "\n";
  return 1;
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

int Run(const std::vector<char*>& args) {
  if (args.size() < 2) {
    std::cerr << "muster: missing command (status, checkpoints, drain NODE, shutdown)\n";
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
  auto channel = muster::MakeChannel(target, tls);
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
            << " (status, checkpoints, drain NODE, shutdown)\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "muster --coordinator HOST:PORT [--token-file F] "
      "status|checkpoints|drain NODE|shutdown [--json] [--all]");
  muster::DashesToUnderscores(argc, argv);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  return Run(args);
}
