#include "trainer/checkpoint/safetensors.h"

#include <unistd.h>

#include <cstring>

#include <gtest/gtest.h>

namespace muster {
namespace {

std::string Temp(const std::string& name) {
  return ::testing::TempDir() + "/" + name + std::to_string(::getpid());
}

TEST(SafetensorsTest, RoundTripEveryDtypeAndShape) {
  std::vector<float> f32 = {1.5f, -2.0f, 3.25f, 0.0f, 5.0f, 6.0f};
  std::vector<double> f64 = {1e300, -1e-300};
  std::vector<int64_t> i64 = {-1, 0, 1LL << 40};
  std::vector<uint16_t> f16 = {0x3c00, 0xc000, 0x7bff};
  std::vector<uint16_t> bf16 = {0x3f80, 0xbf80};
  std::vector<uint8_t> u8 = {0, 255, 7};
  const float scalar = 42.0f;
  std::vector<TensorRef> refs = {
      {"f32", "F32", {2, 3}, f32.data()},  {"f64", "F64", {2}, f64.data()},
      {"i64", "I64", {3}, i64.data()},     {"f16", "F16", {1, 3}, f16.data()},
      {"bf16", "BF16", {2, 1}, bf16.data()}, {"u8", "U8", {3}, u8.data()},
      {"scalar", "F32", {}, &scalar},      {"empty", "F32", {0, 4}, nullptr}};
  const std::string path = Temp("rt.safetensors");
  auto written = WriteSafetensors(DefaultFileSystem(), path, refs, {{"step", "12"}});
  ASSERT_TRUE(written.ok()) << written.status();
  auto bytes = DefaultFileSystem()->ReadFile(path, 1 << 20);
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(bytes->size(), written->bytes);
  EXPECT_EQ(Xxh3Hex(bytes->data(), bytes->size()), written->xxh3);
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes->data(), 8);
  EXPECT_EQ(header_len % 8, 0u);
  auto parsed = ParseSafetensors(*bytes, path);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->metadata.at("step"), "12");
  EXPECT_EQ(parsed->tensors.at("f32").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(std::memcmp(parsed->tensors.at("f32").data, f32.data(), 24), 0);
  EXPECT_EQ(std::memcmp(parsed->tensors.at("i64").data, i64.data(), 24), 0);
  EXPECT_EQ(std::memcmp(parsed->tensors.at("bf16").data, bf16.data(), 4), 0);
  EXPECT_EQ(parsed->tensors.at("scalar").shape.size(), 0u);
  EXPECT_EQ(parsed->tensors.at("empty").size, 0u);
  EXPECT_EQ(parsed->tensors.at("f16").dtype, "F16");
}

std::string File(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return out + header + data;
}

TEST(SafetensorsTest, DamagedFilesNameTheFileAndTheField) {
  struct Case {
    std::string bytes;
    std::string expect;
  } cases[] = {
      {"abc", "too short"},
      {File("{", ""), "not a JSON object"},
      {std::string("\xff\xff\xff\xff\xff\xff\x00\x00", 8) + "{}", "header length"},
      {File(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", "1234"), "past the end"},
      {File(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", "12345678"), "shape needs 12"},
      {File(R"({"w":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})", "12345678"), "unknown dtype"},
      {File(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", "12345678"), "negative"},
      {File(R"({"w":{"dtype":"F32","shape":[2]}})", "12345678"), "data_offsets"},
      // 2^62 x 4 elements of 4 bytes wrap to 0 bytes in 64 bits (found by
      // tests/fuzz/safetensors_fuzz).
      {File(R"({"w":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}})", ""),
       "overflows"},
  };
  for (const Case& c : cases) {
    auto r = ParseSafetensors(c.bytes, "/ckpt/model.safetensors");
    ASSERT_FALSE(r.ok()) << c.expect;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(r.status().message().find("/ckpt/model.safetensors"), std::string::npos);
    EXPECT_NE(r.status().message().find(c.expect), std::string::npos) << r.status();
  }
}

}  // namespace
}  // namespace muster
