// Checkpoint-restart with real trainers (threads), a real coordinator and
// real files: exact (bitwise) resume, fall back past a damaged checkpoint,
// a full disk aborts one checkpoint while training goes on, retention, and
// an independent Python reader.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/file_system.h"
#include "tests/integration/coordinator_fixture.h"
#include "tests/integration/faulty_file_system.h"
#include "trainer/checkpoint/checkpointer.h"
#include "trainer/checkpoint/safetensors.h"
#include "trainer/data/dataset.h"
#include "trainer/lib/learning_rates.h"
#include "trainer/models/models.h"
#include "trainer/train/trainer.h"

namespace muster {
namespace {

const std::string kSourceDir = MUSTER_SOURCE_DIR;

TrainOptions Base(int port) {
  TrainOptions o;
  o.library.coordinator = "127.0.0.1:" + std::to_string(port);
  o.model = "mlp";
  o.library.batch_per_rank = 16;
  o.library.steps = 30;
  o.lr = 0.05;
  o.lr_scaling = "none";
  o.warmup_steps = 5;
  o.library.intra_op_threads = 1;
  o.library.quiet = true;
  o.library.handle_signals = false;  // ranks are threads
  o.library.backend = Backend::kShm;
  o.library.job = "ckpt" + std::to_string(::getpid());
  return o;
}

// Each trainer's outcome, by local rank.
std::vector<absl::StatusOr<TrainResult>> RunTrainers(int world, const TrainOptions& base) {
  std::vector<absl::StatusOr<TrainResult>> out(world);
  std::vector<std::thread> threads;
  for (int i = 0; i < world; ++i) {
    threads.emplace_back([&, i] {
      TrainOptions o = base;
      o.library.node_id = "node0";
      o.library.local_rank = i;
      out[i] = RunTraining(o, RealClock::Get());
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

// Each trainer's result, by rank.
std::vector<TrainResult> RunJob(int world, const TrainOptions& base) {
  std::vector<TrainResult> out(world);
  for (absl::StatusOr<TrainResult>& r : RunTrainers(world, base)) {
    EXPECT_TRUE(r.ok()) << r.status();
    if (r.ok()) out[r->rank] = std::move(*r);
  }
  return out;
}

bool Equal(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!torch::equal(a[i], b[i])) return false;
  }
  return true;
}

std::string TempDir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/" + name + std::to_string(::getpid());
  DefaultFileSystem()->RemoveAll(dir).IgnoreError();
  return dir;
}

bool Exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void FlipByteNearTheEnd(const std::string& path) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(-5, std::ios::end);
  char c;
  f.get(c);
  f.seekp(-5, std::ios::end);
  f.put(static_cast<char>(c ^ 0x40));
}

// A requeued job: a new coordinator on the same state dir (empty: one that
// keeps its state in memory and knows no checkpoint), the trainers pointed
// at it.
void Restart(std::unique_ptr<InProcessCoordinator>* coord, const std::string& state,
             TrainOptions* o) {
  coord->reset();
  *coord = InProcessCoordinator::Start(2, 3, state);
  o->library.coordinator = "127.0.0.1:" + std::to_string((*coord)->port());
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!LoadFashionMnist(kDefaultFashionMnistDir, true).ok()) {
      GTEST_SKIP() << "dataset-fashion-mnist is not installed";
    }
  }
};

TEST_F(CheckpointTest, InterruptedAndResumedRunIsBitwiseIdentical) {
  auto coord_a = InProcessCoordinator::Start(2);
  auto uninterrupted = RunJob(2, Base(coord_a->port()));
  ASSERT_EQ(uninterrupted[0].steps, 30);

  const std::string state = TempDir("exact-state");
  auto coord = InProcessCoordinator::Start(2, 3, state);
  TrainOptions o = Base(coord->port());
  o.library.checkpoint_dir = TempDir("exact");
  o.library.checkpoint_every = 10;
  o.library.stop_after_step = 20;
  auto first = RunJob(2, o);
  ASSERT_TRUE(first[0].stopped);
  EXPECT_EQ(first[0].steps, 20);
  EXPECT_TRUE(Exists(o.library.checkpoint_dir + "/step-20/manifest.json"));

  Restart(&coord, state, &o);
  o.library.stop_after_step = 0;
  auto resumed = RunJob(2, o);
  EXPECT_EQ(resumed[0].resumed_from_step, 20);
  EXPECT_EQ(resumed[0].steps, 30);
  EXPECT_TRUE(Equal(resumed[0].parameters, uninterrupted[0].parameters));
  EXPECT_TRUE(Equal(resumed[1].parameters, uninterrupted[0].parameters));
}

TEST_F(CheckpointTest, DamagedNewestCheckpointFallsBackToThePreviousOne) {
  auto coord_a = InProcessCoordinator::Start(2);
  auto uninterrupted = RunJob(2, Base(coord_a->port()));
  const std::string state = TempDir("damaged-state");
  auto coord = InProcessCoordinator::Start(2, 3, state);
  TrainOptions o = Base(coord->port());
  o.library.checkpoint_dir = TempDir("damaged");
  o.library.checkpoint_every = 10;
  o.library.stop_after_step = 20;
  RunJob(2, o);
  // Flip one byte in the newest checkpoint's data.
  FlipByteNearTheEnd(o.library.checkpoint_dir + "/step-20/model.safetensors");
  Restart(&coord, state, &o);
  o.library.stop_after_step = 0;
  auto resumed = RunJob(2, o);
  EXPECT_EQ(resumed[0].resumed_from_step, 10);
  EXPECT_EQ(resumed[0].steps, 30);
  // Resuming from step 10 is just as exact.
  EXPECT_TRUE(Equal(resumed[0].parameters, uninterrupted[0].parameters));
}

TEST_F(CheckpointTest, FullDiskAbortsThatCheckpointAndTrainingContinues) {
  const std::string state = TempDir("enospc-state");
  auto coord = InProcessCoordinator::Start(2, 3, state);
  TrainOptions o = Base(coord->port());
  o.library.checkpoint_dir = TempDir("enospc");
  o.library.checkpoint_every = 10;
  FaultyFileSystem fs("step-20/model", ENOSPC, 4096);
  o.library.checkpoint_fs = &fs;
  auto r = RunJob(2, o);
  EXPECT_EQ(r[0].steps, 30);
  EXPECT_GE(fs.failures(), 1);
  EXPECT_EQ(r[0].checkpoints_committed, 2);  // steps 10 and 30
  EXPECT_TRUE(Exists(o.library.checkpoint_dir + "/step-10/manifest.json"));
  EXPECT_FALSE(Exists(o.library.checkpoint_dir + "/step-20"));
  EXPECT_TRUE(Exists(o.library.checkpoint_dir + "/step-30/manifest.json"));
  // The next start resumes from 30 (the aborted 20 was never committed).
  Restart(&coord, state, &o);
  o.library.checkpoint_fs = nullptr;
  o.library.steps = 35;
  auto resumed = RunJob(2, o);
  EXPECT_EQ(resumed[0].resumed_from_step, 30);
}

TEST_F(CheckpointTest, RetentionKeepsTheLastK) {
  auto coord = InProcessCoordinator::Start(2, /*keep_last=*/2);
  TrainOptions o = Base(coord->port());
  o.library.checkpoint_dir = TempDir("retention");
  o.library.checkpoint_every = 5;
  o.library.steps = 25;
  RunJob(2, o);
  auto names = DefaultFileSystem()->ListDir(o.library.checkpoint_dir);
  ASSERT_TRUE(names.ok());
  std::sort(names->begin(), names->end());
  EXPECT_EQ(*names, (std::vector<std::string>{"step-20", "step-25"}));
}

// A requeued job whose new coordinator was started without the state dir
// of the first (its catalog lists no checkpoint) resumes from the newest
// finished checkpoint of its directory, found by the manifest, exactly:
// AdamW's state whole, and sharded (a shard file a rank).
TEST_F(CheckpointTest, ACatalogThatListsNoneResumesFromTheDirectorysNewestExactly) {
  for (const bool sharded : {false, true}) {
    SCOPED_TRACE(sharded ? "sharded" : "whole");
    TrainOptions o = Base(0);
    o.optimizer = "adamw";
    o.lr = 0.001;
    o.library.shard_optimizer_state = sharded;
    o.library.optimizer_state_copies = 1;  // two copies of two ranks stay whole
    std::unique_ptr<InProcessCoordinator> coord;
    Restart(&coord, "", &o);
    auto uninterrupted = RunJob(2, o);

    Restart(&coord, "", &o);
    o.library.checkpoint_dir = TempDir(sharded ? "unlisted-sharded" : "unlisted");
    o.library.checkpoint_every = 10;
    o.library.stop_after_step = 20;
    RunJob(2, o);
    EXPECT_EQ(Exists(o.library.checkpoint_dir + "/step-20/optimizer-shard-1-of-2.safetensors"),
              sharded);

    Restart(&coord, "", &o);
    o.library.stop_after_step = 0;
    auto resumed = RunJob(2, o);
    EXPECT_EQ(resumed[0].resumed_from_step, 20);
    EXPECT_EQ(resumed[0].steps, 30);
    EXPECT_TRUE(Equal(resumed[0].parameters, uninterrupted[0].parameters));
    EXPECT_TRUE(Equal(resumed[1].parameters, uninterrupted[0].parameters));
  }
}

// Where the directory's checkpoints do not verify either, a start at step
// 0 would write over them: every trainer refuses, names the newest and
// what to do, and the directory stays as it was.
TEST_F(CheckpointTest, AStartOverCheckpointsThatDoNotVerifyRefusesAndKeepsThem) {
  auto coord = InProcessCoordinator::Start(2);
  TrainOptions o = Base(coord->port());
  o.library.checkpoint_dir = TempDir("unusable");
  o.library.checkpoint_every = 10;
  o.library.stop_after_step = 20;
  RunJob(2, o);
  const std::string model = o.library.checkpoint_dir + "/step-20/model.safetensors";
  FlipByteNearTheEnd(model);
  FlipByteNearTheEnd(o.library.checkpoint_dir + "/step-10/model.safetensors");
  const std::string damaged = ReadAll(model);

  Restart(&coord, "", &o);
  o.library.stop_after_step = 0;
  for (const absl::StatusOr<TrainResult>& r : RunTrainers(2, o)) {
    const absl::Status& s = r.status();
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_NE(s.message().find("step-20"), std::string::npos) << s;
    EXPECT_NE(s.message().find("--rebuild-catalog=" + o.library.checkpoint_dir), std::string::npos)
        << s;
  }
  EXPECT_EQ(ReadAll(model), damaged);
  EXPECT_TRUE(Exists(o.library.checkpoint_dir + "/step-10/manifest.json"));
  EXPECT_FALSE(Exists(o.library.checkpoint_dir + "/step-30"));
}

TEST_F(CheckpointTest, AnIndependentPythonReaderSeesTheSameTensors) {
  if (std::system("/usr/bin/python3 -c 'import numpy' 2>/dev/null") != 0) {
    GTEST_SKIP() << "python3-numpy is not installed";
  }
  auto coord = InProcessCoordinator::Start(2);
  TrainOptions o = Base(coord->port());
  o.library.checkpoint_dir = TempDir("interop");
  o.library.checkpoint_every = 10;
  o.library.stop_after_step = 10;
  auto r = RunJob(2, o);
  const std::string cmd = "/usr/bin/python3 " + kSourceDir + "/tests/integration/read_safetensors.py " +
                          o.library.checkpoint_dir + "/step-10/model.safetensors";
  FILE* p = ::popen(cmd.c_str(), "r");
  std::map<std::string, double> sums;
  char name[256], dtype[16], shape[64];
  double sum;
  while (std::fscanf(p, "%255s %15s %63s %lf", name, dtype, shape, &sum) == 4) sums[name] = sum;
  ASSERT_EQ(::pclose(p), 0);
  auto model = *MakeModel("mlp", {});
  size_t i = 0;
  for (const auto& np : model->named_parameters()) {
    const std::string key = "param." + np.key();
    ASSERT_EQ(sums.count(key), 1u) << key;
    EXPECT_NEAR(sums[key], r[0].parameters[i].to(torch::kFloat64).sum().item<double>(), 1e-6)
        << key;
    ++i;
  }
  EXPECT_EQ(i, sums.size());
}

}  // namespace
}  // namespace muster

namespace muster {
namespace {

// Writes `tensors` as a checkpoint file of `dir` and returns its report.
FileReport WriteFile(const std::string& path, const NamedTensors& tensors) {
  std::string bytes = EncodeSafetensors(tensors, {}).value();
  std::ofstream(path, std::ios::binary) << bytes;
  return {path, bytes.size(), Xxh3Hex(bytes.data(), bytes.size())};
}

// A checkpoint of step 7 in `dir` (made anew): `saved_model` as its model
// file, AdamW state for `model`'s parameters with its first moments of
// `exp_avg_type`, and its manifest. Returns the files' reports.
std::vector<FileReport> WriteStep7(const std::string& dir, const NamedTensors& saved_model,
                                   torch::nn::Module& model, torch::Dtype exp_avg_type) {
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  NamedTensors saved_optimizer;
  for (const auto& p : model.named_parameters()) {
    saved_optimizer.emplace_back(p.key() + ".step", torch::tensor(int64_t{5}));
    saved_optimizer.emplace_back(p.key() + ".exp_avg", torch::ones_like(p.value(), exp_avg_type));
    saved_optimizer.emplace_back(p.key() + ".exp_avg_sq", torch::ones_like(p.value()));
  }
  const std::string manifest =
      R"({"format": "muster-checkpoint-1", "step": 7, "epoch": 0, "sample_offset": 70,)"
      R"( "generation": 1, "world_size": 1, "files": {"model.safetensors": {"bytes": 0,)"
      R"( "xxh3": ""}}})";
  std::ofstream(dir + "/manifest.json") << manifest;
  return {WriteFile(dir + "/model.safetensors", saved_model),
          WriteFile(dir + "/optimizer.safetensors", saved_optimizer),
          {dir + "/manifest.json", manifest.size(), Xxh3Hex(manifest.data(), manifest.size())}};
}

TEST(LoadCheckpointTest, AnOptimizerStateThatDoesNotFitChangesNothing) {
  torch::manual_seed(3);
  torch::nn::Linear model(4, 2);
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(0.1));
  // A model file that fits, and AdamW moments of the wrong dtype (float64).
  NamedTensors saved_model;
  for (const auto& [name, t] : ModelTensors(*model)) saved_model.emplace_back(name, t + 1);
  const std::vector<FileReport> files =
      WriteStep7(::testing::TempDir() + "/misfit" + std::to_string(::getpid()), saved_model, *model,
                 torch::kFloat64);
  const torch::Tensor before = model->weight.detach().clone();
  absl::StatusOr<CheckpointMeta> loaded =
      LoadCheckpoint(files, TrainingState::Of(model.ptr().get(), &optimizer));
  EXPECT_TRUE(absl::IsDataLoss(loaded.status())) << loaded.status();
  EXPECT_NE(loaded.status().message().find("exp_avg"), std::string::npos) << loaded.status();
  // Nothing changed: the model keeps its weights, the optimizer has no state.
  EXPECT_TRUE(torch::equal(model->weight, before));
  EXPECT_TRUE(optimizer.state().empty());
}

// A program that sets its rates itself carries them (the blob
// learning_rates, CarryLearningRates); a checkpoint written before that blob
// existed has none, nor an extra.safetensors: it loads, and the program's
// rates stay. One with the blob sets them.
TEST(LoadCheckpointTest, ACheckpointWithoutTheRatesLeavesTheProgramsRates) {
  torch::nn::Linear model(4, 2);
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(0.05));
  TrainingState state = TrainingState::Of(model.ptr().get(), &optimizer);
  ASSERT_TRUE(CarryLearningRates(&state).ok());
  const std::string dir = ::testing::TempDir() + "/no-rates" + std::to_string(::getpid());
  std::vector<FileReport> files = WriteStep7(dir, ModelTensors(*model), *model, torch::kFloat32);
  absl::StatusOr<CheckpointMeta> loaded = LoadCheckpoint(files, state);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->step, 7);
  EXPECT_EQ(optimizer.param_groups()[0].options().get_lr(), 0.05);

  files.push_back(
      WriteFile(dir + "/extra.safetensors", {{"blob.learning_rates", BytesTensor("0x1p-4")}}));
  loaded = LoadCheckpoint(files, state);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(optimizer.param_groups()[0].options().get_lr(), 0.0625);
}

// Every optimizer LibTorch ships, with two parameter groups of their own
// options (LBFGS takes one): its state, created lazily by the first steps,
// goes through a checkpoint into a fresh model and optimizer, and both then
// train on bit for bit alike.
class OptimizerStateTest : public ::testing::TestWithParam<std::string> {
 protected:
  static torch::nn::Sequential Model(int seed) {
    torch::manual_seed(seed);
    return torch::nn::Sequential(torch::nn::Linear(4, 8), torch::nn::ReLU(),
                                 torch::nn::Linear(8, 2));
  }
  static std::unique_ptr<torch::optim::Optimizer> Optimizer(const std::string& kind,
                                                            torch::nn::Sequential& m) {
    using namespace torch::optim;  // NOLINT
    auto groups = [&](auto options) {
      auto fast = options;
      fast.lr(options.lr() * 10);
      std::vector<OptimizerParamGroup> g;
      g.emplace_back(m[0]->parameters(), std::make_unique<decltype(options)>(options));
      g.emplace_back(m[2]->parameters(), std::make_unique<decltype(options)>(fast));
      return g;
    };
    if (kind == "sgd") {
      const auto o = SGDOptions(0.01).momentum(0.9);
      return std::make_unique<SGD>(groups(o), o);
    }
    if (kind == "adam") {
      const auto o = AdamOptions(1e-3).amsgrad(true);
      return std::make_unique<Adam>(groups(o), o);
    }
    if (kind == "adamw") {
      const auto o = AdamWOptions(1e-3);
      return std::make_unique<AdamW>(groups(o), o);
    }
    if (kind == "rmsprop") {
      // Not 1e-3: its tenfold group would have RMSprop's default rate, 1e-2,
      // and LibTorch 2.15 takes a group option equal to its type's default as
      // unset and gives the group the optimizer's defaults instead.
      const auto o = RMSpropOptions(2e-3).momentum(0.5).centered(true);
      return std::make_unique<RMSprop>(groups(o), o);
    }
    if (kind == "adagrad") {
      const auto o = AdagradOptions(0.05);
      return std::make_unique<Adagrad>(groups(o), o);
    }
    return std::make_unique<LBFGS>(m->parameters(), LBFGSOptions(0.5).history_size(4).max_iter(3));
  }
  static void Step(torch::nn::Sequential& m, torch::optim::Optimizer& o, int i) {
    torch::manual_seed(100 + i);
    const torch::Tensor x = torch::randn({16, 4}), y = torch::randn({16, 2});
    auto closure = [&] {
      o.zero_grad();
      torch::Tensor loss = torch::mse_loss(m->forward(x), y);
      loss.backward();
      return loss;
    };
    o.step(closure);
  }
};

TEST_P(OptimizerStateTest, ItsStateCheckpointsAndTheResumedRunIsBitIdentical) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/optstate", ::getpid(), GetParam());
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  torch::nn::Sequential a = Model(1);
  auto oa = Optimizer(GetParam(), a);
  for (int i = 0; i < 3; ++i) Step(a, *oa, i);
  std::vector<FileReport> files;
  {
    Checkpointer writer(dir, TrainingState::Of(a.ptr().get(), oa.get()), RealClock::Get());
    CheckpointMeta meta;
    meta.step = 3;
    ASSERT_TRUE(writer
                    .Snapshot(meta, [&](absl::StatusOr<std::vector<FileReport>> f,
                                        CheckpointTiming) { files = f.value(); })
                    .ok());
    ASSERT_TRUE(writer.Wait().ok());
  }
  torch::nn::Sequential b = Model(2);
  auto ob = Optimizer(GetParam(), b);
  const TrainingState sb = TrainingState::Of(b.ptr().get(), ob.get());
  absl::StatusOr<CheckpointMeta> loaded = LoadCheckpoint(files, sb);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const NamedTensors state_a = TrainingState::Of(a.ptr().get(), oa.get()).OptimizerState();
  const NamedTensors state_b = sb.OptimizerState();
  ASSERT_FALSE(state_a.empty());
  ASSERT_EQ(state_a.size(), state_b.size());
  for (size_t i = 0; i < state_a.size(); ++i) {
    EXPECT_EQ(state_a[i].first, state_b[i].first);
    EXPECT_TRUE(torch::equal(state_a[i].second, state_b[i].second)) << state_a[i].first;
  }
  for (int i = 3; i < 6; ++i) {
    Step(a, *oa, i);
    Step(b, *ob, i);
  }
  const auto pa = a->parameters(), pb = b->parameters();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(torch::equal(pa[i], pb[i])) << "parameter " << i;
  // Each group kept its own rate.
  if (GetParam() != "lbfgs") {
    EXPECT_DOUBLE_EQ(ob->param_groups()[1].options().get_lr(),
                     10 * ob->param_groups()[0].options().get_lr());
  }
}

// A joiner's optimizer gets the codec's Initial state before the transfer;
// it must not change what the first steps compute.
TEST_P(OptimizerStateTest, TheInitialStateTrainsAsNoStateDoes) {
  torch::nn::Sequential a = Model(1), b = Model(1);
  auto oa = Optimizer(GetParam(), a), ob = Optimizer(GetParam(), b);
  const TrainingState sb = TrainingState::Of(b.ptr().get(), ob.get());
  EXPECT_FALSE(sb.OptimizerState().empty() && GetParam() != "sgd");  // gives every parameter its state
  for (int i = 0; i < 3; ++i) {
    Step(a, *oa, i);
    Step(b, *ob, i);
  }
  const auto pa = a->parameters(), pb = b->parameters();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(torch::equal(pa[i], pb[i])) << "parameter " << i;
}

INSTANTIATE_TEST_SUITE_P(LibTorch, OptimizerStateTest,
                         ::testing::Values("sgd", "adam", "adamw", "rmsprop", "adagrad", "lbfgs"));

// A checkpoint taken right after a salvaged step records the examples it
// returned to the sampler; a resume trains on them first.
TEST(LoadCheckpointTest, ReturnedExamplesRoundTripAndBadOnesAreNamed) {
  torch::nn::Linear model(4, 2);
  const std::string dir = ::testing::TempDir() + "/returned" + std::to_string(::getpid());
  auto load = [&](const std::string& extra) {
    std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
    const std::string manifest =
        R"({"format": "muster-checkpoint-1", "step": 7, "epoch": 1, "sample_offset": 70,)"
        R"( "generation": 2, "world_size": 3, "files": {"model.safetensors": {"bytes": 0,)"
        R"( "xxh3": ""}})" +
        extra + "}";
    std::ofstream(dir + "/manifest.json") << manifest;
    std::vector<FileReport> files = {
        WriteFile(dir + "/model.safetensors", ModelTensors(*model)),
        WriteFile(dir + "/optimizer.safetensors", {}),
        {dir + "/manifest.json", manifest.size(), Xxh3Hex(manifest.data(), manifest.size())}};
    return LoadCheckpoint(files, TrainingState::Of(model.ptr().get(), nullptr));
  };
  absl::StatusOr<CheckpointMeta> meta =
      load(R"(, "returned_epoch": 1, "returned_examples": [12, 5, 40])");
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(meta->returned_epoch, 1);
  EXPECT_EQ(meta->returned_examples, (std::vector<int64_t>{12, 5, 40}));
  meta = load("");
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_TRUE(meta->returned_examples.empty());
  meta = load(R"(, "returned_epoch": 1, "returned_examples": [12, "x"])");
  EXPECT_TRUE(absl::IsDataLoss(meta.status())) << meta.status();
  EXPECT_NE(meta.status().message().find("returned_examples"), std::string::npos) << meta.status();
  meta = load(R"(, "returned_examples": [3])");
  EXPECT_TRUE(absl::IsDataLoss(meta.status())) << meta.status();
}

}  // namespace
}  // namespace muster
