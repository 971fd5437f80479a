#include "cli/command.h"

#include <google/protobuf/util/json_util.h>

#include <iostream>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "common/clock.h"
#include "rpc/credentials.h"

namespace muster::cli {

int Fail(const std::string& what, const grpc::Status& status) {
  std::cerr << "muster: " << what << " failed: "
            << absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code()))
            << ": " << status.error_message() << "\n";
  return 1;
}

void Print(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  std::cout << json;
}

void Prepare(grpc::ClientContext* ctx, const std::string& token, Clock* clock) {
  AttachToken(ctx, token);
  ctx->set_deadline(SystemDeadline(clock->Now() + absl::GetFlag(FLAGS_timeout), clock));
}

}  // namespace muster::cli
