// Coordinator targets: a list of addresses tried in turn (a relay, then the
// coordinator itself), over real channels to ports where nothing listens.
#include "rpc/coordinator_channel.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/integration/subprocess.h"

namespace muster {
namespace {

// Until the channel's connection attempt failed.
bool FailsToConnect(const std::shared_ptr<grpc::Channel>& channel) {
  const absl::Time end = absl::Now() + absl::Seconds(10);
  grpc_connectivity_state state = channel->GetState(/*try_to_connect=*/true);
  while (state != GRPC_CHANNEL_TRANSIENT_FAILURE && absl::Now() < end) {
    channel->WaitForStateChange(state, absl::ToChronoTime(absl::Now() + absl::Milliseconds(100)));
    state = channel->GetState(/*try_to_connect=*/true);
  }
  return state == GRPC_CHANNEL_TRANSIENT_FAILURE;
}

TEST(CoordinatorChannelTest, AListResolvesToItsFirstEntry) {
  EXPECT_EQ(*ResolveCoordinator("10.0.0.1:1, 10.0.0.2:2"), "10.0.0.1:1");
  EXPECT_EQ(*ResolveCoordinator("10.0.0.1:1"), "10.0.0.1:1");
}

TEST(CoordinatorChannelTest, AnEmptyEntryIsRefusedByName) {
  absl::StatusOr<std::unique_ptr<CoordinatorChannel>> c =
      CoordinatorChannel::Create("10.0.0.1:1,,10.0.0.2:2", {});
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(c.status()));
  EXPECT_NE(c.status().message().find("10.0.0.1:1,,10.0.0.2:2"), std::string::npos);
}

TEST(CoordinatorChannelTest, AnEntryThatCannotBeReachedGivesWayToTheNext) {
  const std::string first = absl::StrCat("127.0.0.1:", FreeLoopbackPort());
  const std::string second = absl::StrCat("127.0.0.1:", FreeLoopbackPort());
  auto c = CoordinatorChannel::Create(first + "," + second, {});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->address(), first);
  EXPECT_FALSE((*c)->Refresh());  // not tried yet: it stays
  ASSERT_TRUE(FailsToConnect((*c)->get()));
  EXPECT_TRUE((*c)->Refresh());
  EXPECT_EQ((*c)->address(), second);
  ASSERT_TRUE(FailsToConnect((*c)->get()));
  EXPECT_TRUE((*c)->Refresh());  // after the last, the first again
  EXPECT_EQ((*c)->address(), first);
}

TEST(CoordinatorChannelTest, AnEntryThatDoesNotAnswerGivesWayWhenToldSo) {
  auto c = CoordinatorChannel::Create("10.0.0.1:1,10.0.0.2:2", {});
  ASSERT_TRUE(c.ok()) << c.status();
  (*c)->MoveOn();
  EXPECT_TRUE((*c)->Refresh());
  EXPECT_EQ((*c)->address(), "10.0.0.2:2");
  EXPECT_FALSE((*c)->Refresh());  // once
  auto single = CoordinatorChannel::Create("10.0.0.1:1", {});
  (*single)->MoveOn();
  EXPECT_FALSE((*single)->Refresh());
}

TEST(CoordinatorChannelTest, ASilentEntryGivesWayButTheLastDoesNotWrapToTheFirst) {
  auto c = CoordinatorChannel::Create("10.0.0.1:1,10.0.0.2:2", {});
  ASSERT_TRUE(c.ok()) << c.status();
  (*c)->MoveOn(/*wrap=*/false);  // the relay went silent: on to the coordinator
  EXPECT_TRUE((*c)->Refresh());
  EXPECT_EQ((*c)->address(), "10.0.0.2:2");
  (*c)->MoveOn(/*wrap=*/false);  // the coordinator went silent: no way round it
  EXPECT_FALSE((*c)->Refresh());
  EXPECT_EQ((*c)->address(), "10.0.0.2:2");
  (*c)->MoveOn();  // a handshake with no answer: round to the first again
  EXPECT_TRUE((*c)->Refresh());
  EXPECT_EQ((*c)->address(), "10.0.0.1:1");
}

}  // namespace
}  // namespace muster
