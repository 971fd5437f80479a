// muster status [--watch]: the world, its members and the newest events.
#include <atomic>
#include <csignal>
#include <iostream>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cli/command.h"
#include "cli/format.h"
#include "common/clock.h"
#include "rpc/coordinator_channel.h"
#include "rpc/credentials.h"

namespace muster::cli {

int Status(const Invocation& in) {
  v1::GetStatusResponse resp;
  grpc::Status s = in.stub->GetStatus(in.ctx, v1::GetStatusRequest(), &resp);
  if (!s.ok()) return Fail("status", s);
  if (in.json) {
    Print(resp);
  } else {
    std::cout << FormatStatus(resp);
  }
  return 0;
}

namespace {

std::atomic<bool> g_interrupted{false};

}  // namespace

// muster status --watch: the status table and the newest events, redrawn in
// place every `interval` until SIGINT or SIGTERM; rpc errors are shown in
// the table's place (the coordinator may be restarting) and the address is
// looked up again each time (a file: target follows a failover). Exit 0.
int WatchStatus(const std::string& target, const muster::TlsFiles& tls, const std::string& token,
                absl::Duration interval, Clock* clock) {
  std::signal(SIGINT, [](int) { g_interrupted = true; });
  std::signal(SIGTERM, [](int) { g_interrupted = true; });
  absl::StatusOr<std::unique_ptr<muster::CoordinatorChannel>> coordinator =
      muster::CoordinatorChannel::Create(target, tls);
  if (!coordinator.ok()) {
    std::cerr << "muster: " << coordinator.status() << "\n";
    return 2;
  }
  std::unique_ptr<v1::Coordinator::Stub> stub = v1::Coordinator::NewStub((*coordinator)->get());
  while (!g_interrupted) {
    std::string body;
    if ((*coordinator)->Refresh()) stub = v1::Coordinator::NewStub((*coordinator)->get());
    muster::v1::GetStatusResponse status;
    grpc::ClientContext ctx;
    muster::AttachToken(&ctx, token);
    ctx.set_deadline(SystemDeadline(clock->Now() + std::max(interval, absl::Seconds(2)), clock));
    const grpc::Status s = stub->GetStatus(&ctx, muster::v1::GetStatusRequest(), &status);
    if (s.ok()) {
      body = muster::FormatStatus(status);
      muster::v1::ListEventsRequest req;
      req.set_limit(8);
      muster::v1::ListEventsResponse events;
      grpc::ClientContext ectx;
      muster::AttachToken(&ectx, token);
      ectx.set_deadline(SystemDeadline(clock->Now() + absl::Seconds(2), clock));
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
              << absl::FormatTime("muster status %H:%M:%S", clock->WallNow(), absl::LocalTimeZone())
              << "  every " << absl::FormatDuration(interval) << "  (Ctrl-C to quit)\n\n"
              << body << std::flush;
    for (absl::Time end = clock->Now() + interval; clock->Now() < end && !g_interrupted;) {
      absl::SleepFor(absl::Milliseconds(20));
    }
  }
  std::cout << "\n";
  return 0;
}

}  // namespace muster::cli
