#include "coordinator/membership.h"

#include <gtest/gtest.h>

#include "common/fake_clock.h"

namespace muster {
namespace {

JoinSpec Spec(const std::string& id, uint64_t inc, const std::string& node = "n0",
              uint32_t local = 0) {
  JoinSpec s;
  s.key = {id, inc};
  s.node = node;
  s.local_rank = local;
  return s;
}

TEST(MembershipTest, JoinReattachAndReplace) {
  FakeClock clock;
  Membership m{Limits{}};
  MemberInfo fenced;
  EXPECT_EQ(*m.Join(Spec("a", 1), clock.Now(), &fenced), JoinOutcome::kNew);
  EXPECT_EQ(*m.Join(Spec("a", 1, "n1"), clock.Now(), &fenced), JoinOutcome::kReattached);
  EXPECT_EQ(m.Find("a")->node, "n1");
  EXPECT_EQ(*m.Join(Spec("a", 2), clock.Now(), &fenced), JoinOutcome::kReplaced);
  EXPECT_EQ(fenced.key.incarnation, 1u);
  EXPECT_EQ(m.Find("a")->key.incarnation, 2u);
  EXPECT_EQ(m.size(), 1u);
}

TEST(MembershipTest, RejectsBadInput) {
  FakeClock clock;
  Limits limits;
  limits.max_members = 2;
  Membership m{limits};
  EXPECT_EQ(m.Join(Spec("", 1), clock.Now(), nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m.Join(Spec("a", 0), clock.Now(), nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto long_id = m.Join(Spec(std::string(129, 'x'), 1), clock.Now(), nullptr);
  EXPECT_EQ(long_id.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(long_id.status().message().find("member_id"), std::string::npos);
  EXPECT_EQ(m.Join(Spec("a", 1, ""), clock.Now(), nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(m.Join(Spec("a", 1), clock.Now(), nullptr).ok());
  ASSERT_TRUE(m.Join(Spec("b", 1), clock.Now(), nullptr).ok());
  EXPECT_EQ(m.Join(Spec("c", 1), clock.Now(), nullptr).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(m.size(), 2u);
}

TEST(MembershipTest, LiveTellsIncarnationsApart) {
  FakeClock clock;
  Membership m{Limits{}};
  ASSERT_TRUE(m.Join(Spec("a", 7), clock.Now(), nullptr).ok());
  EXPECT_TRUE(m.Live({"a", 7}).ok());
  EXPECT_EQ(m.Live({"a", 8}).status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(m.Live({"zz", 1}).status().code(), absl::StatusCode::kNotFound);
  m.Find("a")->state = MemberState::kFailed;
  EXPECT_EQ(m.Live({"a", 7}).status().code(), absl::StatusCode::kAborted);
  // A failed incarnation cannot come back; a new one can.
  EXPECT_EQ(m.Join(Spec("a", 7), clock.Now(), nullptr).status().code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(*m.Join(Spec("a", 9), clock.Now(), nullptr), JoinOutcome::kNew);
}

TEST(MembershipTest, ExpiredAndPrune) {
  FakeClock clock;
  Membership m{Limits{}};
  ASSERT_TRUE(m.Join(Spec("a", 1), clock.Now(), nullptr).ok());
  clock.Advance(absl::Seconds(3));
  ASSERT_TRUE(m.Join(Spec("b", 1), clock.Now(), nullptr).ok());
  clock.Advance(absl::Seconds(3));
  EXPECT_EQ(m.Expired(clock.Now(), absl::Seconds(5)), std::vector<std::string>{"a"});
  m.Find("a")->state = MemberState::kFailed;
  m.Find("b")->state = MemberState::kLeft;
  EXPECT_TRUE(m.Expired(clock.Now(), absl::Seconds(1)).empty());
  m.PruneEnded(1);
  EXPECT_EQ(m.size(), 1u);
  EXPECT_NE(m.Find("b"), nullptr);
}

}  // namespace
}  // namespace muster

namespace muster {
namespace {

// Expired walks members by their last sign of life: a heartbeat moves a
// member behind the others, a replaced or pruned member leaves the order,
// and an ended one is dropped from it as the walk passes it.
TEST(MembershipTest, ExpiredFollowsTheLastSignsOfLife) {
  FakeClock clock;
  Membership m{Limits{}};
  for (const char* id : {"a", "b", "c"}) {
    ASSERT_TRUE(m.Join(Spec(id, 1), clock.Now(), nullptr).ok());
    clock.Advance(absl::Seconds(1));
  }
  // a beats again: now b is the oldest.
  m.Seen(m.Find("a"), clock.Now());
  clock.Advance(absl::Seconds(1));
  EXPECT_EQ(m.Expired(clock.Now(), absl::Milliseconds(2500)), std::vector<std::string>{"b"});
  EXPECT_EQ(m.Expired(clock.Now(), absl::Milliseconds(1500)),
            (std::vector<std::string>{"b", "c"}));
  // b ends: never expired again; c is replaced by a new incarnation, which
  // is new.
  m.Find("b")->state = MemberState::kFailed;
  ASSERT_TRUE(m.Join(Spec("c", 2), clock.Now(), nullptr).ok());
  EXPECT_TRUE(m.Expired(clock.Now(), absl::Milliseconds(1500)).empty());
  clock.Advance(absl::Seconds(10));
  EXPECT_EQ(m.Expired(clock.Now(), absl::Seconds(5)), (std::vector<std::string>{"a", "c"}));
  m.PruneEnded(0);
  EXPECT_EQ(m.Find("b"), nullptr);
  EXPECT_EQ(m.Expired(clock.Now(), absl::Seconds(5)), (std::vector<std::string>{"a", "c"}));
}

}  // namespace
}  // namespace muster
