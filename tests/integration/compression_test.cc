// Gradient compression over real communicators (ranks as threads against an
// in-process coordinator; shared memory and Gloo over loopback): the result
// every rank gets is the one the scheme promises, bit for bit, computed here
// independently of the kernels under test (values in double, rounded once
// by a reference rounding).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "absl/time/clock.h"
#include "tests/integration/comm_harness.h"
#include "tests/rounding.h"

namespace muster {
namespace {

double Bf16(double x) { return RoundTo(x, 8, -126, std::ldexp(255.0, 120)); }
double Fp16(double x) { return RoundTo(x, 11, -14, std::ldexp(2047.0, 5)); }

// Rank r's gradients: floats of every significant bit, magnitudes 2^-4..2^4,
// both signs; none of them is a bfloat16 or float16 value.
std::vector<std::vector<float>> Gradients(int world, size_t n) {
  std::vector<std::vector<float>> out(world, std::vector<float>(n));
  for (int r = 0; r < world; ++r) {
    std::mt19937 gen(1234 + r);
    std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
    std::uniform_int_distribution<int> exponent(-4, 3);
    for (size_t i = 0; i < n; ++i) {
      const float v = std::ldexp(mantissa(gen), exponent(gen));
      out[r][i] = (gen() & 1) ? v : -v;
    }
  }
  return out;
}

struct Reduced {
  std::vector<std::vector<float>> compressed;  // by rank
  std::vector<std::vector<float>> plain;       // AllReduce in float32, by rank
  std::vector<int> node_of;                    // by rank
  std::vector<std::string> names;
  std::vector<DataType> wires;
  // With `counts`: ReduceScatterGradients and a float32 ReduceScatter, by rank.
  std::vector<std::vector<float>> scattered, scattered_plain;
};

// Every rank all-reduces (average) its Gradients() through
// AllReduceGradients and through a plain float32 AllReduce; with `counts`
// (one per rank, summing to n) it also reduce-scatters (average) them
// through ReduceScatterGradients and a float32 ReduceScatter.
Reduced ReduceEverywhere(const NodeSplit& split, Backend backend,
                         GradientCompression compression, size_t n,
                         const std::vector<size_t>& counts = {}) {
  const int w = static_cast<int>(split.size());
  const auto inputs = Gradients(w, n);
  Reduced out{std::vector<std::vector<float>>(w), std::vector<std::vector<float>>(w),
              std::vector<int>(w),                  std::vector<std::string>(w),
              std::vector<DataType>(w),             std::vector<std::vector<float>>(w),
              std::vector<std::vector<float>>(w)};
  CommHarness h(split, "gc" + std::to_string(::getpid()));
  CommOptions o;
  o.backend = backend;
  o.gradient_compression = compression;
  o.shm_slot_bytes = 64 << 10;  // several rounds
  EXPECT_TRUE(h.Run(o, [&](RankContext& rc) {
    const int r = rc.world.rank;
    out.node_of[r] = rc.world.node_rank();
    out.names[r] = rc.comm->name();
    out.wires[r] = rc.comm->gradient_wire();
    out.compressed[r] = inputs[r];
    out.plain[r] = inputs[r];
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    ASSERT_TRUE(rc.comm->AllReduceGradients(out.compressed[r].data(), n, ReduceOp::kAverage,
                                            deadline).ok());
    ASSERT_TRUE(rc.comm->AllReduce(out.plain[r].data(), n, DataType::kFloat32,
                                   ReduceOp::kAverage, deadline).ok());
    if (counts.empty()) return;
    out.scattered[r] = inputs[r];
    out.scattered_plain[r] = inputs[r];
    ASSERT_TRUE(rc.comm->ReduceScatterGradients(out.scattered[r].data(), counts,
                                                ReduceOp::kAverage, deadline).ok());
    ASSERT_TRUE(rc.comm->ReduceScatter(out.scattered_plain[r].data(), counts, DataType::kFloat32,
                                       ReduceOp::kAverage, deadline).ok());
  }).ok());
  return out;
}

void ExpectSameOnEveryRank(const std::vector<std::vector<float>>& by_rank) {
  for (size_t r = 1; r < by_rank.size(); ++r) {
    ASSERT_EQ(std::memcmp(by_rank[r].data(), by_rank[0].data(), by_rank[0].size() * 4), 0)
        << "rank " << r << " differs from rank 0";
  }
}

// Two nodes of two ranks, bfloat16: inside each node the two gradients add
// in float32; each node's sum is rounded to bfloat16 once; the two nodes'
// bfloat16 values add in float32 and round once; the average divides by 4
// in float32. Every rank gets exactly that, and it lies within bfloat16's
// rounding of the float32 result.
TEST(GradientCompressionTest, HierarchicalBf16CompressesOnlyTheShardAcrossNodes) {
  const size_t n = 100003;  // odd: shards and ring chunks of unequal sizes
  const auto inputs = Gradients(4, n);
  const Reduced got = ReduceEverywhere({0, 0, 1, 1}, Backend::kHier, GradientCompression::kBf16, n);
  ASSERT_EQ(got.wires[0], DataType::kBFloat16);
  EXPECT_EQ(got.names[0], "hier(shm+gloo:bfloat16)");
  ExpectSameOnEveryRank(got.compressed);
  size_t differ_from_plain = 0;
  for (size_t i = 0; i < n; ++i) {
    float node_sum[2] = {0, 0};
    double magnitude = 0;
    for (int r = 0; r < 4; ++r) {
      node_sum[got.node_of[r]] += inputs[r][i];  // one float32 add per node
      magnitude += std::fabs(inputs[r][i]);
    }
    const double want = Bf16(Bf16(node_sum[0]) + Bf16(node_sum[1])) / 4;
    ASSERT_EQ(got.compressed[0][i], static_cast<float>(want)) << "element " << i;
    const float plain = got.plain[0][i];
    // Two roundings to bfloat16's 8 significant bits, each within 2^-8.
    ASSERT_LE(std::fabs(got.compressed[0][i] - plain), std::ldexp(magnitude, -7) * 1.01 / 4 + 1e-6)
        << "element " << i;
    differ_from_plain += got.compressed[0][i] != plain;
  }
  EXPECT_GT(differ_from_plain, n / 2) << "the gradients did not travel as bfloat16";
}

// A flat Gloo world over two nodes compresses the whole buffer: each rank's
// gradients are rounded to float16 once, added in float32, rounded once.
TEST(GradientCompressionTest, FlatGlooFp16CompressesTheWholeBuffer) {
  const size_t n = 50001;
  const auto inputs = Gradients(2, n);
  const Reduced got = ReduceEverywhere({0, 1}, Backend::kGloo, GradientCompression::kFp16, n);
  ASSERT_EQ(got.wires[0], DataType::kFloat16);
  EXPECT_EQ(got.names[1], "gloo:float16");
  ExpectSameOnEveryRank(got.compressed);
  for (size_t i = 0; i < n; ++i) {
    const double want = Fp16(Fp16(inputs[0][i]) + Fp16(inputs[1][i])) / 2;
    ASSERT_EQ(got.compressed[1][i], static_cast<float>(want)) << "element " << i;
  }
}

// Segment `rank` of `by_rank[rank]`, for every rank, back to back: what a
// reduce-scatter leaves where each rank can read it.
std::vector<float> OwnSegments(const std::vector<std::vector<float>>& by_rank,
                               const std::vector<size_t>& counts) {
  std::vector<float> out;
  size_t at = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    out.insert(out.end(), by_rank[r].begin() + at, by_rank[r].begin() + at + counts[r]);
    at += counts[r];
  }
  return out;
}

// ReduceScatterGradients compresses what crosses nodes as the all-reduce
// does: on two nodes of two ranks (columns of the hierarchy) and on a flat
// Gloo world of two nodes, each rank's segment is, bit for bit, that
// segment of AllReduceGradients (the same roundings in the same order:
// the formulas of the two tests above), so it differs from the float32
// reduce-scatter's. Segments are uneven, one of them empty.
TEST(GradientCompressionTest, ReduceScatterCompressesAsTheAllReduce) {
  struct Case {
    NodeSplit split;
    Backend backend;
    GradientCompression compression;
    std::vector<size_t> counts;
  };
  const std::vector<Case> cases = {
      {{0, 0, 1, 1}, Backend::kHier, GradientCompression::kBf16, {30011, 0, 41000, 28992}},
      {{0, 1}, Backend::kGloo, GradientCompression::kFp16, {49000, 51003}},
  };
  for (const Case& c : cases) {
    const size_t n = TotalCount(c.counts);
    const Reduced got = ReduceEverywhere(c.split, c.backend, c.compression, n, c.counts);
    const std::vector<float> scattered = OwnSegments(got.scattered, c.counts);
    const std::vector<float> plain = OwnSegments(got.scattered_plain, c.counts);
    size_t differ_from_plain = 0;
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(scattered[i], got.compressed[0][i]) << got.names[0] << " element " << i;
      ASSERT_EQ(plain[i], got.plain[0][i]) << got.names[0] << " element " << i;
      differ_from_plain += scattered[i] != plain[i];
    }
    EXPECT_GT(differ_from_plain, n / 2) << got.names[0] << ": the segments crossed as float32";
  }
}

// ReduceColumnsGradients leaves each rank the segments of its column
// reduced, compressed across nodes as the all-reduce: on two nodes of two
// ranks, segments r and r +- 2 of rank r are, bit for bit, those of
// AllReduceGradients, with bf16 as in float32, and the other column's
// segments are left as they were (nothing carried them). Flat Gloo has no
// columns: every segment is the all-reduce's.
TEST(GradientCompressionTest, ColumnsAreReducedAsByTheAllReduce) {
  const std::vector<size_t> counts = {30011, 0, 41000, 28992};
  const size_t n = TotalCount(counts);
  for (auto [split, backend] : {std::pair<NodeSplit, Backend>{{0, 0, 1, 1}, Backend::kHier},
                                std::pair<NodeSplit, Backend>{{0, 1, 0, 1}, Backend::kGloo}}) {
    for (GradientCompression c : {GradientCompression::kNone, GradientCompression::kBf16}) {
      const auto inputs = Gradients(4, n);
      std::vector<std::vector<float>> got(4), want(4);
      CommHarness h(split, "gcc" + std::to_string(::getpid()));
      CommOptions o;
      o.backend = backend;
      o.gradient_compression = c;
      ASSERT_TRUE(h.Run(o, [&](RankContext& rc) {
        const int r = rc.world.rank;
        got[r] = want[r] = inputs[r];
        const absl::Time deadline = absl::Now() + absl::Seconds(60);
        ASSERT_TRUE(rc.comm->ReduceColumnsGradients(got[r].data(), counts, ReduceOp::kAverage,
                                                    deadline).ok());
        ASSERT_TRUE(rc.comm->AllReduceGradients(want[r].data(), n, ReduceOp::kAverage,
                                                deadline).ok());
      }).ok());
      for (int r = 0; r < 4; ++r) {
        for (int s = 0; s < 4; ++s) {
          const size_t at = SegmentOffset(counts, s);
          const bool mine = backend != Backend::kHier || s % 2 == r % 2;
          const float* expected = (mine ? want[r] : inputs[r]).data() + at;
          ASSERT_EQ(std::memcmp(got[r].data() + at, expected, counts[s] * 4), 0)
              << "rank " << r << " segment " << s << (mine ? " reduced" : " untouched")
              << ", compression " << static_cast<int>(c);
        }
      }
    }
  }
}

// Nothing crosses nodes in a world of one node: compression asked for
// changes nothing, and AllReduceGradients is the float32 AllReduce, bit for
// bit.
TEST(GradientCompressionTest, OneNodeIsNotCompressed) {
  for (Backend backend : {Backend::kHier, Backend::kShm, Backend::kGloo}) {
    const Reduced got = ReduceEverywhere({0, 0}, backend, GradientCompression::kBf16, 4099);
    EXPECT_EQ(got.wires[0], DataType::kFloat32) << got.names[0];
    EXPECT_EQ(got.names[0].find("bfloat16"), std::string::npos) << got.names[0];
    for (int r = 0; r < 2; ++r) {
      ASSERT_EQ(std::memcmp(got.compressed[r].data(), got.plain[r].data(), 4099 * 4), 0)
          << got.names[0] << " rank " << r;
    }
  }
}

TEST(GradientCompressionTest, NamesParseAndAnUnknownOneListsTheChoices) {
  EXPECT_EQ(ParseGradientCompression("none").value(), GradientCompression::kNone);
  EXPECT_EQ(ParseGradientCompression("bf16").value(), GradientCompression::kBf16);
  EXPECT_EQ(ParseGradientCompression("fp16").value(), GradientCompression::kFp16);
  const absl::Status s = ParseGradientCompression("bfloat16").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("none, bf16, fp16"), std::string::npos) << s;
  EXPECT_STREQ(GradientCompressionName(GradientCompression::kFp16), "fp16");
  EXPECT_STREQ(GradientCompressionName(static_cast<GradientCompression>(9)), "unknown");
}

// BuildCommunicator refuses a value outside the enum instead of guessing.
TEST(GradientCompressionTest, AnUnknownValueIsRefusedByTheFactory) {
  CommHarness h({0, 1}, "gcbad" + std::to_string(::getpid()));
  CommOptions o;
  o.backend = Backend::kGloo;
  o.gradient_compression = static_cast<GradientCompression>(7);
  const absl::Status s = h.Run(o, [](RankContext&) {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("gradient_compression"), std::string::npos) << s;
}

}  // namespace
}  // namespace muster
