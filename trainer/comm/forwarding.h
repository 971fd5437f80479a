// ForwardingCommunicator: a Communicator that hands every call to another
// one it owns, for wrappers that change a few calls and pass the rest on
// (checked.h's buffer checks, compressed.h's gradient compression), as
// LevelDB's EnvWrapper does for Env. A wrapper overrides what it changes;
// one that must survive a Shrink overrides Shrink to wrap the shrunk
// communicator again (this one returns it bare).
//
// Thread-safety: that of the wrapped communicator.
#ifndef MUSTER_TRAINER_COMM_FORWARDING_H_
#define MUSTER_TRAINER_COMM_FORWARDING_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "trainer/comm/communicator.h"

namespace muster {

class ForwardingCommunicator : public Communicator {
 public:
  explicit ForwardingCommunicator(std::unique_ptr<Communicator> inner)
      : inner_(std::move(inner)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string name() const override { return inner_->name(); }
  MemorySpace memory() const override { return inner_->memory(); }
  absl::Status AllReduce(void* data, size_t count, DataType type, ReduceOp op,
                         absl::Time deadline) override {
    return inner_->AllReduce(data, count, type, op, deadline);
  }
  absl::Status AllReduceGradients(void* data, size_t count, ReduceOp op,
                                  absl::Time deadline) override {
    return inner_->AllReduceGradients(data, count, op, deadline);
  }
  DataType gradient_wire() const override { return inner_->gradient_wire(); }
  absl::Status ReduceScatter(void* data, const std::vector<size_t>& counts, DataType type,
                             ReduceOp op, absl::Time deadline) override {
    return inner_->ReduceScatter(data, counts, type, op, deadline);
  }
  absl::Status ReduceScatterGradients(void* data, const std::vector<size_t>& counts,
                                      ReduceOp op, absl::Time deadline) override {
    return inner_->ReduceScatterGradients(data, counts, op, deadline);
  }
  // ReduceColumnsGradients is not forwarded: its default reduces through
  // this wrapper's AllReduceGradients, which a wrapper may change
  // (compressed.h); a wrapper that changes nothing forwards it itself.
  absl::Status AllGather(void* data, const std::vector<size_t>& counts, DataType type,
                         absl::Time deadline) override {
    return inner_->AllGather(data, counts, type, deadline);
  }
  std::vector<int> NodeRanks() const override { return inner_->NodeRanks(); }
  absl::Status AllGatherInNode(void* data, const std::vector<size_t>& counts, DataType type,
                               absl::Time deadline) override {
    return inner_->AllGatherInNode(data, counts, type, deadline);
  }
  absl::Status Broadcast(void* data, size_t count, DataType type, int root,
                         absl::Time deadline) override {
    return inner_->Broadcast(data, count, type, root, deadline);
  }
  absl::Status Barrier(absl::Time deadline) override { return inner_->Barrier(deadline); }
  std::vector<int> Unreachable() override { return inner_->Unreachable(); }
  void Abort(const absl::Status& why) override { inner_->Abort(why); }
  std::unique_ptr<Communicator> ReleaseNodeCommunicator(bool* touched) override {
    return inner_->ReleaseNodeCommunicator(touched);
  }
  bool CanShrink() const override { return inner_->CanShrink(); }
  absl::Status ReadyToShrink(absl::Time deadline) override {
    return inner_->ReadyToShrink(deadline);
  }
  absl::StatusOr<std::unique_ptr<Communicator>> Shrink(const std::vector<int>& excluded,
                                                       absl::Time deadline) override {
    return inner_->Shrink(excluded, deadline);
  }

 protected:
  Communicator* inner() const { return inner_.get(); }

 private:
  std::unique_ptr<Communicator> inner_;
};

}  // namespace muster

#endif  // MUSTER_TRAINER_COMM_FORWARDING_H_
