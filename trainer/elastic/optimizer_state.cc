#include "trainer/elastic/optimizer_state.h"

#include <utility>

#include "trainer/elastic/sharded_optimizer_state.h"
#include "trainer/elastic/state_sync.h"

namespace muster {
namespace {

// Every rank keeps the whole state, as an unsharded run does: nothing
// moves but through the state transfer, and a pass reduces through the
// replica's syncs into the .grad the optimizers step.
class WholeOptimizerState : public OptimizerState {
 public:
  explicit WholeOptimizerState(const TrainingState& state) : state_(state) {}

  bool sharding() const override { return false; }
  bool sharded() const override { return false; }
  absl::Status Check() const override { return absl::OkStatus(); }

  absl::Status ForStep(Communicator*) override { return absl::OkStatus(); }
  absl::Status BetweenPasses(Communicator*, absl::Time) override { return absl::OkStatus(); }
  absl::Status AtBoundary(Communicator*, absl::Time) override { return absl::OkStatus(); }
  absl::Status MakeWhole(Communicator*, absl::Time) override { return absl::OkStatus(); }

  GradientSync* PassSync(const std::vector<torch::Tensor>&) override { return nullptr; }
  GradientSync* ResyncSync(const std::vector<torch::Tensor>&) override { return nullptr; }
  GradientSync* sync() const override { return nullptr; }
  absl::Status AllowsTrainedChange(const std::string&) const override { return absl::OkStatus(); }
  bool Reduced(const GradientSync*) override { return false; }
  double KeptGradientSquares() const override { return 0; }
  void ScaleKeptGradients(double) override {}

  void UseCommunicator(Communicator*) override {}
  absl::Status Enter(Communicator*, const WorldInfo&, int64_t, const std::optional<FailedStepMark>&,
                     absl::Time) override {
    return absl::OkStatus();
  }
  TrainingState Transferred() const override { return state_; }
  void StateTransferred() override {}
  absl::Status CatchUp(Communicator*, bool, absl::Time) override { return absl::OkStatus(); }
  bool GoesAlong(int) const override { return false; }
  bool CanHandOver(int) const override { return false; }
  absl::Status HandOver(Communicator*, bool, absl::Time) override { return absl::OkStatus(); }
  void Release() override {}
  void Close() override {}

  void LoadAtEntry(int64_t, std::vector<ShardFileRef>, FileSystem*) override {}
  absl::StatusOr<OwnShardState> OwnShard() const override {
    return absl::FailedPreconditionError("the optimizer state is not sharded");
  }
  absl::Status CheckAgrees(const std::vector<int64_t>& counters, Communicator* comm,
                           absl::Time deadline) const override {
    return CheckRanksAgree(state_, counters, comm, deadline);
  }
  int64_t StateElements() const override {
    return OptimizerShards::WholeStateElements(OptimizersOf(state_)).value_or(-1);
  }

 private:
  const TrainingState state_;
};

}  // namespace

std::vector<torch::optim::Optimizer*> OptimizersOf(const TrainingState& state) {
  std::vector<torch::optim::Optimizer*> optimizers;
  for (const TrainingState::Optimizer& o : state.optimizers) optimizers.push_back(o.optimizer);
  return optimizers;
}

std::unique_ptr<OptimizerState> OptimizerState::Make(const TrainingState& state,
                                                     OptimizerStateOptions options) {
  if (options.copies > 0) return std::make_unique<ShardedOptimizerState>(state, std::move(options));
  return std::make_unique<WholeOptimizerState>(state);
}

}  // namespace muster
