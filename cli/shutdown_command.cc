// muster shutdown: stop the job.
#include <iostream>

#include "cli/command.h"

namespace muster::cli {

int Shutdown(const Invocation& in) {
  v1::ShutdownRequest req;
  req.set_reason("muster shutdown");
  v1::ShutdownResponse resp;
  grpc::Status s = in.stub->Shutdown(in.ctx, req, &resp);
  if (!s.ok()) return Fail("shutdown", s);
  if (in.json) {
    Print(resp);
  } else {
    std::cout << "coordinator is shutting down\n";
  }
  return 0;
}

}  // namespace muster::cli
