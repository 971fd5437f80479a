// A member that is not told its address is reached where the coordinator
// sees its call come from: gRPC's peer strings, read as a host peers dial.
#include "rpc/peer_address.h"

#include <gtest/gtest.h>

namespace muster {
namespace {

TEST(PeerAddressTest, IPv4PeersLoseOnlyThePort) {
  EXPECT_EQ(PeerHost("ipv4:10.1.2.3:41000"), "10.1.2.3");
  EXPECT_EQ(PeerHost("ipv4:127.0.0.1:5"), "127.0.0.1");
}

TEST(PeerAddressTest, IPv6PeersLoseTheirBracketsPlainOrPercentEncoded) {
  EXPECT_EQ(PeerHost("ipv6:[fd00::7]:41000"), "fd00::7");
  EXPECT_EQ(PeerHost("ipv6:%5B::1%5D:41000"), "::1");
  EXPECT_EQ(PeerHost("ipv6:[fe80::1%25eth0]:9"), "fe80::1");
}

TEST(PeerAddressTest, IPv4ThroughADualStackListenerIsPlainIPv4) {
  EXPECT_EQ(PeerHost("ipv6:[::ffff:10.1.2.3]:4"), "10.1.2.3");
  EXPECT_EQ(PeerHost("ipv6:%5B::FFFF:192.168.0.9%5D:4"), "192.168.0.9");
}

TEST(PeerAddressTest, AUnixSocketsCallerIsOnThisHost) {
  EXPECT_EQ(PeerHost("unix:/run/muster/agent.sock"), "127.0.0.1");
  EXPECT_EQ(PeerHost("unix-abstract:muster"), "127.0.0.1");
}

TEST(PeerAddressTest, AnythingElseIsUnknown) {
  EXPECT_EQ(PeerHost(""), "");
  EXPECT_EQ(PeerHost("ipv4:not-an-address:1"), "");
  EXPECT_EQ(PeerHost("ipv4:10.1.2.3"), "");
  EXPECT_EQ(PeerHost("ipv6:[fd00::7"), "");
  EXPECT_EQ(PeerHost("ipv6:[vm]:1"), "");
  EXPECT_EQ(PeerHost("vsock:3:1024"), "");
}

TEST(PeerAddressTest, HostAndPortJoinWithBracketsForIPv6) {
  EXPECT_EQ(JoinHostPort("10.1.2.3", "7000"), "10.1.2.3:7000");
  EXPECT_EQ(JoinHostPort("fd00::7", "7000"), "[fd00::7]:7000");
}

}  // namespace
}  // namespace muster
