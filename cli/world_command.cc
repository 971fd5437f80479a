// muster world: the current world's membership by rank.
#include <iostream>
#include <utility>

#include "cli/command.h"
#include "cli/format.h"

namespace muster::cli {

// `muster world`: every page of GetWorld, as one answer.
int World(const Invocation& in) {
  muster::v1::GetWorldResponse all;
  uint32_t next = 0;
  do {
    grpc::ClientContext ctx;
    Prepare(&ctx, in.token, in.clock);
    muster::v1::GetWorldRequest req;
    // 0 for the first page (the current world); then that world's
    // generation, so a regroup between pages fails (NOT_FOUND) instead of
    // mixing two worlds.
    req.set_generation(all.world().generation());
    req.set_start_rank(next);
    req.set_max_members(10'000);
    muster::v1::GetWorldResponse page;
    grpc::Status s = in.stub->GetWorld(&ctx, req, &page);
    if (!s.ok()) return Fail("world", s);
    *all.mutable_world() = page.world();
    for (muster::v1::Assignment& a : *page.mutable_members()) *all.add_members() = std::move(a);
    next = page.next_rank();
    all.set_next_rank(next);
  } while (next < all.world().world_size());
  if (in.json) {
    Print(all);
  } else {
    std::cout << FormatWorld(all);
  }
  return 0;
}

}  // namespace muster::cli
