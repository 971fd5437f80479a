#include "tests/integration/comm_harness.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/status_macros.h"
#include "tests/integration/comm_world.h"

namespace muster {

float TestValue(int rank, size_t i) { return static_cast<float>((rank + 1) + (i % 5)); }

CommHarness::CommHarness(NodeSplit split, std::string job)
    : split_(std::move(split)), job_(std::move(job)) {
  ServerOptions o;
  o.coordinator.rules.min_members = static_cast<uint32_t>(split_.size());
  o.coordinator.rules.max_members = static_cast<uint32_t>(split_.size());
  o.coordinator.rules.last_call = absl::ZeroDuration();
  o.coordinator.heartbeat_interval = absl::Milliseconds(200);
  o.coordinator.heartbeat_timeout = absl::Seconds(5);
  server_ = std::move(CoordinatorServer::Start(o)).value();
}

CommHarness::~CommHarness() = default;

absl::Status CommHarness::Run(const CommOptions& options,
                              const std::function<void(RankContext&)>& body) {
  const int n = size();
  std::vector<RankContext> ranks(n);
  absl::Mutex mu;
  absl::Status first_error;
  auto fail = [&](const absl::Status& s) {
    absl::MutexLock lock(&mu);
    if (first_error.ok()) first_error = s;
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      RankContext& rc = ranks[i];
      rc.index = i;
      ClientOptions co;
      co.target = absl::StrCat("127.0.0.1:", server_->port());
      co.member_id = absl::StrCat("m", i);
      co.node = absl::StrCat("node", split_[i]);
      co.local_rank = static_cast<uint32_t>(i);
      co.clock = RealClock::Get();
      auto client = CoordinatorClient::Create(co);
      if (!client.ok()) return fail(client.status());
      rc.client = std::move(*client);
      const absl::Time deadline = absl::Now() + absl::Seconds(30);
      if (absl::Status s = rc.client->Join(0, deadline); !s.ok()) return fail(s);
      if (absl::Status s = rc.client->StartSession([](const SessionNotice&) {}); !s.ok()) {
        return fail(s);
      }
      auto world = rc.client->Rendezvous(0, 0, deadline);
      if (!world.ok()) return fail(world.status());
      rc.world = *world;
      rc.store = NewCoordinatorStore(rc.client.get(), rc.world.generation);
      CommOptions o = options;
      o.job = job_;
      o.check_buffers = true;  // every buffer handed over must be in the declared memory
      o.gloo.hostname = "127.0.0.1";
      o.clock = RealClock::Get();
      auto comm = BuildCommunicator(rc.world, rc.store.get(), o, deadline);
      if (!comm.ok()) return fail(comm.status());
      rc.comm = std::move(*comm);
    });
  }
  for (auto& t : threads) t.join();
  threads.clear();
  if (!first_error.ok()) return first_error;
  for (int i = 0; i < n; ++i) threads.emplace_back([&, i] { body(ranks[i]); });
  for (auto& t : threads) t.join();
  return absl::OkStatus();
}

}  // namespace muster

namespace muster {

absl::Status RunCommWorld(int world, const std::string& backend,
                          const std::function<void(int rank, Communicator* comm)>& body) {
  return RunCommWorld(NodeSplit(world, 0), backend, GradientCompression::kNone, body);
}

absl::Status RunCommWorld(const std::vector<int>& node_of, const std::string& backend,
                          GradientCompression compression,
                          const std::function<void(int rank, Communicator* comm)>& body) {
  CommHarness h(node_of, absl::StrCat(backend, "world", ::getpid()));
  CommOptions o;
  MUSTER_ASSIGN_OR_RETURN(o.backend, ParseBackend(backend));
  o.gloo.hostname = "127.0.0.1";
  o.gradient_compression = compression;
  return h.Run(o, [&](RankContext& rc) { body(rc.world.rank, rc.comm.get()); });
}

}  // namespace muster
