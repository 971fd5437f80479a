// The muster client's commands: each one is a function of an Invocation,
// in a file of its own (cli/<name>_command.cc), listed in main.cc's table.
#ifndef MUSTER_CLI_COMMAND_H_
#define MUSTER_CLI_COMMAND_H_

#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/flags/declare.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "muster/v1/coordinator.grpc.pb.h"
#include "rpc/tls_files.h"

ABSL_DECLARE_FLAG(bool, all);
ABSL_DECLARE_FLAG(bool, verify);
ABSL_DECLARE_FLAG(std::string, consolidate);
ABSL_DECLARE_FLAG(absl::Duration, timeout);
ABSL_DECLARE_FLAG(std::string, since);
ABSL_DECLARE_FLAG(uint32_t, limit);
ABSL_DECLARE_FLAG(std::string, out);
ABSL_DECLARE_FLAG(int64_t, at_step);
ABSL_DECLARE_FLAG(std::string, member);
ABSL_DECLARE_FLAG(absl::Duration, pull_timeout);

namespace muster::cli {

// What every command gets: a stub of the coordinator and a context with the
// token and the --timeout deadline set (one call's worth; a command that
// calls more makes its own contexts), the command's words after its name,
// and --json.
struct Invocation {
  v1::Coordinator::Stub* stub = nullptr;
  grpc::ClientContext* ctx = nullptr;
  std::string token;
  TlsFiles tls;
  bool json = false;
  std::vector<std::string> args;
  Clock* clock = nullptr;  // main's RealClock: deadlines and the event window
};

// Exit codes: 0 success, 1 the call failed, 2 bad usage.
int Fail(const std::string& what, const grpc::Status& status);
// `message` as indented JSON on stdout.
void Print(const google::protobuf::Message& message);
// A context with the token and the --timeout deadline.
void Prepare(grpc::ClientContext* ctx, const std::string& token, Clock* clock);

int Status(const Invocation& in);
int World(const Invocation& in);
int Checkpoints(const Invocation& in);
// checkpoints --consolidate DIR: the checkpoint directory's sharded
// optimizer state written whole as DIR/optimizer.safetensors, from the
// files alone.
int Consolidate(const std::string& dir);
int Events(const Invocation& in);
int Drain(const Invocation& in);
int PullWeights(const Invocation& in);
int Shutdown(const Invocation& in);
// `status --watch`: needs no connection made beforehand (it follows a
// file: target across failovers itself).
int WatchStatus(const std::string& target, const TlsFiles& tls, const std::string& token,
                absl::Duration interval, Clock* clock);

}  // namespace muster::cli

#endif  // MUSTER_CLI_COMMAND_H_
