#include "trainer/comm/hierarchical.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "trainer/comm/compressed.h"
#include "trainer/comm/reduce.h"

namespace muster {

int HierarchyPlan::Owner(int node_size, int segment) const {
  const std::vector<int>& b = owned_begin.at(node_size);
  return static_cast<int>(std::upper_bound(b.begin(), b.end(), segment) - b.begin()) - 1;
}

HierarchyPlan PlanHierarchy(const std::vector<int>& node_sizes) {
  HierarchyPlan plan;
  for (int l_count : node_sizes) plan.segments = std::max(plan.segments, l_count);
  const int s_count = plan.segments;
  for (int l_count : node_sizes) {
    std::vector<int>& begin = plan.owned_begin[l_count];
    if (!begin.empty()) continue;
    for (int l = 0; l <= l_count; ++l) begin.push_back(l * s_count / l_count);
  }
  for (int s = 0; s < s_count; ++s) {
    bool same_owners = s > 0;
    for (const auto& [l_count, begin] : plan.owned_begin) {
      same_owners = same_owners && plan.Owner(l_count, s) == plan.Owner(l_count, s - 1);
    }
    if (same_owners) {
      plan.groups.back().last_segment = s + 1;
    } else {
      plan.groups.push_back(InterGroup{s, s + 1});
    }
  }
  return plan;
}

namespace {

class Hierarchical : public Communicator {
 public:
  Hierarchical(int rank, int size, HierarchyPlan plan, int local_size,
               std::unique_ptr<Communicator> intra, std::vector<InterGroup> groups,
               std::vector<std::unique_ptr<Communicator>> inter, std::unique_ptr<BufferOps> ops,
               DataType gradient_wire)
      : rank_(rank),
        size_(size),
        plan_(std::move(plan)),
        local_size_(local_size),
        memory_(intra->memory()),
        intra_(std::move(intra)),
        groups_(std::move(groups)),
        inter_(std::move(inter)),
        ops_(std::move(ops)),
        wire_(CrossesNodes(inter_) ? gradient_wire : DataType::kFloat32) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override {
    std::string inter = "none";
    for (const auto& c : inter_) {
      if (c) inter = c->name();
    }
    const std::string wire =
        wire_ == DataType::kFloat32 ? "" : absl::StrCat(":", DataTypeName(wire_));
    return absl::StrCat("hier(", intra_ ? intra_->name() : "released", "+", inter, wire, ")");
  }
  MemorySpace memory() const override { return memory_; }

  absl::Status AllReduce(void* data, size_t count, DataType type, ReduceOp op,
                         absl::Time deadline) override {
    return Reduce(data, count, type, op, /*wire=*/type, deadline);
  }

  // The node-local legs in float32, the shards across nodes as `wire_`.
  absl::Status AllReduceGradients(void* data, size_t count, ReduceOp op,
                                  absl::Time deadline) override {
    return Reduce(data, count, DataType::kFloat32, op, wire_, deadline);
  }
  DataType gradient_wire() const override { return wire_; }

  // AllReduce whose shards cross nodes as `wire` (`type` itself: as they are).
  absl::Status Reduce(void* data, size_t count, DataType type, ReduceOp op, DataType wire,
                      absl::Time deadline) {
    if (absl::Status s = Broken(); !s.ok()) return s;
    const size_t es = DataTypeSize(type);
    const std::vector<size_t> seg = EvenSplit(count, plan_.segments);
    std::vector<size_t> seg_offset(seg.size() + 1, 0);
    for (size_t s = 0; s < seg.size(); ++s) seg_offset[s + 1] = seg_offset[s] + seg[s];
    const std::vector<int>& begin = plan_.owned_begin.at(local_size_);
    std::vector<size_t> local_counts;
    for (size_t l = 0; l + 1 < begin.size(); ++l) {
      local_counts.push_back(seg_offset[begin[l + 1]] - seg_offset[begin[l]]);
    }
    if (absl::Status s = Intra(intra_->ReduceScatter(data, local_counts, type, ReduceOp::kSum,
                                                     deadline));
        !s.ok()) {
      return s;
    }
    char* base = static_cast<char*>(data);
    for (size_t i = 0; i < groups_.size(); ++i) {
      const InterGroup& g = groups_[i];
      const size_t lo = seg_offset[g.first_segment];
      const size_t n = seg_offset[g.last_segment] - lo;
      if (inter_[i] != nullptr) {
        absl::Status s =
            wire == type
                ? inter_[i]->AllReduce(base + lo * es, n, type, ReduceOp::kSum, deadline)
                : AllReduceCompressed(inter_[i].get(), ops_.get(), wire, base + lo * es, n,
                                      deadline);
        if (!s.ok()) {
          Abort(s);  // wakes this node's ranks waiting for this shard
          return s;
        }
      }
      if (op == ReduceOp::kAverage) {
        if (absl::Status s = ops_->Divide(type, base + lo * es, n, size_); !s.ok()) {
          Abort(s);
          return s;
        }
      }
    }
    return Intra(intra_->AllGather(data, local_counts, type, deadline));
  }

  // On nodes of equal size, by columns (ReduceByColumns). Elsewhere an
  // all-reduce, which leaves every segment reduced.
  absl::Status ReduceScatter(void* data, const std::vector<size_t>& counts, DataType type,
                             ReduceOp op, absl::Time deadline) override {
    if (absl::Status s = CheckCounts(counts, size_); !s.ok()) return s;
    if (EvenNodesOnHost()) {
      return ReduceByColumns(static_cast<char*>(data), counts, type, op, /*wire=*/type, deadline);
    }
    return AllReduce(data, TotalCount(counts), type, op, deadline);
  }

  // As ReduceScatter in float32, the columns crossing nodes as `wire_`;
  // elsewhere AllReduceGradients.
  absl::Status ReduceScatterGradients(void* data, const std::vector<size_t>& counts, ReduceOp op,
                                      absl::Time deadline) override {
    if (absl::Status s = CheckCounts(counts, size_); !s.ok()) return s;
    if (EvenNodesOnHost()) {
      return ReduceByColumns(static_cast<char*>(data), counts, DataType::kFloat32, op, wire_,
                             deadline);
    }
    return Reduce(data, TotalCount(counts), DataType::kFloat32, op, wire_, deadline);
  }

  // On nodes of equal size, by columns with the leg across nodes an
  // all-reduce of the column; elsewhere AllReduceGradients.
  absl::Status ReduceColumnsGradients(void* data, const std::vector<size_t>& counts, ReduceOp op,
                                      absl::Time deadline) override {
    if (absl::Status s = CheckCounts(counts, size_); !s.ok()) return s;
    if (EvenNodesOnHost()) {
      return ReduceByColumns(static_cast<char*>(data), counts, DataType::kFloat32, op, wire_,
                             deadline, /*whole_column=*/true);
    }
    return Reduce(data, TotalCount(counts), DataType::kFloat32, op, wire_, deadline);
  }

  absl::Status AllGather(void* data, const std::vector<size_t>& counts, DataType type,
                         absl::Time deadline) override {
    if (absl::Status s = CheckCounts(counts, size_); !s.ok()) return s;
    if (EvenNodesOnHost()) return GatherByColumns(static_cast<char*>(data), counts, type, deadline);
    // Zero every segment but this rank's and sum: adding zeros is exact.
    const size_t es = DataTypeSize(type);
    size_t offset = 0, total = 0;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) offset = total;
      total += counts[r];
    }
    char* base = static_cast<char*>(data);
    absl::Status s = ops_->Zero(base, offset * es);
    if (s.ok()) {
      s = ops_->Zero(base + (offset + counts[rank_]) * es, (total - offset - counts[rank_]) * es);
    }
    if (!s.ok()) return s;
    return AllReduce(data, total, type, ReduceOp::kSum, deadline);
  }

  // Nodes of equal size: rank r is local rank r % L of node r / L.
  std::vector<int> NodeRanks() const override {
    if (!EvenNodes()) return {};
    std::vector<int> ranks;
    for (int l = 0; l < local_size_; ++l) ranks.push_back(rank_ - rank_ % local_size_ + l);
    return ranks;
  }

  absl::Status AllGatherInNode(void* data, const std::vector<size_t>& counts, DataType type,
                               absl::Time deadline) override {
    if (!EvenNodes()) return Communicator::AllGatherInNode(data, counts, type, deadline);
    if (absl::Status s = CheckCounts(counts, local_size_); !s.ok()) return s;
    if (absl::Status s = Broken(); !s.ok()) return s;
    if (local_size_ == 1) return absl::OkStatus();
    return Intra(intra_->AllGather(data, counts, type, deadline));
  }

  absl::Status Broadcast(void* data, size_t count, DataType type, int root,
                         absl::Time deadline) override {
    if (root < 0 || root >= size_) {
      return absl::InvalidArgumentError(absl::StrCat("root ", root, " is not a rank of ", size_));
    }
    if (rank_ != root) {
      if (absl::Status s = ops_->Zero(data, count * DataTypeSize(type)); !s.ok()) return s;
    }
    return AllReduce(data, count, type, ReduceOp::kSum, deadline);
  }

  // Everyone on this node arrived, then every node's owners, then the node
  // learns it: no buffer needed on any memory.
  absl::Status Barrier(absl::Time deadline) override {
    if (absl::Status s = Broken(); !s.ok()) return s;
    if (absl::Status s = Intra(intra_->Barrier(deadline)); !s.ok()) return s;
    for (auto& c : inter_) {
      if (c == nullptr) continue;
      if (absl::Status s = c->Barrier(deadline); !s.ok()) {
        Abort(s);
        return s;
      }
    }
    return Intra(intra_->Barrier(deadline));
  }

  // The node-local communicator is aborted only when it has peers to wake:
  // one of a single member waits for nobody, so a failure elsewhere leaves
  // it whole for the next world to keep (ReleaseNodeCommunicator).
  // Only the inter-node groups cross the network.
  std::vector<int> Unreachable() override {
    std::vector<int> out;
    for (const auto& c : inter_) {
      if (c == nullptr) continue;
      for (int r : c->Unreachable()) {
        if (std::find(out.begin(), out.end(), r) == out.end()) out.push_back(r);
      }
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  void Abort(const absl::Status& why) override {
    Break(why);
    if (local_size_ > 1 && intra_ != nullptr) {
      intra_touched_ = true;
      intra_->Abort(why);
    }
    for (auto& c : inter_) {
      if (c) c->Abort(why);
    }
  }

  // After the world's end (no Abort can come any more: the trainer
  // detached it). A touched node-local communicator goes on only to shrink.
  std::unique_ptr<Communicator> ReleaseNodeCommunicator(bool* touched) override {
    *touched = intra_touched_.load();
    if (intra_ == nullptr || (*touched && !intra_->CanShrink())) return nullptr;
    std::unique_ptr<Communicator> node = std::move(intra_);
    Abort(absl::AbortedError("its node-local communicator went on to the next world"));
    return node;
  }

 private:
  static bool CrossesNodes(const std::vector<std::unique_ptr<Communicator>>& inter) {
    return std::any_of(inter.begin(), inter.end(), [](const auto& c) { return c != nullptr; });
  }

  const int rank_;
  const int size_;
  const HierarchyPlan plan_;
  // OK, or ABORTED once a collective failed or Abort was called.
  absl::Status Broken() {
    absl::MutexLock lock(&mu_);
    return aborted_;
  }

  // Nodes of equal size on host memory: a world's ranks are numbered node
  // by node (the rendezvous makes a node's members contiguous), so rank r
  // is local rank r % L of node r / L, and this rank's one inter-node
  // group holds local rank r % L of every node.
  bool EvenNodes() const {
    return plan_.owned_begin.size() == 1 && local_size_ > 0 && size_ % local_size_ == 0 &&
           intra_ != nullptr && intra_->rank() == rank_ % local_size_;
  }
  bool EvenNodesOnHost() const {
    return memory_.is_host() && EvenNodes() &&
           (size_ == local_size_ ||
            (groups_.size() == 1 && inter_[0] != nullptr &&
             inter_[0]->size() == size_ / local_size_ && inter_[0]->rank() == rank_ / local_size_));
  }

  // Where each rank's segment lies in the caller's buffer (`at`) and in a
  // scratch copy laid out column by column (`in_scratch`): column c holds
  // the segments of local rank c of every node, node by node. `mine` are
  // the counts of this rank's column, one per node, which begins at
  // `own_column`.
  struct Columns {
    std::vector<size_t> at, in_scratch, column, mine;
    char* scratch = nullptr;
    char* own_column = nullptr;
    char* carried = nullptr;  // room for the own column in `carried_es`-byte elements
  };
  // ABORTED once broken.
  // `at`: where each segment begins in the caller's buffer.
  absl::StatusOr<Columns> ScratchColumns(const std::vector<size_t>& at,
                                         const std::vector<size_t>& counts, size_t es,
                                         size_t carried_es = 0) {
    if (absl::Status s = Broken(); !s.ok()) return s;
    const int L = local_size_, nodes = size_ / L;
    Columns c{at, std::vector<size_t>(size_), std::vector<size_t>(L, 0),
              std::vector<size_t>(nodes)};
    size_t total = 0;
    for (int col = 0; col < L; ++col) {
      for (int n = 0; n < nodes; ++n) {
        c.in_scratch[n * L + col] = total;
        total += counts[n * L + col];
        c.column[col] += counts[n * L + col];
      }
    }
    for (int n = 0; n < nodes; ++n) c.mine[n] = counts[n * L + rank_ % L];
    const size_t carried = c.column[rank_ % L] * carried_es;
    absl::StatusOr<void*> scratch = ops_->Scratch(std::max<size_t>(total * es + carried, 1));
    if (!scratch.ok()) return scratch.status();
    c.scratch = static_cast<char*>(*scratch);
    c.own_column = c.scratch + c.in_scratch[rank_ % L] * es;
    c.carried = c.scratch + total * es;
    return c;
  }

  // AllGather on even nodes, in two legs that move each segment once per
  // hop: across nodes, each local rank l gathers its column (the segments
  // of local rank l of every node) over its inter-node group; then inside
  // the node the columns are all-gathered. Both legs run on a scratch
  // copy laid out column by column, which is then copied into place.
  absl::Status GatherByColumns(char* data, const std::vector<size_t>& counts, DataType type,
                               absl::Time deadline) {
    const size_t es = DataTypeSize(type);
    return InRounds(counts, es, [&](const std::vector<size_t>& at, const std::vector<size_t>& n) {
      return GatherRoundByColumns(data, at, n, type, deadline);
    });
  }
  // InRounds: cuts the segments (`counts`, one after the other in the
  // caller's buffer) into rounds that take the next piece of every segment,
  // at most kRoundBytes in all, and runs `round` on each with where its
  // pieces begin and their counts: the scratch a leg copies into is then
  // bounded by a round, not by the buffer (a bucket holding one large
  // parameter). Every rank cuts the same counts alike. At least one round.
  static constexpr size_t kRoundBytes = size_t{16} << 20;
  absl::Status InRounds(
      const std::vector<size_t>& counts, size_t es,
      const std::function<absl::Status(const std::vector<size_t>&, const std::vector<size_t>&)>&
          round) {
    const size_t piece = std::max<size_t>(kRoundBytes / (static_cast<size_t>(size_) * es), 1);
    std::vector<size_t> where(static_cast<size_t>(size_)), n(static_cast<size_t>(size_));
    std::vector<size_t> done(static_cast<size_t>(size_), 0);
    do {
      size_t begin = 0;
      for (int r = 0; r < size_; ++r) {
        where[r] = begin + done[r];
        n[r] = std::min(piece, counts[r] - done[r]);
        begin += counts[r];
      }
      if (absl::Status s = round(where, n); !s.ok()) return s;
      for (int r = 0; r < size_; ++r) done[r] += n[r];
    } while (done != counts);
    return absl::OkStatus();
  }
  absl::Status GatherRoundByColumns(char* data, const std::vector<size_t>& at,
                                    const std::vector<size_t>& counts, DataType type,
                                    absl::Time deadline) {
    const size_t es = DataTypeSize(type);
    absl::StatusOr<Columns> columns = ScratchColumns(at, counts, es);
    if (!columns.ok()) return columns.status();
    const Columns& c = *columns;
    std::memcpy(c.scratch + c.in_scratch[rank_] * es, data + c.at[rank_] * es, counts[rank_] * es);
    if (c.mine.size() > 1) {
      if (absl::Status s = inter_[0]->AllGather(c.own_column, c.mine, type, deadline); !s.ok()) {
        Abort(s);  // wakes this node's ranks waiting for this column
        return s;
      }
    }
    if (c.column.size() > 1) {
      if (absl::Status s = Intra(intra_->AllGather(c.scratch, c.column, type, deadline));
          !s.ok()) {
        return s;
      }
    }
    for (int r = 0; r < size_; ++r) {
      if (r != rank_) {
        std::memcpy(data + c.at[r] * es, c.scratch + c.in_scratch[r] * es, counts[r] * es);
      }
    }
    return absl::OkStatus();
  }

  // ReduceScatter on even nodes, GatherByColumns' legs reversed: inside the
  // node the columns are reduce-scattered, so that local rank l holds its
  // node's sum of column l; across nodes each local rank reduce-scatters
  // its column over its inter-node group, so that node n's member ends
  // with segment n*L + l, its own. Each segment crosses each hop once; the
  // caller's other segments are left as they were. The column crosses
  // nodes as `wire` (a float32 `type` compressed: ReduceScatterCompressed).
  // With `whole_column` the leg across nodes all-reduces the column, so
  // that every segment of the column ends reduced on this rank.
  absl::Status ReduceByColumns(char* data, const std::vector<size_t>& counts, DataType type,
                               ReduceOp op, DataType wire, absl::Time deadline,
                               bool whole_column = false) {
    return InRounds(counts, DataTypeSize(type),
                    [&](const std::vector<size_t>& at, const std::vector<size_t>& n) {
                      return ReduceRoundByColumns(data, at, n, type, op, wire, deadline,
                                                  whole_column);
                    });
  }
  absl::Status ReduceRoundByColumns(char* data, const std::vector<size_t>& at,
                                    const std::vector<size_t>& counts, DataType type,
                                    ReduceOp op, DataType wire, absl::Time deadline,
                                    bool whole_column) {
    const size_t es = DataTypeSize(type);
    absl::StatusOr<Columns> columns =
        ScratchColumns(at, counts, es, wire == type ? 0 : DataTypeSize(wire));
    if (!columns.ok()) return columns.status();
    const Columns& c = *columns;
    for (int r = 0; r < size_; ++r) {
      std::memcpy(c.scratch + c.in_scratch[r] * es, data + c.at[r] * es, counts[r] * es);
    }
    if (c.column.size() > 1) {
      if (absl::Status s = Intra(intra_->ReduceScatter(c.scratch, c.column, type, ReduceOp::kSum,
                                                       deadline));
          !s.ok()) {
        return s;
      }
    }
    if (c.mine.size() > 1) {
      if (absl::Status s = AcrossNodes(c, type, wire, whole_column, deadline); !s.ok()) {
        Abort(s);  // as any failed leg across nodes: the whole communicator
        return s;
      }
    }
    for (int r = whole_column ? rank_ % local_size_ : rank_; r < size_;
         r += whole_column ? local_size_ : size_) {
      char* out = data + c.at[r] * es;
      std::memcpy(out, c.scratch + c.in_scratch[r] * es, counts[r] * es);
      if (op == ReduceOp::kAverage) {
        if (absl::Status s = ops_->Divide(type, out, counts[r], size_); !s.ok()) return s;
      }
    }
    return absl::OkStatus();
  }
  // ReduceByColumns' leg across nodes over this rank's column.
  absl::Status AcrossNodes(const Columns& c, DataType type, DataType wire, bool whole_column,
                           absl::Time deadline) {
    Communicator* across = inter_[0].get();
    if (whole_column) {
      const size_t n = TotalCount(c.mine);
      return wire == type ? across->AllReduce(c.own_column, n, type, ReduceOp::kSum, deadline)
                          : AllReduceCompressed(across, ops_.get(), wire, c.own_column, n,
                                                deadline, c.carried);
    }
    return wire == type ? across->ReduceScatter(c.own_column, c.mine, type, ReduceOp::kSum,
                                                deadline)
                        : ReduceScatterCompressed(across, ops_.get(), wire, c.own_column, c.mine,
                                                  c.carried, deadline);
  }

  // Every later collective answers ABORTED with the first reason.
  void Break(const absl::Status& why) {
    absl::MutexLock lock(&mu_);
    if (aborted_.ok()) aborted_ = absl::AbortedError(why.message());
  }
  // An error of the node-local communicator breaks it and this one.
  absl::Status Intra(absl::Status s) {
    if (s.ok() || absl::IsInvalidArgument(s)) return s;
    intra_touched_ = true;
    Break(s);
    return s;
  }

  const int local_size_;
  const MemorySpace memory_;
  absl::Mutex mu_;
  absl::Status aborted_ ABSL_GUARDED_BY(mu_);
  // The node-local communicator failed or was aborted: it cannot be kept.
  std::atomic<bool> intra_touched_{false};
  std::unique_ptr<Communicator> intra_;
  const std::vector<InterGroup> groups_;
  std::vector<std::unique_ptr<Communicator>> inter_;
  std::unique_ptr<BufferOps> ops_;
  const DataType wire_;  // AllReduceGradients' type across nodes
};

class HostBufferOps : public BufferOps {
 public:
  absl::Status Zero(void* data, size_t bytes) override {
    if (bytes > 0) std::memset(data, 0, bytes);
    return absl::OkStatus();
  }
  absl::Status Divide(DataType type, void* data, size_t count, int divisor) override {
    DivideBy(type, data, count, divisor);
    return absl::OkStatus();
  }
  absl::Status Compress(DataType wire, const void* from, void* to, size_t count) override {
    CompressFloats(wire, static_cast<const float*>(from), static_cast<uint16_t*>(to), count);
    return absl::OkStatus();
  }
  absl::Status Decompress(DataType wire, const void* from, void* to, size_t count) override {
    DecompressFloats(wire, static_cast<const uint16_t*>(from), static_cast<float*>(to), count);
    return absl::OkStatus();
  }
  absl::StatusOr<void*> Scratch(size_t bytes) override {
    if (scratch_.size() < bytes) scratch_.resize(bytes);
    return static_cast<void*>(scratch_.data());
  }

 private:
  std::vector<char> scratch_;
};

}  // namespace

std::unique_ptr<BufferOps> NewHostBufferOps() { return std::make_unique<HostBufferOps>(); }

std::unique_ptr<Communicator> NewHierarchicalCommunicator(
    int rank, int size, HierarchyPlan plan, int local_size, std::unique_ptr<Communicator> intra,
    std::vector<InterGroup> my_groups, std::vector<std::unique_ptr<Communicator>> inter,
    std::unique_ptr<BufferOps> ops, DataType gradient_wire) {
  return std::make_unique<Hierarchical>(rank, size, std::move(plan), local_size, std::move(intra),
                                        std::move(my_groups), std::move(inter), std::move(ops),
                                        gradient_wire);
}

}  // namespace muster
