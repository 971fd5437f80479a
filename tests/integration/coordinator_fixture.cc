#include "tests/integration/coordinator_fixture.h"

#include "coordinator/server.h"

namespace muster {

struct InProcessCoordinator::Impl {
  std::unique_ptr<CoordinatorServer> server;
};

std::unique_ptr<InProcessCoordinator> InProcessCoordinator::Start(int world, int keep_last,
                                                                  const std::string& state_dir,
                                                                  int min_members) {
  ServerOptions so;
  so.coordinator.rules.min_members = min_members > 0 ? min_members : world;
  so.coordinator.rules.max_members = world;
  so.coordinator.rules.last_call = absl::ZeroDuration();
  so.coordinator.catalog.keep_last = static_cast<uint32_t>(keep_last);
  so.state_dir = state_dir;
  auto impl = std::make_unique<Impl>();
  impl->server = std::move(CoordinatorServer::Start(so)).value();
  return std::unique_ptr<InProcessCoordinator>(new InProcessCoordinator(std::move(impl)));
}

InProcessCoordinator::InProcessCoordinator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
InProcessCoordinator::~InProcessCoordinator() = default;
int InProcessCoordinator::port() const { return impl_->server->port(); }

std::string InProcessCoordinator::MetricsText() {
  impl_->server->metrics()->Update(impl_->server->coordinator()->Counters());
  return impl_->server->metrics()->Render();
}

}  // namespace muster
