// muster events [--since T] [--limit N]: the coordinator's event log
// (--json: one JSON object per line).
#include <google/protobuf/util/json_util.h>

#include <iostream>

#include "absl/flags/flag.h"
#include "cli/command.h"
#include "cli/format.h"
#include "common/clock.h"

namespace muster::cli {

int Events(const Invocation& in) {
  // Compared with the events' wall-clock times.
  absl::StatusOr<int64_t> since =
      ParseSince(absl::GetFlag(FLAGS_since), in.clock->WallNow());
  if (!since.ok()) {
    std::cerr << "muster: " << since.status().message() << "\n";
    return 2;
  }
  v1::ListEventsRequest req;
  req.set_since_unix_ms(*since);
  req.set_limit(absl::GetFlag(FLAGS_limit));
  v1::ListEventsResponse resp;
  grpc::Status s = in.stub->ListEvents(in.ctx, req, &resp);
  if (!s.ok()) return Fail("events", s);
  if (!in.json) {
    std::cout << FormatEvents(resp);
    return 0;
  }
  for (const v1::Event& e : resp.events()) {
    std::string line;
    google::protobuf::util::JsonPrintOptions options;
    options.preserve_proto_field_names = true;
    (void)google::protobuf::util::MessageToJsonString(e, &line, options);
    std::cout << line << "\n";
  }
  return 0;
}

}  // namespace muster::cli
