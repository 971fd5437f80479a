// Abort and rebuild, with ranks as threads: a collective blocked on a rank
// that never joins it returns promptly after Abort(); the communicator is
// rebuilt many times without leaking file descriptors, threads or shared
// memory.
#include <dirent.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "absl/strings/str_join.h"
#include "tests/integration/comm_harness.h"
#include "trainer/client/coordinator_client.h"
#include "trainer/comm/shm/shm_communicator.h"

namespace muster {
namespace {

int CountEntries(const char* dir) {
  int n = 0;
  if (DIR* d = ::opendir(dir)) {
    while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
    ::closedir(d);
  }
  return n;
}

// The (lower) median of the changes from round to round of `counts` after
// round 1 (round 0 warms up). A leak adds something every round; gRPC's
// pool steps up or down by a few threads now and then (three at once on a
// loaded machine, and staying there), which leaves the median at 0 unless
// most rounds grew.
int MedianStep(const std::vector<int>& counts) {
  std::vector<int> steps;
  for (size_t i = 2; i < counts.size(); ++i) steps.push_back(counts[i] - counts[i - 1]);
  std::sort(steps.begin(), steps.end());
  return steps[(steps.size() - 1) / 2];
}

TEST(MedianStepTest, APoolThatGrewOnceIsNoLeakAndASteadyClimbIs) {
  EXPECT_EQ(MedianStep({23, 23, 23, 26, 26, 26, 26, 26}), 0);  // a loaded run's threads
  EXPECT_EQ(MedianStep({20, 21, 19, 22, 22, 25, 22, 23}), 0);
  EXPECT_EQ(MedianStep({20, 22, 24, 26, 28, 30, 32, 34}), 2);  // two blocked ranks leaking
  EXPECT_EQ(MedianStep({20, 22, 24, 29, 28, 30, 32, 34}), 2);
  EXPECT_EQ(MedianStep({20, 20, 21, 22, 23, 24, 25, 26}), 1);  // one thread a round
}

class AbortTest : public ::testing::TestWithParam<std::pair<Backend, NodeSplit>> {};

TEST_P(AbortTest, BlockedCollectiveReturnsSoonAfterAbortAndRebuildsWithoutLeaks) {
  const auto& [backend, split] = GetParam();
  const std::string job = absl::StrCat("abort", ::getpid(), "_", static_cast<int>(backend));
  CommHarness h(split, job);
  const int w = static_cast<int>(split.size());
  CommOptions o;
  o.backend = backend;
  o.clock = RealClock::Get();
  std::vector<int> fds, threads;
  // The first round warms up gRPC and Gloo. gRPC's own thread pool then
  // grows and shrinks by a few threads from round to round, so a leak is told
  // from that noise by its trend: a leak adds at least one thread or
  // descriptor per blocked rank every round.
  constexpr int kRounds = 8;
  for (int round = 0; round < kRounds; ++round) {
    std::atomic<int> returned{0};
    std::vector<absl::Duration> after_abort(w);
    std::vector<absl::Status> results(w);
    ASSERT_TRUE(h.Run(o, [&](RankContext& rc) {
      // Rebuild inside this generation under a fresh prefix.
      auto store = NewPrefixStore(rc.store.get(), absl::StrCat("round", round));
      WorldInfo world = rc.world;
      CommOptions ro = o;
      ro.job = job;
      ro.gloo.hostname = "127.0.0.1";
      auto comm = BuildCommunicator(world, store.get(), ro, absl::Now() + absl::Seconds(30));
      ASSERT_TRUE(comm.ok()) << comm.status();
      std::vector<float> data(1 << 20, 1.0f);
      ASSERT_TRUE((*comm)->AllReduce(data.data(), data.size(), DataType::kFloat32,
                                     ReduceOp::kSum, absl::Now() + absl::Seconds(30)).ok());
      ASSERT_EQ(data[12345], static_cast<float>(w));
      if (rc.world.rank == w - 1) {
        // The "hung" rank never joins the next collective but keeps its
        // connections open until the others returned.
        const absl::Time give_up = absl::Now() + absl::Seconds(20);
        while (returned.load() < w - 1 && absl::Now() < give_up) {
          absl::SleepFor(absl::Milliseconds(10));
        }
        return;
      }
      absl::Time abort_at;
      std::thread aborter([&, c = comm->get()] {
        absl::SleepFor(absl::Milliseconds(300));
        abort_at = absl::Now();
        c->Abort(absl::AbortedError("peer declared failed"));
      });
      const absl::Status s = (*comm)->AllReduce(data.data(), data.size(), DataType::kFloat32,
                                                ReduceOp::kSum, absl::Now() + absl::Seconds(60));
      const absl::Time back = absl::Now();
      aborter.join();
      results[rc.world.rank] = s;
      after_abort[rc.world.rank] = back - abort_at;
      ++returned;
    }).ok());
    EXPECT_EQ(returned.load(), w - 1);
    for (int r = 0; r + 1 < w; ++r) {
      EXPECT_EQ(results[r].code(), absl::StatusCode::kAborted) << "rank " << r << results[r];
      EXPECT_LT(after_abort[r], absl::Seconds(2)) << "rank " << r;
    }
    absl::SleepFor(absl::Milliseconds(500));  // Gloo's background release
    fds.push_back(CountEntries("/proc/self/fd"));
    threads.push_back(CountEntries("/proc/self/task"));
    EXPECT_TRUE(ListShmSegments(job).empty());
  }
  // A leak grows the counts every round: a median step of 1 or more.
  EXPECT_LE(MedianStep(fds), 0) << "file descriptors leak: " << absl::StrJoin(fds, " ");
  EXPECT_LE(MedianStep(threads), 0) << "threads leak: " << absl::StrJoin(threads, " ");
}

INSTANTIATE_TEST_SUITE_P(Backends, AbortTest,
                         ::testing::Values(std::make_pair(Backend::kShm, NodeSplit{0, 0, 0}),
                                           std::make_pair(Backend::kGloo, NodeSplit{0, 1, 2}),
                                           std::make_pair(Backend::kHier,
                                                          NodeSplit{0, 0, 1, 1})));

// The reduce-scatters of Gloo (an all-to-all) and of the hierarchical
// communicator (by columns) keep their all-reduce's contracts: with the
// last rank never joining, a deadline alone ends the call as
// DEADLINE_EXCEEDED on every waiting rank, and an Abort as ABORTED within
// two seconds; the communicator is broken afterwards.
class ReduceScatterStopsTest : public ::testing::TestWithParam<std::pair<Backend, NodeSplit>> {};

TEST_P(ReduceScatterStopsTest, AtItsDeadlineAndOnAbort) {
  const auto& [backend, split] = GetParam();
  const int w = static_cast<int>(split.size());
  for (bool abort : {false, true}) {
    CommHarness h(split, absl::StrCat("rsstop", ::getpid(), "_", abort));
    CommOptions o;
    o.backend = backend;
    std::atomic<int> returned{0};
    ASSERT_TRUE(h.Run(o, [&](RankContext& rc) {
      if (rc.world.rank == w - 1) {  // never joins, keeps its connections open
        const absl::Time give_up = absl::Now() + absl::Seconds(20);
        while (returned.load() < w - 1 && absl::Now() < give_up) {
          absl::SleepFor(absl::Milliseconds(10));
        }
        return;
      }
      std::vector<size_t> counts(w, 1 << 16);
      std::vector<float> data(TotalCount(counts), 1.0f);
      std::thread aborter([&, c = rc.comm.get()] {
        absl::SleepFor(absl::Milliseconds(300));
        if (abort) c->Abort(absl::AbortedError("peer declared failed"));
      });
      const absl::Time start = absl::Now();
      const absl::Time deadline = start + (abort ? absl::Seconds(60) : absl::Seconds(1));
      const absl::Status s = rc.comm->ReduceScatter(data.data(), counts, DataType::kFloat32,
                                                    ReduceOp::kSum, deadline);
      const absl::Duration took = absl::Now() - start;
      aborter.join();
      ++returned;
      EXPECT_EQ(s.code(), abort ? absl::StatusCode::kAborted : absl::StatusCode::kDeadlineExceeded)
          << rc.comm->name() << " rank " << rc.world.rank << ": " << s;
      EXPECT_LT(took, absl::Seconds(3)) << rc.comm->name() << " rank " << rc.world.rank;
      EXPECT_FALSE(rc.comm->Barrier(absl::Now() + absl::Seconds(1)).ok());
    }).ok());
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, ReduceScatterStopsTest,
                         ::testing::Values(std::make_pair(Backend::kGloo, NodeSplit{0, 1, 2}),
                                           std::make_pair(Backend::kHier,
                                                          NodeSplit{0, 0, 1, 1})));

TEST(ShmDeadlineTest, DeadlineWithoutAbortIsDeadlineExceeded) {
  CommHarness h({0, 0}, "deadline" + std::to_string(::getpid()));
  CommOptions o;
  o.backend = Backend::kShm;
  ASSERT_TRUE(h.Run(o, [](RankContext& rc) {
    if (rc.world.rank == 1) return;
    std::vector<float> data(1000, 1.0f);
    const absl::Time start = absl::Now();
    absl::Status s = rc.comm->AllReduce(data.data(), data.size(), DataType::kFloat32,
                                        ReduceOp::kSum, absl::Now() + absl::Milliseconds(300));
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_LT(absl::Now() - start, absl::Seconds(2));
    // Broken afterwards.
    EXPECT_FALSE(rc.comm->Barrier(absl::Now() + absl::Seconds(1)).ok());
  }).ok());
}

// A member that learns of a newer world while its node's peers attach to
// the shared memory of the older one gives up on it at once: the peer that
// learnt first never attaches, and waiting for the build's deadline left
// the member stuck (or, past its watchdog, exiting) while the world moved on.
TEST(ShmBuildTest, AMemberAttachingToAnOverGenerationGivesUpWithAborted) {
  ServerOptions so;
  so.coordinator.rules.min_members = 2;
  so.coordinator.rules.max_members = 3;
  so.coordinator.rules.last_call = absl::ZeroDuration();
  so.coordinator.heartbeat_interval = absl::Milliseconds(200);
  so.coordinator.heartbeat_timeout = absl::Seconds(30);
  auto server = std::move(CoordinatorServer::Start(so)).value();
  auto member = [&](int i) {
    ClientOptions co;
    co.target = absl::StrCat("127.0.0.1:", server->port());
    co.member_id = absl::StrCat("m", i);
    co.node = "node0";
    co.local_rank = static_cast<uint32_t>(i);
    co.clock = RealClock::Get();
    auto client = std::move(CoordinatorClient::Create(co)).value();
    EXPECT_TRUE(client->Join(0, RealClock::Get()->Now() + absl::Seconds(10)).ok());
    EXPECT_TRUE(client->StartSession([](const SessionNotice&) {}).ok());
    return client;
  };
  std::unique_ptr<CoordinatorClient> m0 = member(0);
  std::unique_ptr<CoordinatorClient> m1 = member(1);
  absl::StatusOr<WorldInfo> w0, w1;
  std::thread t1([&] { w1 = m1->Rendezvous(0, 0, RealClock::Get()->Now() + absl::Seconds(10)); });
  w0 = m0->Rendezvous(0, 0, RealClock::Get()->Now() + absl::Seconds(10));
  t1.join();
  ASSERT_TRUE(w0.ok()) << w0.status();
  ASSERT_TRUE(w1.ok()) << w1.status();
  ASSERT_EQ(w0->world_size, 2);
  // m0 builds the node's shared memory; m1 never attaches (it moved on).
  CommOptions o;
  o.backend = Backend::kShm;
  o.job = absl::StrCat("over", ::getpid());
  o.clock = RealClock::Get();
  auto store = NewCoordinatorStore(m0.get(), w0->generation);
  absl::StatusOr<std::unique_ptr<Communicator>> built;
  const absl::Time start = RealClock::Get()->Now();
  std::thread build([&] {
    built = BuildCommunicator(*w0, store.get(), o, RealClock::Get()->Now() + absl::Seconds(20));
  });
  // A third member arrives: the coordinator forms generation 2.
  absl::SleepFor(absl::Milliseconds(300));
  std::unique_ptr<CoordinatorClient> m2 = member(2);
  std::thread t2([&] { m2->Rendezvous(0, 0, RealClock::Get()->Now() + absl::Seconds(2)).IgnoreError(); });
  std::thread t1b([&] {
    m1->Rendezvous(w1->generation, 0, RealClock::Get()->Now() + absl::Seconds(2)).IgnoreError();
  });
  build.join();
  const absl::Duration took = RealClock::Get()->Now() - start;
  t2.join();
  t1b.join();
  EXPECT_GT(m0->latest_generation(), w0->generation);
  ASSERT_FALSE(built.ok());
  EXPECT_EQ(built.status().code(), absl::StatusCode::kAborted) << built.status();
  EXPECT_LT(took, absl::Seconds(10)) << built.status();
  EXPECT_TRUE(ListShmSegments(o.job).empty());
}

}  // namespace
}  // namespace muster
