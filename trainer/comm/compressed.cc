#include "trainer/comm/compressed.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "trainer/comm/forwarding.h"

namespace muster {

namespace {

absl::Status CheckWire(DataType wire) {
  if (wire != DataType::kFloat16 && wire != DataType::kBFloat16) {
    return absl::InvalidArgumentError(
        absl::StrCat("gradients cannot be compressed to ", DataTypeName(wire)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status AllReduceCompressed(Communicator* comm, BufferOps* ops, DataType wire, void* data,
                                 size_t count, absl::Time deadline, void* carried) {
  MUSTER_RETURN_IF_ERROR(CheckWire(wire));
  // An empty call still goes to `comm`: every rank issues the same ones.
  if (count == 0) return comm->AllReduce(data, 0, wire, ReduceOp::kSum, deadline);
  if (carried == nullptr) {
    MUSTER_ASSIGN_OR_RETURN(carried, ops->Scratch(count * DataTypeSize(wire)));
  }
  MUSTER_RETURN_IF_ERROR(ops->Compress(wire, data, carried, count));
  MUSTER_RETURN_IF_ERROR(comm->AllReduce(carried, count, wire, ReduceOp::kSum, deadline));
  return ops->Decompress(wire, carried, data, count);
}

absl::Status ReduceScatterCompressed(Communicator* comm, BufferOps* ops, DataType wire, void* data,
                                     const std::vector<size_t>& counts, void* carried,
                                     absl::Time deadline) {
  MUSTER_RETURN_IF_ERROR(CheckWire(wire));
  MUSTER_RETURN_IF_ERROR(CheckCounts(counts, comm->size()));
  const size_t total = TotalCount(counts);
  const size_t own = SegmentOffset(counts, comm->rank());
  const size_t n = counts[comm->rank()];
  if (total > 0) MUSTER_RETURN_IF_ERROR(ops->Compress(wire, data, carried, total));
  MUSTER_RETURN_IF_ERROR(comm->ReduceScatter(carried, counts, wire, ReduceOp::kSum, deadline));
  if (n == 0) return absl::OkStatus();
  const size_t ws = DataTypeSize(wire);
  return ops->Decompress(wire, static_cast<char*>(carried) + own * ws,
                         static_cast<float*>(data) + own, n);
}

namespace {

class Compressed : public ForwardingCommunicator {
 public:
  Compressed(std::unique_ptr<Communicator> inner, DataType wire, std::unique_ptr<BufferOps> ops)
      : ForwardingCommunicator(std::move(inner)), wire_(wire), ops_(std::move(ops)) {}

  std::string name() const override {
    return absl::StrCat(inner()->name(), ":", DataTypeName(wire_));
  }
  absl::Status AllReduceGradients(void* data, size_t count, ReduceOp op,
                                  absl::Time deadline) override {
    absl::Status s = AllReduceCompressed(inner(), ops_.get(), wire_, data, count, deadline);
    if (s.ok() && op == ReduceOp::kAverage) {
      s = ops_->Divide(DataType::kFloat32, data, count, inner()->size());
    }
    if (!s.ok() && !absl::IsInvalidArgument(s)) inner()->Abort(s);
    return s;
  }
  absl::Status ReduceScatterGradients(void* data, const std::vector<size_t>& counts,
                                      ReduceOp op, absl::Time deadline) override {
    if (absl::Status s = CheckCounts(counts, inner()->size()); !s.ok()) return s;
    const int me = inner()->rank();
    absl::StatusOr<void*> carried =
        ops_->Scratch(std::max<size_t>(TotalCount(counts), 1) * DataTypeSize(wire_));
    absl::Status s = carried.status();
    if (s.ok()) {
      s = ReduceScatterCompressed(inner(), ops_.get(), wire_, data, counts, *carried, deadline);
    }
    if (s.ok() && op == ReduceOp::kAverage && counts[me] > 0) {
      s = ops_->Divide(DataType::kFloat32, static_cast<float*>(data) + SegmentOffset(counts, me),
                       counts[me], inner()->size());
    }
    if (!s.ok() && !absl::IsInvalidArgument(s)) inner()->Abort(s);
    return s;
  }
  DataType gradient_wire() const override { return wire_; }
  // This one is spent afterwards: its ops go on with the shrunk one.
  absl::StatusOr<std::unique_ptr<Communicator>> Shrink(const std::vector<int>& excluded,
                                                       absl::Time deadline) override {
    auto shrunk = inner()->Shrink(excluded, deadline);
    if (!shrunk.ok()) return shrunk.status();
    return NewCompressedCommunicator(std::move(*shrunk), wire_, std::move(ops_));
  }

 private:
  const DataType wire_;
  std::unique_ptr<BufferOps> ops_;
};

}  // namespace

std::unique_ptr<Communicator> NewCompressedCommunicator(std::unique_ptr<Communicator> inner,
                                                        DataType wire,
                                                        std::unique_ptr<BufferOps> ops) {
  return std::make_unique<Compressed>(std::move(inner), wire, std::move(ops));
}

}  // namespace muster
