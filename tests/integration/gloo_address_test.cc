// Addresses are checked before Debian's Gloo sees them: a host name that
// does not resolve used to crash every trainer inside CreateDeviceAttr.
#include "trainer/comm/gloo/gloo_address.h"

#include <gtest/gtest.h>

#include "absl/time/clock.h"
#include "trainer/comm/gloo/gloo_communicator.h"

namespace muster {
namespace {

constexpr char kNowhere[] = "no-such-host.invalid";  // RFC 6761: never resolves

TEST(GlooAddressTest, AnUnresolvableNameOnOneHostFallsBackToLoopback) {
  absl::StatusOr<GlooAddress> a = ResolveGlooAddress("", kNowhere, /*single_host=*/true);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->ip, "127.0.0.1");
  EXPECT_TRUE(a->warning.empty());
}

TEST(GlooAddressTest, AnUnresolvableNameWithRemotePeersNamesTheNameAndTheFlag) {
  absl::StatusOr<GlooAddress> a = ResolveGlooAddress("", kNowhere, /*single_host=*/false);
  ASSERT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument) << a.status();
  EXPECT_NE(a.status().message().find(kNowhere), std::string::npos) << a.status();
  EXPECT_NE(a.status().message().find("--address"), std::string::npos) << a.status();
  // The configured address is named as such.
  a = ResolveGlooAddress(kNowhere, "vm", /*single_host=*/false);
  EXPECT_NE(a.status().message().find("the configured address"), std::string::npos);
}

TEST(GlooAddressTest, LoopbackWithRemotePeersIsNumericAndWarned) {
  absl::StatusOr<GlooAddress> a = ResolveGlooAddress("127.0.1.1", "vm", /*single_host=*/false);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->ip, "127.0.1.1");
  EXPECT_NE(a->warning.find("loopback"), std::string::npos) << a->warning;
  EXPECT_NE(a->warning.find("--address"), std::string::npos) << a->warning;
  a = ResolveGlooAddress("localhost", "vm", /*single_host=*/true);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->warning.empty());
}

TEST(GlooAddressTest, GlooGetsAClearErrorInsteadOfAnUnresolvableName) {
  GlooOptions o;
  o.hostname = kNowhere;
  auto refused = NewGlooCommunicator(nullptr, 0, 1, o, absl::Now() + absl::Seconds(5));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  o.single_host = true;
  auto local = NewGlooCommunicator(nullptr, 0, 1, o, absl::Now() + absl::Seconds(5));
  EXPECT_TRUE(local.ok()) << local.status();
}

}  // namespace
}  // namespace muster
