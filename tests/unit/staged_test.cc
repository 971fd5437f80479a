// Pipelined staging's chunking and ordering (trainer/comm/staged.h), with a
// StagingCopies that records what it is asked to do.
#include "trainer/comm/staged.h"
#include "trainer/comm/factory.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace muster {
namespace {

using ::testing::ElementsAre;

std::vector<std::string> Describe(const std::vector<StagedChunk>& chunks) {
  std::vector<std::string> out;
  for (const StagedChunk& c : chunks) out.push_back(absl::StrCat(c.offset, "+", c.bytes));
  return out;
}

TEST(PlanStagedChunksTest, CutsWholeElementsAndLeavesTheRestToTheLast) {
  EXPECT_THAT(Describe(PlanStagedChunks(40, 4, 16)), ElementsAre("0+16", "16+16", "32+8"));
  // 10 bytes a chunk is 2 floats of 4 bytes: chunks never split an element.
  EXPECT_THAT(Describe(PlanStagedChunks(20, 4, 10)), ElementsAre("0+8", "8+8", "16+4"));
  EXPECT_THAT(Describe(PlanStagedChunks(12, 2, 4)), ElementsAre("0+4", "4+4", "8+4"));
}

TEST(PlanStagedChunksTest, NoChunkOfZeroBytesAndOneWhenTheChunkIsNotSmaller) {
  EXPECT_TRUE(PlanStagedChunks(0, 4, 16).empty());
  EXPECT_THAT(Describe(PlanStagedChunks(40, 4, 0)), ElementsAre("0+40"));
  EXPECT_THAT(Describe(PlanStagedChunks(40, 4, 40)), ElementsAre("0+40"));
  EXPECT_THAT(Describe(PlanStagedChunks(40, 4, 1 << 20)), ElementsAre("0+40"));
}

TEST(PlanStagedChunksTest, AChunkSmallerThanAnElementStillHoldsOne) {
  EXPECT_THAT(Describe(PlanStagedChunks(24, 8, 3)), ElementsAre("0+8", "8+8", "16+8"));
}

TEST(StagingChunkBytesTest, KibibytesOrZeroForWholeBufferStaging) {
  EXPECT_EQ(StagingChunkBytes("1024"), 1024u * 1024u);
  EXPECT_EQ(StagingChunkBytes("0"), 0u);
  EXPECT_EQ(StagingChunkBytes(nullptr), 0u);
  EXPECT_EQ(StagingChunkBytes(""), 0u);
  EXPECT_EQ(StagingChunkBytes("64k"), 0u);
}

// Records each call as "in 0", "wait 0", "op 0", "out 0", "finish".
class RecordingCopies : public StagingCopies {
 public:
  std::vector<std::string> calls;
  int fail_wait = -1;  // WaitToHost of this chunk fails
  absl::StatusOr<void*> Begin(void*, size_t, size_t) override { return host; }
  absl::Status QueueToHost(size_t i, const StagedChunk&) override {
    calls.push_back(absl::StrCat("in ", i));
    return absl::OkStatus();
  }
  absl::Status WaitToHost(size_t i) override {
    calls.push_back(absl::StrCat("wait ", i));
    if (static_cast<int>(i) == fail_wait) return absl::UnavailableError("copy failed");
    return absl::OkStatus();
  }
  absl::Status QueueToBuffer(size_t i, const StagedChunk&) override {
    calls.push_back(absl::StrCat("out ", i));
    return absl::OkStatus();
  }
  absl::Status Finish() override {
    calls.push_back("finish");
    return absl::OkStatus();
  }
  char host[64] = {};
};

TEST(RunStagedChunksTest, QueuesEveryCopyInFirstThenReducesEachChunkAsItArrives) {
  RecordingCopies copies;
  const auto chunks = PlanStagedChunks(48, 4, 16);
  std::vector<size_t> offsets;
  ASSERT_TRUE(RunStagedChunks(chunks, copies.host, copies,
                              [&](void* h, const StagedChunk& c) {
                                offsets.push_back(static_cast<char*>(h) - copies.host);
                                copies.calls.push_back(absl::StrCat("op ", c.offset / 16));
                                return absl::OkStatus();
                              })
                  .ok());
  // Every chunk's copy in is queued before the first reduction, so copies
  // in run while chunks are reduced; each copy back is queued as soon as its
  // chunk is reduced, and nothing waits for the copies back.
  EXPECT_THAT(copies.calls, ElementsAre("in 0", "in 1", "in 2", "wait 0", "op 0", "out 0",
                                        "wait 1", "op 1", "out 1", "wait 2", "op 2", "out 2",
                                        "finish"));
  EXPECT_THAT(offsets, ElementsAre(0, 16, 32));
}

TEST(RunStagedChunksTest, AFailedReductionQueuesNothingMore) {
  RecordingCopies copies;
  const absl::Status s =
      RunStagedChunks(PlanStagedChunks(48, 4, 16), copies.host, copies,
                      [&](void*, const StagedChunk& c) {
                        copies.calls.push_back(absl::StrCat("op ", c.offset / 16));
                        return c.offset == 16 ? absl::AbortedError("peer left") : absl::OkStatus();
                      });
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(copies.calls, ElementsAre("in 0", "in 1", "in 2", "wait 0", "op 0", "out 0",
                                        "wait 1", "op 1"));
}

TEST(RunStagedChunksTest, AFailedCopyInStopsBeforeItsChunkIsReduced) {
  RecordingCopies copies;
  copies.fail_wait = 1;
  int ops = 0;
  const absl::Status s = RunStagedChunks(PlanStagedChunks(48, 4, 16), copies.host, copies,
                                         [&](void*, const StagedChunk&) {
                                           ++ops;
                                           return absl::OkStatus();
                                         });
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ops, 1);
  EXPECT_THAT(copies.calls, ElementsAre("in 0", "in 1", "in 2", "wait 0", "out 0", "wait 1"));
}

TEST(RunStagedChunksTest, HostCopiesCarryTheResultBack) {
  // The host StagingCopies of the CPU tests: what an op writes reaches the buffer.
  auto copies = NewHostStagingCopies();
  std::vector<float> buffer = {1, 2, 3, 4, 5};
  const auto chunks = PlanStagedChunks(buffer.size() * sizeof(float), sizeof(float), 8);
  absl::StatusOr<void*> host = copies->Begin(buffer.data(), buffer.size() * sizeof(float),
                                             chunks.size());
  ASSERT_TRUE(host.ok());
  ASSERT_TRUE(RunStagedChunks(chunks, *host, *copies,
                              [](void* h, const StagedChunk& c) {
                                float* f = static_cast<float*>(h);
                                for (size_t i = 0; i < c.bytes / sizeof(float); ++i) f[i] *= 10;
                                return absl::OkStatus();
                              })
                  .ok());
  EXPECT_THAT(buffer, ElementsAre(10, 20, 30, 40, 50));
}

}  // namespace
}  // namespace muster
