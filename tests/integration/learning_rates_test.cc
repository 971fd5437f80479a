// The learning rates a program sets itself (no Options::lr_schedule) are
// training state: CarryLearningRates' blob saves and restores them exactly,
// and the ranks' agreement check names them first where they differ.
// (Through a kill and a stop, as processes: library_test.cc,
// ProgramRateTest.)
#include "trainer/lib/learning_rates.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/integration/comm_world.h"
#include "trainer/elastic/state_sync.h"

namespace muster {
namespace {

double Rate(const torch::optim::Optimizer& o, size_t group) {
  return o.param_groups()[group].options().get_lr();
}

const Blob& RatesBlob(const TrainingState& ts) {
  for (const Blob& b : ts.blobs) {
    if (b.name == kLearningRatesBlob) return b;
  }
  ADD_FAILURE() << "no " << kLearningRatesBlob << " blob";
  return ts.blobs.front();
}

// Two groups, one lowered by the program to a rate no decimal writes
// exactly: another optimizer of the same groups takes both back bit for
// bit. Bytes for another number of groups are refused and change nothing.
TEST(LearningRatesTest, TheRatesTheProgramSetGoAndComeBackExactly) {
  torch::nn::Linear a(3, 2), b(3, 2);
  const auto groups = [](torch::nn::Linear& m) {
    std::vector<torch::optim::OptimizerParamGroup> g;
    g.emplace_back(std::vector<torch::Tensor>{m->weight});
    g.emplace_back(std::vector<torch::Tensor>{m->bias},
                   std::make_unique<torch::optim::SGDOptions>(0.5));
    return g;
  };
  torch::optim::SGD from(groups(a), torch::optim::SGDOptions(0.1));
  torch::optim::SGD to(groups(b), torch::optim::SGDOptions(0.1));
  from.param_groups()[0].options().set_lr(0.1 / 3);
  TrainingState ts_from = TrainingState::Of(a.ptr().get(), &from);
  TrainingState ts_to = TrainingState::Of(b.ptr().get(), &to);
  ASSERT_TRUE(CarryLearningRates(&ts_from).ok());
  ASSERT_TRUE(CarryLearningRates(&ts_to).ok());
  const std::string bytes = RatesBlob(ts_from).save();
  ASSERT_TRUE(RatesBlob(ts_to).load(bytes).ok());
  EXPECT_EQ(Rate(to, 0), 0.1 / 3);
  EXPECT_EQ(Rate(to, 1), 0.5);

  const absl::Status s = RatesBlob(ts_to).load("0x1p-4");
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("2 learning rates"), std::string::npos) << s;
  EXPECT_EQ(Rate(to, 0), 0.1 / 3);

  // A blob of the program's own by that name is refused.
  TrainingState taken = TrainingState::Of(b.ptr().get(), &to);
  taken.blobs.push_back({kLearningRatesBlob, [] { return std::string(); },
                         [](const std::string&) { return absl::OkStatus(); }});
  EXPECT_TRUE(absl::IsInvalidArgument(CarryLearningRates(&taken)));
}

// Ranks whose rates differ (a LibTorch scheduler that counted its own
// calls) also differ in every parameter the next step moved: the check
// names the rates first, and says why and what to use instead.
TEST(LearningRatesTest, RatesThatDifferAreNamedBeforeTheParametersTheyMoved) {
  ASSERT_TRUE(
      RunCommWorld(2, "shm", [&](int rank, Communicator* comm) {
        torch::nn::Linear model(3, 2);
        {
          torch::NoGradGuard no_grad;
          for (torch::Tensor& p : model->parameters()) p.fill_(rank == 0 ? 0.5 : 0.25);
        }
        torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
        if (rank == 1) optimizer.param_groups()[0].options().set_lr(0.01);
        TrainingState ts = TrainingState::Of(model.ptr().get(), &optimizer);
        ASSERT_TRUE(CarryLearningRates(&ts).ok());
        const absl::Status s = CheckRanksAgree(ts, {4, 5}, comm, absl::Now() + absl::Seconds(30));
        EXPECT_TRUE(absl::IsDataLoss(s)) << s;
        EXPECT_NE(s.message().find("first difference: blob learning_rates (3 entries differ)"),
                  std::string::npos)
            << s;
        EXPECT_NE(s.message().find("set Options::lr_schedule instead"), std::string::npos) << s;
      }).ok());
}

// Ranks that hold different numbers of entries of one kind are told which
// kind and why it happens: here rank 1 registers a blob that rank 0 does
// not.
TEST(StateCheckTest, ADifferentNumberOfEntriesIsNamedByKindAndWhy) {
  ASSERT_TRUE(
      RunCommWorld(2, "shm", [&](int rank, Communicator* comm) {
        torch::manual_seed(1);
        torch::nn::Linear model(3, 2);
        torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
        TrainingState ts = TrainingState::Of(model.ptr().get(), &optimizer);
        if (rank == 1) {
          ts.blobs.push_back({"best_loss", [] { return std::string("0.5"); },
                              [](const std::string&) { return absl::OkStatus(); }});
        }
        const absl::Status s = CheckRanksAgree(ts, {4, 5}, comm, absl::Now() + absl::Seconds(30));
        EXPECT_TRUE(absl::IsDataLoss(s)) << s;
        EXPECT_NE(s.message().find(absl::StrCat("this rank holds ", rank, " blob entries")),
                  std::string::npos)
            << s;
        EXPECT_NE(s.message().find("State::blobs registered on some ranks only"), std::string::npos)
            << s;
      }).ok());
}

}  // namespace
}  // namespace muster
