// muster drain NODE: the node's trainers leave at the next step boundary.
#include <iostream>

#include "cli/command.h"

namespace muster::cli {

int Drain(const Invocation& in) {
  if (in.args.size() != 1) {
    std::cerr << "muster: usage: muster drain NODE\n";
    return 2;
  }
  v1::DrainRequest req;
  req.set_node(in.args[0]);
  v1::DrainResponse resp;
  grpc::Status s = in.stub->Drain(in.ctx, req, &resp);
  if (!s.ok()) return Fail("drain", s);
  if (in.json) {
    Print(resp);
  } else {
    std::cout << "draining " << resp.members_drained() << " members of " << in.args[0] << "\n";
  }
  return 0;
}

}  // namespace muster::cli
