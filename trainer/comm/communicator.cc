#include "trainer/comm/communicator.h"

#include <algorithm>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace muster {

size_t DataTypeSize(DataType type) {
  switch (type) {
    case DataType::kFloat32: return 4;
    case DataType::kFloat16: return 2;
    case DataType::kBFloat16: return 2;
    case DataType::kFloat64: return 8;
    case DataType::kInt64: return 8;
  }
  return 0;
}

const char* DataTypeName(DataType type) {
  switch (type) {
    case DataType::kFloat32: return "float32";
    case DataType::kFloat16: return "float16";
    case DataType::kBFloat16: return "bfloat16";
    case DataType::kFloat64: return "float64";
    case DataType::kInt64: return "int64";
  }
  return "unknown";
}

int RankAfterShrink(int rank, const std::vector<int>& excluded) {
  return rank - static_cast<int>(std::count_if(excluded.begin(), excluded.end(),
                                               [rank](int e) { return e < rank; }));
}

absl::Status Communicator::AllGatherInNode(void*, const std::vector<size_t>&, DataType,
                                           absl::Time) {
  return absl::UnimplementedError(
      absl::StrCat(name(), " cannot gather inside a node alone: its nodes are not known"));
}

absl::StatusOr<std::unique_ptr<Communicator>> Communicator::Shrink(const std::vector<int>&,
                                                                  absl::Time) {
  return absl::UnimplementedError(absl::StrCat(name(), " communicators cannot shrink"));
}

std::string MemorySpace::ToString() const {
  return is_host() ? "host" : absl::StrCat("cuda:", device);
}

std::vector<size_t> EvenSplit(size_t count, size_t parts) {
  std::vector<size_t> out(parts, parts == 0 ? 0 : count / parts);
  for (size_t i = 0; parts > 0 && i < count % parts; ++i) ++out[i];
  return out;
}

absl::Status CheckCounts(const std::vector<size_t>& counts, int size) {
  if (counts.size() != static_cast<size_t>(size)) {
    return absl::InvalidArgumentError(absl::StrCat("counts has ", counts.size(),
                                                   " segments; the communicator has ", size,
                                                   " ranks"));
  }
  return absl::OkStatus();
}

size_t TotalCount(const std::vector<size_t>& counts) {
  size_t total = 0;
  for (size_t c : counts) total += c;
  return total;
}

absl::Status Communicator::ReduceColumnsGradients(void* data, const std::vector<size_t>& counts,
                                                  ReduceOp op, absl::Time deadline) {
  if (absl::Status s = CheckCounts(counts, size()); !s.ok()) return s;
  return AllReduceGradients(data, TotalCount(counts), op, deadline);
}

size_t SegmentOffset(const std::vector<size_t>& counts, int rank) {
  size_t offset = 0;
  for (int r = 0; r < rank; ++r) offset += counts[r];
  return offset;
}

std::vector<int> UnreachableRanks(const absl::Status& status) {
  std::vector<int> ranks;
  const auto payload = status.GetPayload(kUnreachablePayload);
  if (!payload.has_value()) return ranks;
  for (absl::string_view part : absl::StrSplit(std::string(*payload), ',', absl::SkipEmpty())) {
    int r = 0;
    if (absl::SimpleAtoi(part, &r) && r >= 0) ranks.push_back(r);
  }
  return ranks;
}

void SetUnreachableRanks(absl::Status* status, const std::vector<int>& ranks) {
  if (status->ok() || ranks.empty()) return;
  status->SetPayload(kUnreachablePayload, absl::Cord(absl::StrJoin(ranks, ",")));
}

}  // namespace muster
