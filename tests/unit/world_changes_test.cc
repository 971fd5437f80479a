// WorldChanges: what a trainer does between worlds, decided over a
// recording trainer and a communicator that stands in for the other ranks
// (it adds their sums), on a fake clock: the state transfer and its
// deadline, who contributes to a failed step's salvage, who takes it and who
// catches up, what a broken world reports, and the collective deadline.
#include "trainer/elastic/world_changes.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "common/fake_clock.h"
#include "trainer/client/coordinator_client.h"

namespace muster {
namespace {

// Rank `rank` of `size`; the other ranks are `others`: each float64
// all-reduce adds the next of them (their sum), none when there is none
// left. Records what this rank sent and each collective's deadline.
class PeerSumsCommunicator : public Communicator {
 public:
  PeerSumsCommunicator(int rank, int size) : rank_(rank), size_(size) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "peer-sums"; }
  absl::Status AllReduce(void* data, size_t count, DataType type, ReduceOp,
                         absl::Time deadline) override {
    deadlines.push_back(deadline);
    if (type != DataType::kFloat64) return absl::InvalidArgumentError("float64 only");
    double* values = static_cast<double*>(data);
    sent.emplace_back(values, values + count);
    if (others.empty()) return absl::OkStatus();
    const std::vector<double> theirs = others.front();
    others.pop_front();
    if (theirs.size() != count) return absl::InvalidArgumentError("not the others' count");
    for (size_t i = 0; i < count; ++i) values[i] += theirs[i];
    return absl::OkStatus();
  }
  absl::Status ReduceScatter(void*, const std::vector<size_t>&, DataType, ReduceOp,
                             absl::Time) override {
    return absl::UnimplementedError("ReduceScatter");
  }
  absl::Status AllGather(void*, const std::vector<size_t>&, DataType, absl::Time) override {
    return absl::UnimplementedError("AllGather");
  }
  absl::Status Broadcast(void*, size_t, DataType, int, absl::Time) override {
    return absl::UnimplementedError("Broadcast");
  }
  absl::Status Barrier(absl::Time) override { return absl::UnimplementedError("Barrier"); }
  void Abort(const absl::Status&) override {}

  std::deque<std::vector<double>> others;
  std::vector<std::vector<double>> sent;
  std::vector<absl::Time> deadlines;

 private:
  const int rank_;
  const int size_;
};

// The membership, the tensors and the trainer at once: enters `world`
// through `comm` whenever asked, and records every move.
class RecordingTrainer : public WorldChanges::Membership,
                         public WorldChanges::Tensors,
                         public WorldChanges::Trainer {
 public:
  explicit RecordingTrainer(const TrainingCounters* counters) : counters_(counters) {}

  absl::Status EnterFirst(int64_t step, const WorldChanges::EnterFn& enter) override {
    calls.push_back("EnterFirst");
    entered_at_step = step;
    return enter(comm, world);
  }
  absl::Status Regroup(const std::string& why, int64_t step, const WorldChanges::EnterFn& enter,
                       const BrokenWorld* broken) override {
    calls.push_back("Regroup");
    regroup_why = why;
    entered_at_step = step;
    report = broken != nullptr ? std::optional<BrokenWorld>(*broken) : std::nullopt;
    return enter(comm, world);
  }
  bool told_to_leave() const override { return drained; }
  bool newer_world_known() const override { return newer; }
  void ReportCounters(const TrainingCounters& c) override {
    calls.push_back("ReportCounters");
    reported.push_back(c);
  }
  absl::Status EnterWorld(Communicator*, const WorldInfo&, int64_t,
                          const std::optional<FailedStepMark>&,
                          absl::Time) override {
    calls.push_back("EnterWorld");
    return enter_world;
  }
  absl::Status TakeState(int source, Communicator*, bool in_step, TrainingCounters* counters,
                         absl::Time deadline) override {
    calls.push_back("TakeState");
    state_sources.push_back(source);
    state_in_step.push_back(in_step);
    state_deadlines.push_back(deadline);
    if (source_counters) *counters = *source_counters;
    return absl::OkStatus();
  }
  absl::Status CatchUpShards(Communicator*, bool stepped, absl::Time) override {
    calls.push_back(stepped ? "CatchUpShards(stepped)" : "CatchUpShards");
    return absl::OkStatus();
  }
  void UseCommunicator(Communicator* c) override {
    calls.push_back(c == nullptr ? "UseCommunicator(null)" : "UseCommunicator");
  }
  absl::StatusOr<WorldChanges::ControlAverages> ResyncGradients(Communicator*, bool contribute,
                                                                int contributors,
                                                                const ControlWords&,
                                                                absl::Time) override {
    calls.push_back("ResyncGradients");
    resync_contributed = contribute;
    resync_contributors = contributors;
    return averages;
  }
  void BeforeSalvagedStep() override {
    calls.push_back("BeforeSalvagedStep");
    step_before_salvage = counters_->step;
  }
  absl::Status StateLost(const absl::Status& lost) override {
    calls.push_back("StateLost");
    if (!restores) return lost;
    enter_world = absl::OkStatus();  // restored: the entry made again finds the state
    return absl::OkStatus();
  }
  absl::Status StepSalvaged(const SalvagedStep& step) override {
    if (!step.in_step) {
      calls.push_back("StepTakenByOthers");
      taken_by_others.push_back(step.next);
      return absl::OkStatus();
    }
    calls.push_back("StepSalvaged");
    salvaged.push_back(step);
    return absl::OkStatus();
  }

  // What the next world is, and what its other members hold.
  Communicator* comm = nullptr;
  WorldInfo world;
  std::optional<TrainingCounters> source_counters;  // else this rank's own stay
  WorldChanges::ControlAverages averages = {0, 0, 0};
  bool drained = false;
  bool newer = false;

  // What happened.
  std::vector<std::string> calls;
  absl::Status enter_world;  // what EnterWorld returns
  bool restores = false;     // StateLost restores the state (else returns the loss)
  int64_t entered_at_step = -1;
  std::string regroup_why;
  std::optional<BrokenWorld> report;
  std::vector<TrainingCounters> reported;
  std::vector<int> state_sources;
  std::vector<bool> state_in_step;
  std::vector<absl::Time> state_deadlines;
  bool resync_contributed = false;
  int resync_contributors = 0;
  std::vector<StepDecision> taken_by_others;
  int64_t step_before_salvage = -1;
  std::vector<SalvagedStep> salvaged;

 private:
  const TrainingCounters* const counters_;
};

WorldInfo WorldOf(uint64_t generation, int rank, int size, int source) {
  WorldInfo w;
  w.generation = generation;
  w.rank = rank;
  w.world_size = size;
  w.state_source_rank = source;
  return w;
}

// One contributor's words of AgreeOnSalvage's first all-reduce, in a new
// world of `world` ranks: its old `generation` and world size, and which
// ranks of the new world are in the step.
std::vector<double> Claims(int contributors, double generation, double old_world,
                           const std::vector<int>& in_step, int world) {
  std::vector<double> head(5 + static_cast<size_t>(world), 0.0);
  head[0] = contributors;
  head[1] = contributors * generation;
  head[2] = contributors * generation * generation;
  head[3] = contributors * old_world;
  head[4] = contributors * old_world * old_world;
  for (int r : in_step) head[5 + r] = 1;
  return head;
}

constexpr int kBatch = 4;
constexpr int64_t kDataset = 1000;

class WorldChangesTest : public ::testing::Test {
 protected:
  void Make(bool salvage = true, absl::Duration fixed = absl::Seconds(7),
            bool several_passes = false) {
    WorldChangesOptions o;
    o.salvage = salvage;
    o.several_passes = several_passes;
    o.batch_per_rank = kBatch;
    o.deadline.fixed = fixed;
    o.clock = &clock_;
    changes_ = std::make_unique<WorldChanges>(o, &trainer_, &trainer_, &trainer_, &counters_,
                                              &sampler_);
  }
  // This rank is at `step`, its sampler where that many global batches of
  // `world` ranks took it.
  void AtStep(int64_t step, int world) {
    counters_.step = step;
    counters_.position.offset = step * world * kBatch;
    counters_.lr_world_size = world;
  }
  void EnterNext(uint64_t generation, int rank, int size, int source) {
    comm_ = std::make_unique<PeerSumsCommunicator>(rank, size);
    trainer_.comm = comm_.get();
    trainer_.world = WorldOf(generation, rank, size, source);
  }

  FakeClock clock_;
  TrainingCounters counters_;
  DistributedSampler sampler_{kDataset, /*seed=*/7};
  RecordingTrainer trainer_{&counters_};
  std::unique_ptr<PeerSumsCommunicator> comm_;
  std::unique_ptr<WorldChanges> changes_;
};

TEST_F(WorldChangesTest, EnteringAWorldTakesTheSourcesStateWithinTheLongDeadline) {
  Make();
  EnterNext(/*generation=*/1, /*rank=*/0, /*size=*/2, /*source=*/1);
  ASSERT_TRUE(changes_->EnterFirst().ok());
  EXPECT_EQ(trainer_.entered_at_step, 0);
  EXPECT_EQ(trainer_.state_sources, std::vector<int>{1});
  // A state transfer waits as long as a communicator's build (cold: 120 s).
  const absl::Time long_deadline = clock_.Now() + absl::Seconds(120);
  EXPECT_EQ(trainer_.state_deadlines, std::vector<absl::Time>{long_deadline});
  EXPECT_EQ(changes_->LongDeadline(), long_deadline);
  // The salvage agreement ran (one all-reduce: nothing to salvage).
  EXPECT_EQ(comm_->deadlines, std::vector<absl::Time>{long_deadline});
  EXPECT_EQ(trainer_.calls, (std::vector<std::string>{"EnterFirst", "EnterWorld", "TakeState",
                                                     "UseCommunicator", "ReportCounters"}));
  EXPECT_EQ(counters_.lr_world_size, 2);  // the first world sets it
}

// A part of the state lost with its ranks (EnterWorld's NOT_FOUND) is the
// trainer's to restore (a checkpoint), and the world is entered again (where
// the sharded part is read) before the transfer; where it cannot,
// entering fails with the loss. Any other error of EnterWorld is not a loss.
TEST_F(WorldChangesTest, AStateLostOnEnteringIsRestoredByTheTrainerBeforeTheTransfer) {
  Make();
  trainer_.enter_world = absl::NotFoundError("shard 3 has no living holder");
  trainer_.restores = true;
  EnterNext(/*generation=*/1, /*rank=*/0, /*size=*/2, /*source=*/1);
  ASSERT_TRUE(changes_->EnterFirst().ok());
  EXPECT_EQ(trainer_.calls,
            (std::vector<std::string>{"EnterFirst", "EnterWorld", "StateLost", "EnterWorld",
                                      "TakeState", "UseCommunicator", "ReportCounters"}));
  trainer_.calls.clear();
  trainer_.restores = false;
  trainer_.enter_world = absl::NotFoundError("shard 3 has no living holder");
  EnterNext(/*generation=*/2, /*rank=*/0, /*size=*/2, /*source=*/1);
  const absl::Status lost = changes_->EnterFirst();
  EXPECT_TRUE(absl::IsNotFound(lost)) << lost;
  trainer_.calls.clear();
  trainer_.enter_world = absl::DeadlineExceededError("peer gone");
  EnterNext(/*generation=*/3, /*rank=*/0, /*size=*/2, /*source=*/1);
  EXPECT_TRUE(absl::IsDeadlineExceeded(changes_->EnterFirst()));
  EXPECT_EQ(trainer_.calls, (std::vector<std::string>{"EnterFirst", "EnterWorld"}));
}

// A rank whose step failed, in a world whose lost state came back from a
// checkpoint: the others may have taken that step before the death, and
// every rank now holds the checkpoint's state, so the step is not salvaged
// (this rank claims no share); the engine then drops it.
TEST_F(WorldChangesTest, AFailedStepIsNotSalvagedFromAStateACheckpointReplaced) {
  Make();
  AtStep(/*step=*/40, /*world=*/4);
  changes_->KeepFailedStep(WorldOf(/*generation=*/1, /*rank=*/2, /*size=*/4, /*source=*/0));
  trainer_.enter_world = absl::NotFoundError("shard 3 has no living holder");
  trainer_.restores = true;
  EnterNext(/*generation=*/2, /*rank=*/2, /*size=*/3, /*source=*/0);
  comm_->others = {Claims(0, 1, 4, {}, 3)};
  ASSERT_TRUE(changes_->Regroup("shared memory communicator aborted", true).ok());
  ASSERT_FALSE(comm_->sent.empty());
  EXPECT_EQ(comm_->sent[0][0], 0.0);  // no share claimed
  EXPECT_EQ(std::count(trainer_.calls.begin(), trainer_.calls.end(), "ResyncGradients"), 0);
  EXPECT_TRUE(trainer_.salvaged.empty());
  EXPECT_EQ(counters_.step, 40);
}

TEST_F(WorldChangesTest, TheLearningRatesKeepTheirWorldUnlessTheyScale) {
  Make();
  AtStep(/*step=*/3, /*world=*/4);
  EnterNext(/*generation=*/2, /*rank=*/0, /*size=*/2, /*source=*/0);
  ASSERT_TRUE(changes_->Regroup("a membership change at a step boundary", false).ok());
  EXPECT_EQ(counters_.lr_world_size, 4);

  WorldChangesOptions o;
  o.scale_lr = true;
  o.clock = &clock_;
  WorldChanges scaling(o, &trainer_, &trainer_, &trainer_, &counters_, &sampler_);
  ASSERT_TRUE(scaling.Regroup("a membership change at a step boundary", false).ok());
  EXPECT_EQ(counters_.lr_world_size, 2);
}

TEST_F(WorldChangesTest, ARegroupAtAStepBoundaryReportsNoBrokenWorld) {
  Make();
  AtStep(/*step=*/3, /*world=*/2);
  EnterNext(/*generation=*/2, /*rank=*/0, /*size=*/3, /*source=*/0);
  ASSERT_TRUE(changes_->Regroup("a membership change at a step boundary", false).ok());
  EXPECT_FALSE(trainer_.report.has_value());
  EXPECT_EQ(trainer_.entered_at_step, 3);
  // Gradients leave the old communicator before anything else.
  ASSERT_FALSE(trainer_.calls.empty());
  EXPECT_EQ(trainer_.calls.front(), "UseCommunicator(null)");
}

TEST_F(WorldChangesTest, ABrokenWorldIsReportedWithTheStepsTimeout) {
  Make(/*salvage=*/true, /*fixed=*/absl::Seconds(7));
  EnterNext(/*generation=*/2, /*rank=*/0, /*size=*/1, /*source=*/0);
  ASSERT_TRUE(changes_->Regroup("gloo: Read error: Connection reset", true).ok());
  ASSERT_TRUE(trainer_.report.has_value());
  EXPECT_EQ(trainer_.report->reason, "gloo: Read error: Connection reset");
  EXPECT_EQ(trainer_.report->deadline, absl::Seconds(7));
  EXPECT_EQ(trainer_.regroup_why, "gloo: Read error: Connection reset");
}

// Rank 0 of three fails in step 6 with rank 1; rank 2 died. The new world
// is the two survivors: both hold the gradient, rank 2's share is lost.
TEST_F(WorldChangesTest, AFailedStepIsSalvagedAndItsLostShareGoesBackToTheSampler) {
  Make();
  AtStep(/*step=*/5, /*world=*/3);
  const SamplerPosition before = counters_.position;
  changes_->KeepFailedStep(WorldOf(/*generation=*/3, /*rank=*/0, /*size=*/3, /*source=*/0));
  EnterNext(/*generation=*/4, /*rank=*/0, /*size=*/2, /*source=*/0);
  comm_->others = {Claims(1, 3, 3, {1}, 2), {0, 1, 0}};
  ASSERT_TRUE(changes_->Regroup("gloo: Connection reset", true).ok());

  EXPECT_TRUE(trainer_.resync_contributed);
  EXPECT_EQ(trainer_.resync_contributors, 2);
  EXPECT_EQ(trainer_.step_before_salvage, 5);  // its rates are the step's
  EXPECT_EQ(counters_.step, 6);
  DistributedSampler reference(kDataset, /*seed=*/7);
  const SampledBatch taken = reference.Next(before, 3, 0, kBatch);
  const SamplerPosition expected = reference.Advance(before, taken, 3, kBatch, {2});
  EXPECT_EQ(counters_.position, expected);
  EXPECT_EQ(counters_.position.returned.size(), static_cast<size_t>(kBatch));
  ASSERT_EQ(trainer_.salvaged.size(), 1u);
  EXPECT_TRUE(trainer_.salvaged[0].contributed);
  EXPECT_EQ(trainer_.salvaged[0].catch_up_from, -1);  // every rank took it
  EXPECT_EQ(trainer_.salvaged[0].next, StepDecision::kContinue);
  ASSERT_FALSE(trainer_.reported.empty());
  EXPECT_EQ(trainer_.reported.back(), counters_);  // the heartbeats say step 6
  EXPECT_EQ(changes_->salvaged(), 1);
  EXPECT_EQ(changes_->dropped(), 0);
  EXPECT_FALSE(changes_->has_failed_step());
  // The transfer knew a step had failed under this rank (its buffers).
  EXPECT_EQ(trainer_.state_in_step, std::vector<bool>{true});
}

// The same step, but a spare joined as rank 2 of the new world: it was not
// in the step, so at the step's boundary every rank takes the state of the
// first rank that was.
TEST_F(WorldChangesTest, WhenSomeRanksWereNotInTheStepTheyCatchUpFromTheFirstThatWas) {
  Make();
  AtStep(/*step=*/5, /*world=*/3);
  changes_->KeepFailedStep(WorldOf(/*generation=*/3, /*rank=*/1, /*size=*/3, /*source=*/0));
  EnterNext(/*generation=*/4, /*rank=*/1, /*size=*/3, /*source=*/0);
  comm_->others = {Claims(1, 3, 3, {0}, 3), {1, 0, 0}};
  trainer_.averages = {0, 0, 1.0f / 3};  // someone heard of a newer world
  ASSERT_TRUE(changes_->Regroup("gloo: Connection reset", true).ok());

  ASSERT_EQ(trainer_.salvaged.size(), 1u);
  EXPECT_EQ(trainer_.salvaged[0].catch_up_from, 0);
  EXPECT_EQ(trainer_.salvaged[0].next, StepDecision::kRegroup);
  EXPECT_EQ(changes_->salvaged(), 1);
}

TEST_F(WorldChangesTest, AJoinerTakesTheSalvagedStepFromARankInIt) {
  Make();
  EnterNext(/*generation=*/4, /*rank=*/2, /*size=*/3, /*source=*/0);
  TrainingCounters source;
  source.step = 5;
  source.position.offset = 5 * 3 * kBatch;
  source.lr_world_size = 3;
  trainer_.source_counters = source;
  comm_->others = {Claims(2, 3, 3, {0, 1}, 3), {1, 1, 0}};
  ASSERT_TRUE(changes_->EnterFirst().ok());

  EXPECT_FALSE(trainer_.resync_contributed);  // it adds zeros
  EXPECT_EQ(trainer_.resync_contributors, 2);
  EXPECT_EQ(trainer_.taken_by_others, std::vector<StepDecision>{StepDecision::kContinue});
  EXPECT_TRUE(trainer_.salvaged.empty());
  // The entry's transfer, then the catch-up from rank 0 after its boundary
  // is due.
  EXPECT_EQ(trainer_.state_sources, (std::vector<int>{0, 0}));
  EXPECT_EQ(trainer_.state_in_step, (std::vector<bool>{false, false}));
  const std::vector<std::string> tail(trainer_.calls.end() - 4, trainer_.calls.end());
  EXPECT_EQ(tail, (std::vector<std::string>{"StepTakenByOthers", "CatchUpShards", "TakeState",
                                            "ReportCounters"}));
  EXPECT_EQ(changes_->salvaged(), 0);  // the ranks in the step count it
}

// The state source had finished the step (it completed on some ranks only,
// or the world took it while this rank was stopped and fenced): this
// rank's gradient is of a step the world is past. It is discarded, and not
// counted as a dropped step: the transfer brought the step's result.
TEST_F(WorldChangesTest, AGradientOfAStepTheWorldIsPastDoesNotContribute) {
  Make();
  AtStep(/*step=*/5, /*world=*/2);
  changes_->KeepFailedStep(WorldOf(/*generation=*/3, /*rank=*/0, /*size=*/2, /*source=*/0));
  TrainingCounters source = counters_;
  source.step = 6;
  source.position.offset += 2 * kBatch;
  trainer_.source_counters = source;
  EnterNext(/*generation=*/4, /*rank=*/0, /*size=*/1, /*source=*/0);
  ASSERT_TRUE(changes_->Regroup("gloo collective passed its deadline", true).ok());

  ASSERT_FALSE(comm_->sent.empty());
  EXPECT_EQ(comm_->sent[0][0], 0.0);  // not a contributor
  EXPECT_TRUE(trainer_.salvaged.empty());
  EXPECT_TRUE(changes_->has_failed_step());  // the engine ends it
  const absl::Status ended = changes_->EndFailedStep("step 6", absl::DeadlineExceededError("late"),
                                                     /*left=*/false, /*generation=*/4);
  EXPECT_TRUE(absl::IsAborted(ended));
  EXPECT_EQ(ended.message(), "step 6 taken without this rank: late");  // nothing lost
  EXPECT_FALSE(changes_->has_failed_step());
  EXPECT_EQ(changes_->dropped(), 0);
  EXPECT_EQ(changes_->salvaged(), 0);
}

TEST_F(WorldChangesTest, WithoutSalvageAFailedStepIsDropped) {
  Make(/*salvage=*/false);
  AtStep(/*step=*/5, /*world=*/2);
  changes_->KeepFailedStep(WorldOf(/*generation=*/3, /*rank=*/0, /*size=*/2, /*source=*/0));
  EnterNext(/*generation=*/4, /*rank=*/0, /*size=*/1, /*source=*/0);
  ASSERT_TRUE(changes_->Regroup("gloo: Connection reset", true).ok());
  ASSERT_FALSE(comm_->sent.empty());
  EXPECT_EQ(comm_->sent[0][0], 0.0);
  EXPECT_EQ(counters_.step, 5);
  EXPECT_TRUE(trainer_.salvaged.empty());
  const absl::Status ended = changes_->EndFailedStep(
      "step 6", absl::UnavailableError("gloo: Connection reset"), /*left=*/false, 4);
  EXPECT_TRUE(absl::IsAborted(ended));
  EXPECT_EQ(ended.message(), "step 6 dropped: gloo: Connection reset");
  EXPECT_EQ(changes_->dropped(), 1);
}

TEST_F(WorldChangesTest, AFailedStepOfAMemberThatLeftIsNotCountedAsDropped) {
  Make(/*salvage=*/false);
  AtStep(/*step=*/5, /*world=*/2);
  changes_->KeepFailedStep(WorldOf(/*generation=*/3, /*rank=*/0, /*size=*/2, /*source=*/0));
  const absl::Status ended = changes_->EndFailedStep(
      "step 6", absl::UnavailableError("gloo: Connection reset"), /*left=*/true, 3);
  EXPECT_TRUE(absl::IsAborted(ended));
  EXPECT_EQ(ended.message(), "step 6 not taken: this member left the job");
  EXPECT_FALSE(changes_->has_failed_step());
  EXPECT_EQ(changes_->dropped(), 0);
}

// Steps of several passes (a GAN's discriminator pass, then its
// generator's): rank 0 of three fails in the second pass of step 6, with
// rank 1; rank 2 died. The pass is salvaged; the step itself ends at its
// boundary (the engine), where rank 2's examples go back to the sampler.
TEST_F(WorldChangesTest, APassIsSalvagedAndTheStepEndsAtItsBoundary) {
  Make(/*salvage=*/true, absl::Seconds(7), /*several_passes=*/true);
  AtStep(/*step=*/5, /*world=*/3);
  counters_.pass = 1;
  const SamplerPosition before = counters_.position;
  changes_->KeepFailedStep(WorldOf(/*generation=*/3, /*rank=*/0, /*size=*/3, /*source=*/0));
  EnterNext(/*generation=*/4, /*rank=*/0, /*size=*/2, /*source=*/0);
  comm_->others = {Claims(1, 3, 3, {1}, 2), {0, 1, 0}};
  ASSERT_TRUE(changes_->Regroup("gloo: Connection reset", true).ok());

  EXPECT_TRUE(trainer_.resync_contributed);
  EXPECT_EQ(trainer_.resync_contributors, 2);
  EXPECT_EQ(counters_.step, 5);
  EXPECT_EQ(counters_.pass, 2);
  EXPECT_EQ(counters_.position, before);
  ASSERT_EQ(trainer_.salvaged.size(), 1u);
  EXPECT_EQ(trainer_.salvaged[0].lost, std::vector<int>{2});
  EXPECT_EQ(trainer_.salvaged[0].catch_up_from, -1);
  EXPECT_EQ(changes_->salvaged(), 1);
}

// A spare joined as rank 2: it is outside the pass and would wait at the
// step's boundary while the others reduce the next pass. Nothing is
// salvaged, and the step begins again with no pass done, on every rank.
TEST_F(WorldChangesTest, WithSeveralPassesARankOutsideThePassMeansThePassIsDropped) {
  Make(/*salvage=*/true, absl::Seconds(7), /*several_passes=*/true);
  AtStep(/*step=*/5, /*world=*/3);
  counters_.pass = 1;
  changes_->KeepFailedStep(WorldOf(/*generation=*/3, /*rank=*/1, /*size=*/3, /*source=*/0));
  EnterNext(/*generation=*/4, /*rank=*/1, /*size=*/3, /*source=*/0);
  comm_->others = {Claims(1, 3, 3, {0}, 3), {1, 0, 0}};
  ASSERT_TRUE(changes_->Regroup("gloo: Connection reset", true).ok());

  EXPECT_EQ(std::count(trainer_.calls.begin(), trainer_.calls.end(), "ResyncGradients"), 0);
  EXPECT_TRUE(trainer_.salvaged.empty());
  EXPECT_EQ(counters_.pass, 0);
  EXPECT_EQ(counters_.step, 5);
  EXPECT_TRUE(changes_->has_failed_step());  // the engine drops it
}

// The state source is a pass ahead (its reduce of this pass completed):
// this rank's gradient is of a pass the world is past.
TEST_F(WorldChangesTest, WithSeveralPassesAGradientOfAPassTheWorldIsPastDoesNotContribute) {
  Make(/*salvage=*/true, absl::Seconds(7), /*several_passes=*/true);
  AtStep(/*step=*/5, /*world=*/2);
  changes_->KeepFailedStep(WorldOf(/*generation=*/3, /*rank=*/0, /*size=*/2, /*source=*/0));
  TrainingCounters source = counters_;
  source.pass = 1;
  trainer_.source_counters = source;
  EnterNext(/*generation=*/4, /*rank=*/0, /*size=*/1, /*source=*/0);
  ASSERT_TRUE(changes_->Regroup("gloo collective passed its deadline", true).ok());

  ASSERT_FALSE(comm_->sent.empty());
  EXPECT_EQ(comm_->sent[0][0], 0.0);  // not a contributor
  EXPECT_TRUE(trainer_.salvaged.empty());
  EXPECT_EQ(counters_.pass, 0);
}

// A step of several passes that a world change already came into (a pass
// of it was salvaged) is not salvaged a second time.
TEST_F(WorldChangesTest, AStepKeptAsNotSalvageableDoesNotContribute) {
  Make(/*salvage=*/true, absl::Seconds(7), /*several_passes=*/true);
  AtStep(/*step=*/5, /*world=*/2);
  changes_->KeepFailedStep(WorldOf(/*generation=*/3, /*rank=*/0, /*size=*/2, /*source=*/0),
                           /*salvageable=*/false);
  EnterNext(/*generation=*/4, /*rank=*/0, /*size=*/1, /*source=*/0);
  ASSERT_TRUE(changes_->Regroup("gloo: Connection reset", true).ok());
  ASSERT_FALSE(comm_->sent.empty());
  EXPECT_EQ(comm_->sent[0][0], 0.0);
  EXPECT_TRUE(trainer_.salvaged.empty());
}

TEST_F(WorldChangesTest, TheStepDeadlineFollowsTheJobOnTheInjectedClock) {
  Make(/*salvage=*/true, /*fixed=*/absl::ZeroDuration());
  EXPECT_EQ(changes_->StepDeadline(), clock_.Now() + absl::Seconds(120));  // cold
  changes_->StepCommitted();  // the first step has no boundary before it
  for (int i = 0; i < 3; ++i) {
    clock_.Advance(absl::Seconds(2));
    changes_->StepCommitted();
  }
  EXPECT_EQ(changes_->step_timeout(), absl::Seconds(20));  // 10 x the slowest step
  EXPECT_EQ(changes_->StepDeadline(), clock_.Now() + absl::Seconds(20));
  EXPECT_EQ(changes_->LongDeadline(), clock_.Now() + absl::Seconds(120));

  // A step that spans a regroup is not timed; the next one is.
  EnterNext(/*generation=*/2, /*rank=*/0, /*size=*/1, /*source=*/0);
  ASSERT_TRUE(changes_->Regroup("gloo: Connection reset", true).ok());
  ASSERT_TRUE(trainer_.report.has_value());
  EXPECT_EQ(trainer_.report->deadline, absl::Seconds(20));
  clock_.Advance(absl::Seconds(300));
  changes_->StepCommitted();
  EXPECT_EQ(changes_->step_timeout(), absl::Seconds(20));
  clock_.Advance(absl::Seconds(3));
  changes_->StepCommitted();
  EXPECT_EQ(changes_->step_timeout(), absl::Seconds(30));
}

TEST_F(WorldChangesTest, TheControlWordsSayWhatThisRankWasAskedAndWhatItHeard) {
  bool stop = false, leave = false;
  WorldChangesOptions o;
  o.clock = &clock_;
  o.stop_asked = [&] { return stop; };
  o.leave_asked = [&] { return leave; };
  o.stop_after_step = 6;
  WorldChanges changes(o, &trainer_, &trainer_, &trainer_, &counters_, &sampler_);
  AtStep(/*step=*/4, /*world=*/2);
  ControlWords w = changes.CurrentControl();
  EXPECT_FALSE(w.stop || w.leave || w.newer_world);
  AtStep(/*step=*/5, /*world=*/2);  // the step after it is the sixth
  EXPECT_TRUE(changes.CurrentControl().stop);
  AtStep(/*step=*/1, /*world=*/2);
  stop = true;
  EXPECT_TRUE(changes.CurrentControl().stop);
  stop = false;
  leave = true;
  w = changes.CurrentControl();
  EXPECT_TRUE(w.leave && !w.stop);
  leave = false;
  trainer_.drained = true;  // the coordinator drains this member
  EXPECT_TRUE(changes.CurrentControl().leave);
  trainer_.newer = true;
  EXPECT_TRUE(changes.CurrentControl().newer_world);
}

}  // namespace
}  // namespace muster
