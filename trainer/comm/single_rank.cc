#include "trainer/comm/single_rank.h"

#include <atomic>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace muster {
namespace {

class SingleRank : public Communicator {
 public:
  explicit SingleRank(MemorySpace memory) : memory_(memory) {}

  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "self"; }
  MemorySpace memory() const override { return memory_; }

  absl::Status AllReduce(void*, size_t, DataType, ReduceOp, absl::Time) override {
    return Done();
  }
  absl::Status ReduceScatter(void*, const std::vector<size_t>& counts, DataType, ReduceOp,
                             absl::Time) override {
    if (absl::Status s = CheckCounts(counts, 1); !s.ok()) return s;
    return Done();
  }
  absl::Status AllGather(void*, const std::vector<size_t>& counts, DataType,
                         absl::Time) override {
    if (absl::Status s = CheckCounts(counts, 1); !s.ok()) return s;
    return Done();
  }
  absl::Status Broadcast(void*, size_t, DataType, int root, absl::Time) override {
    if (root != 0) {
      return absl::InvalidArgumentError(absl::StrCat("broadcast root ", root, " in a world of 1"));
    }
    return Done();
  }
  absl::Status Barrier(absl::Time) override { return Done(); }
  void Abort(const absl::Status&) override { aborted_ = true; }

 private:
  absl::Status Done() const {
    if (aborted_) return absl::AbortedError("this communicator of one rank was aborted");
    return absl::OkStatus();
  }

  const MemorySpace memory_;
  std::atomic<bool> aborted_{false};
};

}  // namespace

std::unique_ptr<Communicator> NewSingleRankCommunicator(MemorySpace memory) {
  return std::make_unique<SingleRank>(memory);
}

}  // namespace muster
