// Addresses are checked before Debian's Gloo sees them: a host name that
// does not resolve used to crash every trainer inside CreateDeviceAttr.
#include "trainer/comm/gloo/gloo_address.h"

#include <gtest/gtest.h>

#include "absl/time/clock.h"
#include "common/clock.h"
#include "trainer/comm/gloo/gloo_communicator.h"

namespace muster {
namespace {

constexpr char kNowhere[] = "no-such-host.invalid";  // RFC 6761: never resolves

TEST(GlooAddressTest, AnUnresolvableNameOnOneHostFallsBackToLoopback) {
  absl::StatusOr<GlooAddress> a = ResolveGlooAddress({"", "", kNowhere}, /*single_host=*/true);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->ip, "127.0.0.1");
  EXPECT_TRUE(a->warning.empty());
}

TEST(GlooAddressTest, AnUnresolvableNameWithRemotePeersNamesTheNameAndTheFlag) {
  absl::StatusOr<GlooAddress> a = ResolveGlooAddress({"", "", kNowhere}, /*single_host=*/false);
  ASSERT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument) << a.status();
  EXPECT_NE(a.status().message().find(kNowhere), std::string::npos) << a.status();
  EXPECT_NE(a.status().message().find("--address"), std::string::npos) << a.status();
  // The configured address is named as such.
  a = ResolveGlooAddress({kNowhere, "", "vm"}, /*single_host=*/false);
  EXPECT_NE(a.status().message().find("the configured address"), std::string::npos);
}

// A failed connect names the loopback address behind it: this rank's, or a
// peer's that Gloo's error shows; nothing is added otherwise.
TEST(GlooAddressTest, AFailedConnectExplainsALoopbackAddress) {
  const std::string refused =
      "[./gloo/transport/tcp/pair.cc:799] connect [127.0.1.1]:41923: Connection refused";
  const GlooAddress own_loopback = *ResolveGlooAddress({"127.0.1.1", "", "vm"}, /*single_host=*/false);
  std::string hint = LoopbackHint("Timed out", own_loopback);
  EXPECT_NE(hint.find("this rank gave its peers the loopback address 127.0.1.1"),
            std::string::npos)
      << hint;
  EXPECT_NE(hint.find("--address"), std::string::npos) << hint;
  const GlooAddress own_remote{"10.1.2.3", ""};
  hint = LoopbackHint(refused, own_remote);
  EXPECT_NE(hint.find("a peer gave a loopback address"), std::string::npos) << hint;
  EXPECT_NE(hint.find("--address"), std::string::npos) << hint;
  EXPECT_EQ(LoopbackHint("connect [10.1.2.4]:41923: Connection refused", own_remote), "");
  // Every rank on one host: loopback is right, and no hint misleads.
  const GlooAddress one_host = *ResolveGlooAddress({"", "", "no-such-host.invalid"}, true);
  EXPECT_EQ(LoopbackHint(refused, one_host), "");
}

TEST(GlooAddressTest, LoopbackWithRemotePeersIsNumericAndWarned) {
  absl::StatusOr<GlooAddress> a = ResolveGlooAddress({"127.0.1.1", "", "vm"}, /*single_host=*/false);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->ip, "127.0.1.1");
  EXPECT_NE(a->warning.find("loopback"), std::string::npos) << a->warning;
  EXPECT_NE(a->warning.find("--address"), std::string::npos) << a->warning;
  a = ResolveGlooAddress({"localhost", "", "vm"}, /*single_host=*/true);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->warning.empty());
}

// Without an address of its own, a rank takes the one the coordinator sees
// it at, before this host's name (which need not resolve); one it is told
// comes first.
TEST(GlooAddressTest, TheCoordinatorsViewComesAfterTheConfiguredAddressAndBeforeTheName) {
  absl::StatusOr<GlooAddress> a = ResolveGlooAddress({"", "10.9.8.7", kNowhere}, false);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->ip, "10.9.8.7");
  EXPECT_TRUE(a->warning.empty()) << a->warning;
  a = ResolveGlooAddress({"10.1.1.1", "10.9.8.7", kNowhere}, false);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->ip, "10.1.1.1");
  // Seen at loopback while peers are elsewhere: the warning says where it
  // came from and what to change.
  a = ResolveGlooAddress({"", "127.0.0.1", kNowhere}, false);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->ip, "127.0.0.1");
  EXPECT_NE(a->warning.find("the coordinator sees this host at the loopback address 127.0.0.1"),
            std::string::npos)
      << a->warning;
  EXPECT_NE(a->warning.find("--address"), std::string::npos) << a->warning;
}

TEST(GlooAddressTest, GlooGetsAClearErrorInsteadOfAnUnresolvableName) {
  GlooOptions o;
  o.hostname = kNowhere;
  o.clock = RealClock::Get();
  auto refused = NewGlooCommunicator(nullptr, 0, 1, o, absl::Now() + absl::Seconds(5));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  o.single_host = true;
  auto local = NewGlooCommunicator(nullptr, 0, 1, o, absl::Now() + absl::Seconds(5));
  EXPECT_TRUE(local.ok()) << local.status();
}

}  // namespace
}  // namespace muster
