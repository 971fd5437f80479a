// TLS and mutual TLS with certificates made by the openssl command line.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>

#include "coordinator/server.h"
#include "relay/relay.h"
#include "rpc/credentials.h"
#include "muster/v1/coordinator.grpc.pb.h"

namespace muster {
namespace {

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(::testing::TempDir() + "/tls" + std::to_string(::getpid()));
    const std::string d = *dir_;
    const std::string script =
        "set -e; mkdir -p " + d + "; cd " + d + ";"
        "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 1 "
        "-subj /CN=muster-test-ca 2>/dev/null;"
        "for n in server client; do "
        "openssl req -newkey rsa:2048 -nodes -keyout $n.key -out $n.csr -subj /CN=localhost "
        "2>/dev/null;"
        "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1' > $n.ext;"
        "openssl x509 -req -in $n.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out $n.pem "
        "-days 1 -extfile $n.ext 2>/dev/null; done";
    available_ = std::system(script.c_str()) == 0;
  }

  void SetUp() override {
    if (!available_) GTEST_SKIP() << "openssl could not make test certificates";
  }

  grpc::Status Status(int port, const TlsFiles& client, const std::string& token = "t") {
    grpc::ChannelArguments args;
    args.SetSslTargetNameOverride("localhost");
    auto creds = MakeChannelCredentials(client);
    EXPECT_TRUE(creds.ok());
    auto channel = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port), *creds, args);
    auto stub = v1::Coordinator::NewStub(channel);
    grpc::ClientContext ctx;
    AttachToken(&ctx, token);
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    v1::GetStatusResponse resp;
    return stub->GetStatus(&ctx, v1::GetStatusRequest(), &resp);
  }

  static std::string P(const std::string& f) { return *dir_ + "/" + f; }
  static std::string* dir_;
  static bool available_;
};

std::string* TlsTest::dir_ = nullptr;
bool TlsTest::available_ = false;

TEST_F(TlsTest, TlsWithTokenServesAndRejectsWrongToken) {
  ServerOptions o;
  o.token = "t";
  o.tls = {P("server.pem"), P("server.key"), ""};
  auto server = std::move(CoordinatorServer::Start(o)).value();
  EXPECT_TRUE(Status(server->port(), {"", "", P("ca.pem")}).ok());
  EXPECT_EQ(Status(server->port(), {"", "", P("ca.pem")}, "bad").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  // A plain-text client cannot talk to a TLS server.
  EXPECT_FALSE(Status(server->port(), {}).ok());
}

TEST_F(TlsTest, MutualTlsRequiresAClientCertificate) {
  ServerOptions o;
  o.token = "t";
  o.tls = {P("server.pem"), P("server.key"), P("ca.pem")};
  auto server = std::move(CoordinatorServer::Start(o)).value();
  EXPECT_TRUE(Status(server->port(), {P("client.pem"), P("client.key"), P("ca.pem")}).ok());
  EXPECT_FALSE(Status(server->port(), {"", "", P("ca.pem")}).ok());
}

// A relay serves TLS to its callers (requiring their certificates) and
// reaches a mutual-TLS coordinator with a certificate of its own.
TEST_F(TlsTest, ARelayServesTlsAndShowsItsOwnCertificateToTheCoordinator) {
  ServerOptions o;
  o.token = "t";
  o.tls = {P("server.pem"), P("server.key"), P("ca.pem")};
  auto server = std::move(CoordinatorServer::Start(o)).value();
  RelayOptions r;
  r.listen = "127.0.0.1:0";
  r.coordinator = "127.0.0.1:" + std::to_string(server->port());
  r.tls = {P("server.pem"), P("server.key"), P("ca.pem")};
  r.coordinator_tls = {P("client.pem"), P("client.key"), P("ca.pem")};
  auto relay = std::move(Relay::Start(r)).value();
  const TlsFiles client = {P("client.pem"), P("client.key"), P("ca.pem")};
  EXPECT_TRUE(Status(relay->port(), client).ok());
  EXPECT_EQ(Status(relay->port(), client, "bad").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_FALSE(Status(relay->port(), {"", "", P("ca.pem")}).ok());  // no certificate
  // A relay without a certificate of its own is refused by the coordinator.
  r.coordinator_tls = {"", "", P("ca.pem")};
  auto anonymous = std::move(Relay::Start(r)).value();
  EXPECT_EQ(Status(anonymous->port(), client).error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST(TlsOptionsTest, HalfConfiguredTlsIsAnError) {
  EXPECT_EQ(MakeServerCredentials({"cert.pem", "", ""}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeServerCredentials({"/nonexistent.pem", "/nonexistent.key", ""}).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace muster
