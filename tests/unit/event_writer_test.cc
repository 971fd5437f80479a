#include "trainer/elastic/event_writer.h"

#include <fstream>
#include <sstream>
#include <cstring>

#include <gtest/gtest.h>

#include "common/fake_clock.h"

namespace muster {
namespace {

TEST(Crc32cTest, KnownVector) {
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);
}

TEST(EventWriterTest, RecordsAreFramedWithValidChecksums) {
  const std::string dir = ::testing::TempDir();
  std::string path;
  {
    FakeClock clock;
    auto w = EventWriter::Create(dir, &clock);
    ASSERT_TRUE(w.ok()) << w.status();
    (*w)->Scalar("train/loss", 0.5f, 3, 1700000000.0);
    path = (*w)->path();
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string bytes = ss.str();
  size_t pos = 0;
  int records = 0;
  while (pos < bytes.size()) {
    ASSERT_GE(bytes.size() - pos, 12u);
    uint64_t len;
    std::memcpy(&len, bytes.data() + pos, 8);
    uint32_t len_crc;
    std::memcpy(&len_crc, bytes.data() + pos + 8, 4);
    const uint32_t c = Crc32c(bytes.data() + pos, 8);
    EXPECT_EQ(len_crc, ((c >> 15) | (c << 17)) + 0xa282ead8u);
    pos += 12 + len + 4;
    ++records;
  }
  EXPECT_EQ(pos, bytes.size());
  EXPECT_EQ(records, 2);  // file version + one scalar
  EXPECT_NE(bytes.find("train/loss"), std::string::npos);
}

// The file is named for the given clock's wall time, a record.
TEST(EventWriterTest, TheFileNameCarriesTheClocksWallTime) {
  FakeClock clock(absl::FromUnixSeconds(1'600'000'000));
  clock.StepWall(absl::Seconds(42));  // the wall reading, not Now()
  auto w = EventWriter::Create(::testing::TempDir(), &clock);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_NE((*w)->path().find("/events.out.tfevents.1600000042."), std::string::npos)
      << (*w)->path();
}

}  // namespace
}  // namespace muster
