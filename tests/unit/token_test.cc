#include "common/token.h"

#include <sys/stat.h>

#include <cstdio>
#include <fstream>

#include <gtest/gtest.h>

namespace muster {
namespace {

std::string WriteFile(const std::string& name, const std::string& content, mode_t mode) {
  std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << content;
  ::chmod(path.c_str(), mode);
  return path;
}

TEST(TokenTest, ReadsPrivateFileAndTrims) {
  auto t = ReadTokenFile(WriteFile("tok1", "  secret\n", 0600));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t, "secret");
}

TEST(TokenTest, RejectsOpenPermissionsEmptyAndMissing) {
  auto open = ReadTokenFile(WriteFile("tok2", "secret", 0644));
  EXPECT_EQ(open.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(open.status().message().find("644"), std::string::npos);
  EXPECT_EQ(ReadTokenFile(WriteFile("tok3", " \n", 0600)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadTokenFile("/nonexistent/token").status().code(), absl::StatusCode::kNotFound);
}

TEST(TokenTest, ConstantTimeEquals) {
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abcd"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
}

}  // namespace
}  // namespace muster
