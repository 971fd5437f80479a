// Sharded optimizer state (trainer/elastic/optimizer_shards.h,
// docs/sharding.md) over real Gloo, ranks as threads: the program's own
// LibTorch optimizer steps flat shards of each parameter group, and the
// parameters gathered from the owners equal, bit for bit, what the same
// optimizer gives unsharded from the same averaged gradients.
#include "trainer/elastic/optimizer_shards.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/integration/comm_world.h"
#include "trainer/checkpoint/optimizer_codecs.h"
#include "trainer/checkpoint/state_tensors.h"
#include "trainer/elastic/sharded_optimizers.h"

namespace muster {
namespace {

using Net = torch::nn::Sequential;

// A small MLP with sizes that shard boundaries cut through, a 0-dim
// parameter that scales its loss, and a frozen bias, set to values that
// depend only on the parameter's index (ranks are threads: the global
// generator is shared, so it is not used). With `channels_last`, a 4-d
// parameter in channels-last memory too, last.
Net MakeNet(bool channels_last = false) {
  Net net(torch::nn::Linear(7, 13), torch::nn::Tanh(), torch::nn::Linear(13, 5));
  net->register_parameter("scale", torch::full({}, 1.1f));
  if (channels_last) {
    net->register_parameter(
        "conv", torch::zeros({2, 3, 2, 2}).contiguous(torch::MemoryFormat::ChannelsLast));
  }
  torch::NoGradGuard no_grad;
  int i = 0;
  for (torch::Tensor& p : net->parameters()) {
    p.copy_(torch::sin(torch::arange(p.numel(), torch::kFloat32) * 0.37 + i++).view_as(p) * 0.3);
  }
  net->named_parameters()["2.bias"].set_requires_grad(false);
  return net;
}

// The batch of `rank` at `step`.
torch::Tensor Batch(int rank, int step) {
  return torch::cos(torch::arange(4 * 7, torch::kFloat32) * 0.11 * (rank + 1) + step).view({4, 7});
}

struct Kind {
  std::string name;
  std::function<std::unique_ptr<torch::optim::Optimizer>(Net&)> make;
};

void PrintTo(const Kind& kind, std::ostream* os) { *os << kind.name; }

std::vector<torch::optim::OptimizerParamGroup> TwoGroups(Net& net) {
  std::vector<torch::Tensor> first, second;
  for (const auto& p : net->named_parameters()) {
    (p.key().rfind("0.", 0) == 0 ? first : second).push_back(p.value());
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(first, std::make_unique<torch::optim::AdamOptions>(0.02));
  groups.emplace_back(second, std::make_unique<torch::optim::AdamOptions>(0.005));
  return groups;
}

std::vector<Kind> Kinds() {
  using namespace torch::optim;  // NOLINT: the optimizers' option builders
  return {
      {"SgdNesterov",
       [](Net& n) {
         return std::make_unique<SGD>(
             n->parameters(), SGDOptions(0.05).momentum(0.9).nesterov(true).weight_decay(0.01));
       }},
      {"SgdDampening",
       [](Net& n) {
         return std::make_unique<SGD>(n->parameters(),
                                      SGDOptions(0.05).momentum(0.9).dampening(0.1));
       }},
      {"AdamAmsgrad",
       [](Net& n) {
         return std::make_unique<Adam>(n->parameters(),
                                       AdamOptions(0.01).amsgrad(true).weight_decay(0.01));
       }},
      {"AdamTwoGroups", [](Net& n) { return std::make_unique<Adam>(TwoGroups(n)); }},
      {"AdamW",
       [](Net& n) {
         return std::make_unique<AdamW>(n->parameters(), AdamWOptions(0.01).weight_decay(0.1));
       }},
      {"RmspropCentered",
       [](Net& n) {
         return std::make_unique<RMSprop>(n->parameters(),
                                          RMSpropOptions(0.01).centered(true).momentum(0.5));
       }},
      {"Adagrad",
       [](Net& n) {
         return std::make_unique<Adagrad>(n->parameters(), AdagradOptions(0.05).lr_decay(0.01));
       }},
  };
}

void Backward(Net& net, int rank, int step) {
  net->zero_grad();
  torch::Tensor loss =
      net->forward(Batch(rank, step)).pow(2).sum() * net->named_parameters()["scale"];
  const auto params = net->named_parameters();
  if (const torch::Tensor* conv = params.find("conv")) {
    loss = loss + (*conv * (rank + step + 1)).pow(2).sum();
  }
  loss.backward();
}

// Each of the optimizer's groups' gradients flat, averaged over the world
// and written back: one all-reduce per group, as the sharded step makes
// (a ring all-reduce's summation order depends on the buffer it is given).
void AverageGroups(const std::vector<std::vector<torch::Tensor>>& groups, Communicator* comm) {
  for (const auto& params : groups) {
    std::vector<torch::Tensor> grads, trained;
    for (const torch::Tensor& p : params) {
      if (!p.requires_grad()) continue;  // frozen: no gradient
      grads.push_back(p.grad().reshape({-1}));
      trained.push_back(p);
    }
    torch::Tensor flat = torch::cat(grads);
    ASSERT_TRUE(comm->AllReduce(flat.data_ptr(), flat.numel(), DataType::kFloat32,
                                ReduceOp::kAverage, absl::Now() + absl::Seconds(30))
                    .ok());
    int64_t offset = 0;
    for (torch::Tensor& p : trained) {
      p.mutable_grad().copy_(flat.narrow(0, offset, p.numel()).view_as(p));
      offset += p.numel();
    }
  }
}

// Each parameter group's list, as the optimizer holds it now.
std::vector<std::vector<torch::Tensor>> GroupsOf(torch::optim::Optimizer& optimizer) {
  std::vector<std::vector<torch::Tensor>> out;
  for (auto& group : optimizer.param_groups()) out.push_back(group.params());
  return out;
}

void AverageGradients(torch::optim::Optimizer& optimizer, Communicator* comm) {
  AverageGroups(GroupsOf(optimizer), comm);
}

// One sharded step of every group: the gradients averaged over the world
// (one all-reduce of the group's flat gradient, as the reference does),
// the masters stepped, the owners' ranges all-gathered into the parameters
// in chunks of `chunk` elements. `after_step`, where given, runs between
// the optimizer's step and the gather (a WGAN's weight clipping).
void ShardedStep(Net& net, torch::optim::Optimizer& optimizer, OptimizerShards& shards,
                 Communicator* comm, int64_t chunk = OptimizerShards::kGatherChunk,
                 const std::function<void(Net&)>& after_step = nullptr, bool gather = true) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  for (int g = 0; g < shards.groups(); ++g) {
    torch::Tensor flat = shards.FlatGradients(g);
    ASSERT_TRUE(comm->AllReduce(flat.data_ptr(), flat.numel(), DataType::kFloat32,
                                ReduceOp::kAverage, deadline)
                    .ok());
    shards.SetGradients(g, flat);
  }
  // The optimizer no longer holds the parameters: clearing their .grad is
  // the caller's (in training, muster's at the step boundary).
  net->zero_grad();
  optimizer.step();
  if (after_step) after_step(net);
  if (gather) {
    ASSERT_TRUE(shards.GatherParameters(comm, deadline, chunk).ok());
  }
}

class OptimizerShardsTest : public ::testing::TestWithParam<Kind> {};

// Sharded from the first step (the optimizer has no state yet) and after
// two unsharded steps (state to slice), against the same optimizer
// unsharded throughout, in worlds of one and of three (odd: ranges of
// unequal size) with a buddy copy: the parameters stay bit-identical, and
// the frozen bias stays as it was. The gather runs in one chunk, and in
// chunks of 5 elements that cut through parameters and ranges.
TEST_P(OptimizerShardsTest, ShardedStepsEqualTheUnshardedOptimizerBitForBit) {
  for (int world : {1, 3}) {
    for (int plain_steps : {0, 2}) {
      const int64_t chunk = plain_steps == 0 ? OptimizerShards::kGatherChunk : 5;
      ASSERT_TRUE(RunCommWorld(world, "gloo", [&](int rank, Communicator* comm) {
                    Net reference = MakeNet(), sharded = MakeNet();
                    const torch::Tensor frozen = MakeNet()->named_parameters()["2.bias"];
                    auto reference_opt = GetParam().make(reference);
                    auto sharded_opt = GetParam().make(sharded);
                    std::unique_ptr<OptimizerShards> shards;
                    for (int step = 0; step < plain_steps + 4; ++step) {
                      Backward(reference, rank, step);
                      AverageGradients(*reference_opt, comm);
                      reference_opt->step();
                      Backward(sharded, rank, step);
                      if (step < plain_steps) {
                        AverageGradients(*sharded_opt, comm);
                        sharded_opt->step();
                        continue;
                      }
                      if (shards == nullptr) {
                        auto made = OptimizerShards::Make({sharded_opt.get()}, rank,
                                                          std::vector<int>(world, 0), /*copies=*/2);
                        ASSERT_TRUE(made.ok()) << made.status();
                        shards = *std::move(made);
                      }
                      ShardedStep(sharded, *sharded_opt, *shards, comm, chunk);
                      const auto want = reference->parameters(), got = sharded->parameters();
                      for (size_t i = 0; i < want.size(); ++i) {
                        ASSERT_TRUE(torch::equal(want[i], got[i]))
                            << GetParam().name << ", world " << world << ", sharded after "
                            << plain_steps << " steps, rank " << rank << ", step " << step
                            << ", parameter " << i << ": largest difference "
                            << (want[i] - got[i]).abs().max().item<float>();
                      }
                    }
                    EXPECT_TRUE(torch::equal(sharded->named_parameters()["2.bias"], frozen));
                  }).ok());
    }
  }
}

// What one rank holds: the same program unsharded (the reference) and
// sharded.
struct Held {
  Net reference, sharded;
  std::unique_ptr<torch::optim::Optimizer> reference_opt, sharded_opt;
  std::unique_ptr<OptimizerShards> shards;
  std::unique_ptr<ShardedOptimizers> sharded_state;  // the replica's way (LivesThroughWorlds)
  std::vector<std::vector<torch::Tensor>> groups;    // sharded_opt's, before sharding
  explicit Held(const Kind& kind, bool channels_last = false, int copies = 2)
      : reference(MakeNet(channels_last)),
        sharded(MakeNet(channels_last)),
        reference_opt(kind.make(reference)),
        sharded_opt(kind.make(sharded)),
        sharded_state(std::make_unique<ShardedOptimizers>(
            std::vector<torch::optim::Optimizer*>{sharded_opt.get()}, copies)),
        groups(GroupsOf(*sharded_opt)) {}

  // A world of `comm` with generation `generation` as the replica drives
  // it: gathered, parameters from rank 0 (a state transfer), sharded,
  // `steps` steps from `first`, each against the reference's, and a path
  // that reads the whole state (a checkpoint) at the end.
  // With `straight`, the world's Gather must go straight to its shards.
  void LiveInWorld(int rank, uint64_t generation, int first, int steps, Communicator* comm,
                   bool straight = false) {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    const std::string where = absl::StrCat("generation ", generation, ", rank ", rank);
    const absl::Status gathered =
        sharded_state->Gather(comm, generation, /*node=*/rank % 2, deadline);
    ASSERT_TRUE(gathered.ok()) << where << ": " << gathered;
    ASSERT_EQ(sharded_state->sharded(), straight) << where;
    for (torch::Tensor& p : sharded->parameters()) {
      ASSERT_TRUE(
          comm->Broadcast(p.data_ptr(), p.numel(), DataType::kFloat32, 0, deadline).ok());
    }
    if (sharded_state->sharded()) {
      // Straight to this world's shards: no trained parameter holds state
      // of its own (the masters hold this rank's ranges); looked at whole,
      // then sharded again.
      for (const torch::Tensor& p : sharded->parameters()) {
        if (!p.requires_grad()) continue;  // Adagrad's constructor's state, kept
        ASSERT_EQ(FindOptimizerState(*sharded_opt, p), nullptr) << where << ": state made whole";
      }
      sharded_state->ParametersTransferred();
      ExpectReferenceWhole(comm, where + ", moved to its shards");
    } else {
      ExpectReference(where + ", gathered");
      ASSERT_TRUE(sharded_state->Shard(comm).ok());
    }
    // A world of two with two copies stays whole and steps as unsharded.
    const bool whole = sharded_state->KeepsWhole(comm->size());
    ASSERT_EQ(sharded_state->sharded(), !whole) << where;
    Steps(rank, first, steps, comm, where);
    ExpectReferenceWhole(comm, where + ", whole for a checkpoint");
    ASSERT_EQ(sharded_state->sharded(), !whole) << where;
  }

  // `steps` steps from `first` on both, as the replica drives the sharded
  // side, each against the reference's.
  void Steps(int rank, int first, int steps, Communicator* comm, const std::string& where) {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    const bool whole = sharded_state->KeepsWhole(comm->size());
    for (int step = first; step < first + steps; ++step) {
      // The program clips the averaged gradients in place before its step
      // (a norm this small clips every step): the masters step with that.
      Backward(reference, rank, step);
      AverageGradients(*reference_opt, comm);
      torch::nn::utils::clip_grad_norm_(reference->parameters(), 0.05);
      reference_opt->step();
      Backward(sharded, rank, step);
      AverageGroups(groups, comm);
      sharded_state->TakeGradients();
      torch::nn::utils::clip_grad_norm_(sharded->parameters(), 0.05);
      sharded_opt->step();
      ASSERT_TRUE(sharded_state->AtBoundary(comm, deadline).ok());
      const auto want = reference->parameters(), got = sharded->parameters();
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_TRUE(torch::equal(want[i], got[i]))
            << where << ", step " << step << ", parameter " << i;
        if (!whole) {
          ASSERT_FALSE(got[i].grad().defined()) << "the boundary clears the parameters' .grad";
        }
      }
    }
  }

  // ExpectReference with the whole state (a path that reads it whole, as a
  // checkpoint does), sharded again after.
  void ExpectReferenceWhole(Communicator* comm, const std::string& where) {
    const absl::Status path = sharded_state->WithWholeState(
        comm,
        [&] {
          ExpectReference(where);
          return absl::OkStatus();
        },
        absl::Now() + absl::Seconds(30));
    ASSERT_TRUE(path.ok()) << where << ": " << path;
  }

  // `step` on both, as rank `rank` of `comm`'s world; the sharded side
  // shards itself first, as rank `rank` of a world on one node.
  // `after_step`: ShardedStep's, on both.
  // `gather` false: the boundary's gather does not run (a world that
  // breaks in it), and only the masters hold the step's values.
  void Step(int rank, int step, Communicator* comm, int copies = 2,
            const std::function<void(Net&)>& after_step = nullptr, bool gather = true) {
    Backward(reference, rank, step);
    AverageGradients(*reference_opt, comm);
    reference_opt->step();
    if (after_step) after_step(reference);
    Backward(sharded, rank, step);
    if (shards == nullptr) {
      auto made = OptimizerShards::Make({sharded_opt.get()}, rank,
                                        std::vector<int>(comm->size(), 0), copies);
      ASSERT_TRUE(made.ok()) << made.status();
      shards = *std::move(made);
    }
    ShardedStep(sharded, *sharded_opt, *shards, comm, OptimizerShards::kGatherChunk, after_step,
                gather);
  }

  // Every trained parameter's state and value is the reference's, bit for bit.
  void ExpectReference(const std::string& where) {
    const OptimizerCodec* codec = BuiltinOptimizerCodec(*reference_opt);
    const auto want = reference->parameters(), got = sharded->parameters();
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_TRUE(torch::equal(want[i], got[i])) << where << ": parameter " << i;
      if (!want[i].requires_grad()) continue;
      torch::optim::OptimizerParamState* a = FindOptimizerState(*reference_opt, want[i]);
      torch::optim::OptimizerParamState* b = FindOptimizerState(*sharded_opt, got[i]);
      ASSERT_EQ(a == nullptr, b == nullptr) << where << ": the state of parameter " << i;
      if (a == nullptr) continue;
      const auto fa = codec->Save(*a, *GroupOptionsOf(*reference_opt, want[i]));
      const auto fb = codec->Save(*b, *GroupOptionsOf(*sharded_opt, got[i]));
      ASSERT_EQ(fa.size(), fb.size()) << where;
      for (size_t f = 0; f < fa.size(); ++f) {
        EXPECT_EQ(fa[f].first, fb[f].first) << where;
        EXPECT_TRUE(torch::equal(fa[f].second, fb[f].second))
            << where << ": parameter " << i << "'s " << fa[f].first;
      }
    }
  }
};

// Three ranks live through `first` in one world; rank 1 dies; the two
// survivors and a joiner (a fresh program whose reference is the dead
// rank's: every rank's reference is the same) live through `second` as the
// ranks 0, 1 and 2 of the next world.
// With `channels_last`, the programs' models have a channels-last
// parameter too (their masters copy their ranges).
void ThroughADeath(const Kind& kind, const std::function<void(Held&, int, Communicator*)>& first,
                   const std::function<void(Held&, int, Communicator*)>& second,
                   bool channels_last = false) {
  std::vector<std::unique_ptr<Held>> held;
  for (int i = 0; i < 3; ++i) held.push_back(std::make_unique<Held>(kind, channels_last));
  ASSERT_TRUE(RunCommWorld(3, "gloo", [&](int rank, Communicator* comm) {
                first(*held[rank], rank, comm);
              }).ok());
  auto joiner = std::make_unique<Held>(kind, channels_last);
  joiner->reference = held[1]->reference;
  joiner->reference_opt = std::move(held[1]->reference_opt);
  Held* now[3] = {held[0].get(), held[2].get(), joiner.get()};
  ASSERT_TRUE(RunCommWorld(3, "gloo", [&](int rank, Communicator* comm) {
                second(*now[rank], rank, comm);
              }).ok());
}

// Three sharded steps (Held::Step) in a world on one node.
void ThreeSteps(Held& me, int rank, Communicator* comm) {
  for (int step = 0; step < 3; ++step) me.Step(rank, step, comm);
}

// Three steps in a world of three with a buddy copy, then rank 1 dies. The
// survivors (old ranks 0 and 2) and a joiner form a world of three again:
// Unshard gives each of them every parameter's whole state, bit for bit
// the state of the same optimizer unsharded, though rank 1's shard lived
// only in its buddy; sharded again in the new world, they train on as the
// unsharded optimizer does, and gathered once more the state is still its.
TEST_P(OptimizerShardsTest, AfterARankDiesSurvivorsAndAJoinerRebuildTheStateBitForBit) {
  ThroughADeath(
      GetParam(),
      ThreeSteps,
      [](Held& me, int rank, Communicator* comm) {
        const absl::Time deadline = absl::Now() + absl::Seconds(30);
        const absl::Status s =
            me.shards != nullptr
                ? me.shards->Unshard({true, false, true}, comm, deadline)
                : OptimizerShards::ReceiveUnsharded({me.sharded_opt.get()}, comm, deadline);
        ASSERT_TRUE(s.ok()) << s;
        me.shards.reset();
        // The parameters from a survivor, as a state transfer brings them.
        for (torch::Tensor& p : me.sharded->parameters()) {
          ASSERT_TRUE(
              comm->Broadcast(p.data_ptr(), p.numel(), DataType::kFloat32, 0, deadline).ok());
        }
        me.ExpectReference(absl::StrCat("new rank ", rank, ", unsharded"));
        for (int step = 3; step < 6; ++step) me.Step(rank, step, comm);
        // Gathered again in the same world (as for a checkpoint).
        const absl::Status again =
            me.shards->Unshard({true, true, true}, comm, absl::Now() + absl::Seconds(30));
        ASSERT_TRUE(again.ok()) << again;
        me.ExpectReference(absl::StrCat("new rank ", rank, ", step 5"));
      });
}

// A world of three that loses a rank shrinks to two, where every rank
// would keep both parts (two copies): the survivors regather the dead
// rank's part from its buddy and go on whole, stepping as the unsharded
// optimizer does, bit for bit.
TEST_P(OptimizerShardsTest, AWorldThatShrinksToTwoGoesOnWholeAsUnsharded) {
  std::vector<std::unique_ptr<Held>> held;
  for (int i = 0; i < 3; ++i) held.push_back(std::make_unique<Held>(GetParam()));
  ASSERT_TRUE(RunCommWorld(3, "gloo", [&](int rank, Communicator* comm) {
                held[rank]->LiveInWorld(rank, 1, 0, 3, comm);
              }).ok());
  Held* survivors[2] = {held[0].get(), held[2].get()};  // rank 1 died
  ASSERT_TRUE(RunCommWorld(2, "gloo", [&](int rank, Communicator* comm) {
                survivors[rank]->LiveInWorld(rank, 2, 3, 3, comm);
              }).ok());
}

// The same death as the replica drives it (ShardedOptimizers): world 1 of
// three ranks, generation 1, takes three steps; rank 1 dies; generation 2,
// the two survivors and a joiner, moves the state straight to its own
// shards (no rank was in a failed step) and takes three more. The
// parameters stay bit-identical to the unsharded optimizer's after every
// step, the whole state equals its state wherever it is gathered, and the
// parameters' .grad are cleared at each boundary.
TEST_P(OptimizerShardsTest, ShardedStateLivesThroughWorldsAsTheReplicaDrivesIt) {
  ThroughADeath(
      GetParam(),
      [](Held& me, int rank, Communicator* comm) { me.LiveInWorld(rank, 1, 0, 3, comm); },
      [](Held& me, int rank, Communicator* comm) {
        me.LiveInWorld(rank, 2, 3, 3, comm, /*straight=*/true);
      });
}

// A hot spare meets the survivors of a failed step: a world of three
// trains sharded with a buddy copy; rank 1 dies inside step 3, and a
// joiner takes its place. Every rank goes straight to the new world's
// shards (the joiner's as they were before the step), though the joiner
// was not in the step; the survivors take the salvaged step (the joiner
// adds zeros) and the catch-up brings the joiner its shards as the step
// left them, from the survivors that stepped them. After the boundary
// every rank holds the unsharded optimizer's parameters and state, bit for
// bit, and trains on as it does.
TEST_P(OptimizerShardsTest, AJoinerOutsideAFailedStepReceivesItsShardsAsTheStepLeftThem) {
  ThroughADeath(
      GetParam(),
      [](Held& me, int rank, Communicator* comm) { me.LiveInWorld(rank, 1, 0, 3, comm); },
      [](Held& me, int rank, Communicator* comm) {
        const absl::Time deadline = absl::Now() + absl::Seconds(30);
        const bool survivor = rank < 2;  // the joiner is rank 2
        const std::string where = absl::StrCat("generation 2, rank ", rank);
        ASSERT_TRUE(me.sharded_state
                        ->Gather(comm, 2, /*node=*/rank % 2, deadline, survivor ? 3 : -1,
                                 survivor ? 1 : 0)
                        .ok());
        ASSERT_TRUE(me.sharded_state->sharded()) << where << ": straight to the new shards";
        for (torch::Tensor& p : me.sharded->parameters()) {
          ASSERT_TRUE(
              comm->Broadcast(p.data_ptr(), p.numel(), DataType::kFloat32, 0, deadline).ok());
        }
        me.sharded_state->ParametersTransferred();
        // The salvaged step 3: the survivors' gradients, zeros from the
        // joiner; every reference steps, the sharded joiner does not.
        const auto contribute = [&](Net& net) {
          Backward(net, rank, 3);
          if (survivor) return;
          for (torch::Tensor& p : net->parameters()) {
            if (p.grad().defined()) p.mutable_grad().zero_();
          }
        };
        contribute(me.reference);
        AverageGradients(*me.reference_opt, comm);
        me.reference_opt->step();
        contribute(me.sharded);
        AverageGroups(me.groups, comm);
        me.sharded_state->TakeGradients();
        if (survivor) me.sharded_opt->step();
        const absl::Status caught = me.sharded_state->CatchUp(comm, survivor, deadline);
        ASSERT_TRUE(caught.ok()) << where << ": " << caught;
        ASSERT_TRUE(me.sharded_state->sharded()) << where;
        // The catch-up's state transfer: the parameters, stepped, from a
        // survivor.
        for (torch::Tensor& p : me.sharded->parameters()) {
          ASSERT_TRUE(
              comm->Broadcast(p.data_ptr(), p.numel(), DataType::kFloat32, 0, deadline).ok());
        }
        me.sharded_state->ParametersTransferred();
        ASSERT_TRUE(me.sharded_state->AtBoundary(comm, deadline).ok());
        me.ExpectReferenceWhole(comm, where + ", after the salvaged step");
        me.Steps(rank, 4, 3, comm, where);
        me.ExpectReferenceWhole(comm, where + ", step 6");
      });
}

// A second death in a regather: four ranks on two nodes train sharded
// with a buddy copy; a regather then completes on one rank only (the
// others' failed, the world broke), so that rank holds the whole state and
// no shards; and the rank whose shards that one backs up dies. In the
// next world the two ranges both of them kept have no living holder, but
// the rank that holds the whole state sends them, straight into the new
// world's shards: no rank makes the state whole, and every rank holds
// the unsharded optimizer's state, bit for bit, and trains on.
TEST_P(OptimizerShardsTest, ARankThatHoldsTheWholeStateSendsTheRangesWhoseHoldersDied) {
  std::vector<std::unique_ptr<Held>> held;
  for (int i = 0; i < 4; ++i) held.push_back(std::make_unique<Held>(GetParam()));
  int whole = -1, dead = -1;
  ASSERT_TRUE(RunCommWorld(4, "gloo", [&](int rank, Communicator* comm) {
                Held& me = *held[rank];
                me.LiveInWorld(rank, 1, 0, 3, comm);
                // The regather that completed everywhere, then the shards
                // made again everywhere but on one rank: as if only that
                // rank's regather had completed.
                ASSERT_TRUE(me.sharded_state->Whole(comm, absl::Now() + absl::Seconds(30)).ok());
              }).ok());
  {
    auto layout = ShardLayout::Make({1}, {0, 1, 0, 1}, 2);  // LiveInWorld's nodes: rank % 2
    ASSERT_TRUE(layout.ok());
    dead = 3;
    whole = layout->Holders(dead)[1];
    ASSERT_NE(whole % 2, dead % 2) << "a buddy on the other node";
  }
  std::vector<Held*> now;
  for (int r = 0; r < 4; ++r) {
    if (r != dead) now.push_back(held[r].get());
  }
  // The shards again on every rank but `whole`, in the layout of
  // generation 1 (no collective: Shard cuts what each rank holds).
  ASSERT_TRUE(RunCommWorld(4, "gloo", [&](int rank, Communicator* comm) {
                if (rank != whole) {
                  ASSERT_TRUE(held[rank]->sharded_state->Shard(comm).ok());
                }
              }).ok());
  ASSERT_FALSE(held[whole]->sharded_state->sharded());
  ASSERT_TRUE(RunCommWorld(3, "gloo", [&](int rank, Communicator* comm) {
                now[rank]->LiveInWorld(rank, 2, 3, 3, comm, /*straight=*/true);
              }).ok());
}

// With one copy, three ranks on two nodes fail a step (a link, not a
// rank: all three live on) and a joiner meets them in the next world. No
// rank in the step keeps the shard the joiner will keep, so the step could
// reach the joiner only through the whole state on every rank: instead
// every rank's Gather says RESOURCE_EXHAUSTED, nothing changed, and the
// world is entered again with the step dropped (no rank in a step). That
// goes straight to the new shards, and the four ranks take the dropped
// step again and train on bit for bit as the unsharded optimizer does.
TEST_P(OptimizerShardsTest, WithOneCopyAJoinerOutsideAFailedStepDropsItRatherThanGoWhole) {
  std::vector<std::unique_ptr<Held>> now;
  for (int i = 0; i < 3; ++i) now.push_back(std::make_unique<Held>(GetParam(), false, 1));
  ASSERT_TRUE(RunCommWorld(3, "gloo", [&](int rank, Communicator* comm) {
                now[rank]->LiveInWorld(rank, 1, 0, 3, comm);
              }).ok());
  // The joiner's reference: every rank's is the same.
  now.push_back(std::make_unique<Held>(GetParam(), false, 1));
  {
    torch::NoGradGuard no_grad;
    const auto from = now[0]->reference->parameters();
    const auto to = now[3]->reference->parameters();
    for (size_t i = 0; i < from.size(); ++i) to[i].copy_(from[i]);
    std::stringstream archive;
    torch::save(*now[0]->reference_opt, archive);
    torch::load(*now[3]->reference_opt, archive);
  }
  ASSERT_TRUE(RunCommWorld(4, "gloo", [&](int rank, Communicator* comm) {
                Held& me = *now[rank];
                const bool survivor = rank < 3;  // the joiner is rank 3
                const std::string where = absl::StrCat("generation 2, rank ", rank);
                const absl::Status salvaging = me.sharded_state->Gather(
                    comm, 2, /*node=*/rank % 2, absl::Now() + absl::Seconds(30), survivor ? 3 : -1,
                    survivor ? 1 : 0);
                ASSERT_TRUE(absl::IsResourceExhausted(salvaging)) << where << ": " << salvaging;
                ASSERT_EQ(me.sharded_state->sharded(), survivor) << where << ": as it was";
                me.LiveInWorld(rank, 2, 3, 3, comm, /*straight=*/true);
              }).ok());
}

// A communicator passed through, counting the all-gathers of the world
// and those inside a node.
class CountingGathers : public Communicator {
 public:
  explicit CountingGathers(Communicator* inner) : inner_(inner) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string name() const override { return inner_->name(); }
  absl::Status AllReduce(void* data, size_t count, DataType type, ReduceOp op,
                         absl::Time deadline) override {
    largest_all_reduce = std::max(largest_all_reduce, count);
    return inner_->AllReduce(data, count, type, op, deadline);
  }
  absl::Status ReduceScatter(void* data, const std::vector<size_t>& counts, DataType type,
                             ReduceOp op, absl::Time deadline) override {
    return inner_->ReduceScatter(data, counts, type, op, deadline);
  }
  absl::Status AllGather(void* data, const std::vector<size_t>& counts, DataType type,
                         absl::Time deadline) override {
    ++world_gathers;
    return inner_->AllGather(data, counts, type, deadline);
  }
  std::vector<int> NodeRanks() const override { return inner_->NodeRanks(); }
  absl::Status AllGatherInNode(void* data, const std::vector<size_t>& counts, DataType type,
                               absl::Time deadline) override {
    ++node_gathers;
    return inner_->AllGatherInNode(data, counts, type, deadline);
  }
  absl::Status Broadcast(void* data, size_t count, DataType type, int root,
                         absl::Time deadline) override {
    return inner_->Broadcast(data, count, type, root, deadline);
  }
  absl::Status Barrier(absl::Time deadline) override { return inner_->Barrier(deadline); }
  void Abort(const absl::Status& why) override { inner_->Abort(why); }

  int world_gathers = 0;
  int node_gathers = 0;
  size_t largest_all_reduce = 0;  // in elements of its type

 private:
  Communicator* inner_;
};

// `steps` sharded steps with two copies on ranks on `node_of` over
// `backend`, each against the unsharded optimizer: the parameters stay
// bit-identical. Returns, per rank, the world's and the node's all-gathers.
std::vector<std::pair<int, int>> StepsCountingGathers(const Kind& kind,
                                                      const std::vector<int>& node_of,
                                                      const std::string& backend, int64_t chunk) {
  std::vector<std::pair<int, int>> gathers(node_of.size());
  const absl::Status run = RunCommWorld(
      node_of, backend, GradientCompression::kNone, [&](int rank, Communicator* comm) {
        CountingGathers counting(comm);
        Net reference = MakeNet(), sharded = MakeNet();
        auto reference_opt = kind.make(reference);
        auto sharded_opt = kind.make(sharded);
        auto made = OptimizerShards::Make({sharded_opt.get()}, rank, node_of, /*copies=*/2);
        ASSERT_TRUE(made.ok()) << made.status();
        for (int step = 0; step < 4; ++step) {
          Backward(reference, rank, step);
          AverageGradients(*reference_opt, comm);
          reference_opt->step();
          Backward(sharded, rank, step);
          ShardedStep(sharded, *sharded_opt, **made, &counting, chunk);
          const auto want = reference->parameters(), got = sharded->parameters();
          for (size_t i = 0; i < want.size(); ++i) {
            ASSERT_TRUE(torch::equal(want[i], got[i]))
                << kind.name << " on " << comm->name() << ", rank " << rank << ", step " << step
                << ", parameter " << i;
          }
        }
        gathers[rank] = {counting.world_gathers, counting.node_gathers};
      });
  EXPECT_TRUE(run.ok()) << run;
  return gathers;
}

// Four ranks on two nodes of two (the hierarchical communicator), two
// copies: each node keeps every shard between its ranks (owners on one
// node, buddies on the other), so the parameters are gathered inside each
// node and no gather crosses nodes; they stay bit-identical to the
// unsharded optimizer's, the buddies' ranges coming from the buddies. In a
// world of two every rank keeps both shards, and nothing is gathered at
// all. Gathered in one round, and in rounds of 5 elements that cut through
// parameters and ranges.
TEST_P(OptimizerShardsTest, WhereANodeKeepsEveryShardTheGatherStaysInsideIt) {
  for (int64_t chunk : {OptimizerShards::kGatherChunk, int64_t{5}}) {
    const auto two_nodes = StepsCountingGathers(GetParam(), {0, 0, 1, 1}, "hier", chunk);
    for (const auto& [world, node] : two_nodes) {
      EXPECT_EQ(world, 0) << "no all-gather of the world";
      EXPECT_GT(node, 0) << "all-gathers inside the node";
    }
    for (const auto& [world, node] : StepsCountingGathers(GetParam(), {0, 1}, "gloo", chunk)) {
      EXPECT_EQ(world + node, 0) << "nothing to gather";
    }
  }
}

// In the world of three after rank 1's death (ThroughADeath): the
// agreement, then the move straight to the new shards in rounds of 3
// elements; `*largest_all_reduce` the largest all-reduce on the way (in
// elements of its type).
void MoveStraightInRoundsOf3(Held& me, Communicator* comm, size_t* largest_all_reduce) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  const bool holds = me.shards != nullptr;
  const absl::StatusOr<ShardWorld> agreed = AgreeOnShards(
      comm, /*node=*/0, holds ? 1 : 0, holds ? me.shards->rank() : -1, holds ? 3 : 0, deadline);
  ASSERT_TRUE(agreed.ok()) << agreed.status();
  ASSERT_EQ(agreed->alive, (std::vector<bool>{true, false, true}));
  CountingGathers counting(comm);
  auto moved =
      OptimizerShards::Redistribute(me.shards.get(), nullptr, {me.sharded_opt.get()}, *agreed,
                                    /*copies=*/2, &counting, deadline, /*chunk=*/3);
  ASSERT_TRUE(moved.ok()) << moved.status();
  me.shards = *std::move(moved);
  *largest_all_reduce = counting.largest_all_reduce;
}

// After a move straight to the new shards in a world of three: the
// parameters from a survivor (rank 0), as a state transfer brings them,
// three more sharded steps (3 to 5), then gathered: bit for bit the
// unsharded optimizer's state and parameters.
void TrainOnAfterTheMove(Held& me, int rank, Communicator* comm, const std::string& where) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  for (torch::Tensor& p : me.sharded->parameters()) {
    ASSERT_TRUE(comm->Broadcast(p.data_ptr(), p.numel(), DataType::kFloat32, 0, deadline).ok());
  }
  me.shards->TakeParameterValues();
  for (int step = 3; step < 6; ++step) me.Step(rank, step, comm);
  const absl::Status whole = me.shards->Unshard({true, true, true}, comm, deadline);
  ASSERT_TRUE(whole.ok()) << whole;
  me.ExpectReference(where + ", step 5");
}

// A rank of three dies (three steps with a buddy copy) and a joiner takes
// its place: the new world's shards come straight from the ranks that hold
// each range (Redistribute), in rounds of 3 elements, and no rank holds the
// whole state on the way: the joiner's parameters get no optimizer state,
// every rank's masters hold the state of the ranges it keeps and no more,
// and no all-reduce is larger than a round. Three more steps sharded, then
// gathered: bit for bit the unsharded optimizer's state and parameters.
// With a channels-last parameter too, whose group's masters copy their
// ranges: they take the values the transfer brings.
TEST_P(OptimizerShardsTest, AJoinerReceivesOnlyTheShardsItKeeps) {
  for (bool channels_last : {false, true}) {
    ThroughADeath(
        GetParam(),
        ThreeSteps,
        [](Held& me, int rank, Communicator* comm) {
          size_t largest_all_reduce = 0;
          MoveStraightInRoundsOf3(me, comm, &largest_all_reduce);
          if (::testing::Test::HasFatalFailure()) return;
          const std::string where = absl::StrCat("new rank ", rank);
          for (const torch::Tensor& p : me.sharded->parameters()) {
            // (A frozen parameter is not sharded: Adagrad's constructor gave
            // it state, which it keeps.)
            if (!p.requires_grad()) continue;
            EXPECT_EQ(FindOptimizerState(*me.sharded_opt, p), nullptr) << where;
          }
          const ShardLayout& layout = me.shards->layout();
          int64_t kept = 0, elements = 0;
          for (int g = 0; g < layout.groups(); ++g) {
            elements += layout.group_elements(g);
            for (int s : layout.KeptBy(rank)) kept += layout.Range(g, s).size();
          }
          // The unsharded state, per element (a 0-dim parameter's state is
          // not counted there: it is in a master's).
          const absl::StatusOr<int64_t> whole =
              OptimizerShards::WholeStateElements({me.reference_opt.get()});
          ASSERT_TRUE(whole.ok()) << whole.status();
          int64_t counted = 0;
          for (const torch::Tensor& p : me.reference->parameters()) {
            if (p.requires_grad() && p.dim() > 0) counted += p.numel();
          }
          EXPECT_EQ(me.shards->StateElements() * counted, *whole * kept)
              << where << ": the state of its " << kept << " kept elements of " << elements;
          EXPECT_LE(largest_all_reduce, 16u) << where << ": a round, not the whole state";
          TrainOnAfterTheMove(me, rank, comm, where);
        },
        channels_last);
  }
}

// The world breaks in the third step's gather, so only the masters hold
// that step's values; rank 1 dies and a joiner takes its place. The move
// straight to the new shards brings each range's values from its holder
// into the parameters, in rounds as the state is: no all-reduce is larger
// than a round, never a copy of the model. The survivors then hold the
// unsharded optimizer's parameters, and all train on as it does.
TEST_P(OptimizerShardsTest, StepValuesMoveStraightInRoundsAsTheStateDoes) {
  ThroughADeath(
      GetParam(),
      [](Held& me, int rank, Communicator* comm) {
        me.Step(rank, 0, comm);
        me.Step(rank, 1, comm);
        me.Step(rank, 2, comm, /*copies=*/2, nullptr, /*gather=*/false);
      },
      [](Held& me, int rank, Communicator* comm) {
        size_t largest_all_reduce = 0;
        MoveStraightInRoundsOf3(me, comm, &largest_all_reduce);
        if (::testing::Test::HasFatalFailure()) return;
        const std::string where = absl::StrCat("new rank ", rank);
        EXPECT_LE(largest_all_reduce, 16u) << where << ": a round, not the model";
        if (rank < 2) {  // a survivor: step 2's values, from the masters
          const auto want = me.reference->parameters(), got = me.sharded->parameters();
          for (size_t i = 0; i < want.size(); ++i) {
            EXPECT_TRUE(torch::equal(want[i], got[i])) << where << ": parameter " << i;
          }
        }
        TrainOnAfterTheMove(me, rank, comm, where);
      });
}

INSTANTIATE_TEST_SUITE_P(Optimizers, OptimizerShardsTest, ::testing::ValuesIn(Kinds()),
                         [](const ::testing::TestParamInfo<Kind>& info) {
                           return info.param.name;
                         });

// Four ranks on two nodes, two copies: each rank holds the Adam state of
// half the elements (its own quarter and its buddy's), against all of
// them unsharded.
TEST(OptimizerShardsStateTest, EachRankHoldsTheStateOfCopiesOverWorldOfTheElements) {
  int64_t trained = 0;
  for (const torch::Tensor& p : MakeNet()->parameters()) {
    if (p.requires_grad()) trained += p.numel();
  }
  for (int rank = 0; rank < 4; ++rank) {
    Net copy = MakeNet();
    torch::optim::Adam adam(copy->parameters(), torch::optim::AdamOptions(0.01));
    auto shards = OptimizerShards::Make({&adam}, rank, {0, 0, 1, 1}, /*copies=*/2);
    ASSERT_TRUE(shards.ok()) << shards.status();
    EXPECT_EQ((*shards)->StateElements(), 0) << "a fresh Adam makes its state at its first step";
    (*shards)->SetGradients(0, torch::ones({trained}));
    adam.step();
    // exp_avg and exp_avg_sq over the kept ranges.
    const ShardLayout& layout = (*shards)->layout();
    const int64_t kept =
        layout.Range(0, rank).size() + layout.Range(0, layout.KeptBy(rank)[1]).size();
    EXPECT_EQ((*shards)->StateElements(), 2 * kept) << "rank " << rank;
    EXPECT_LE(kept, trained / 2 + 2) << "rank " << rank;
    EXPECT_EQ(adam.state().size(), 2u) << "only the two masters hold state";
  }
}

// One copy, and rank 1 dies after a step: its range is in no survivor's
// memory. Both survivors say so, naming the range, and keep their shards.
TEST(OptimizerShardsStateTest, WithOneCopyADeadRanksStateIsNotFoundAndNothingChanges) {
  const Kind adam = Kinds()[2];
  std::vector<std::unique_ptr<Held>> held;
  for (int i = 0; i < 3; ++i) held.push_back(std::make_unique<Held>(adam));
  ASSERT_TRUE(RunCommWorld(3, "gloo", [&](int rank, Communicator* comm) {
                held[rank]->Step(rank, 0, comm, /*copies=*/1);
              }).ok());
  Held* now[2] = {held[0].get(), held[2].get()};
  ASSERT_TRUE(RunCommWorld(2, "gloo", [&](int rank, Communicator* comm) {
                Held& me = *now[rank];
                const absl::Status s =
                    me.shards->Unshard({true, false, true}, comm, absl::Now() + absl::Seconds(30));
                EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
                EXPECT_NE(s.message().find("(shard 1) has no living holder"), std::string::npos)
                    << s;
                EXPECT_EQ(me.sharded_opt->param_groups()[0].params().size(), 2u)
                    << "its master and the frozen bias, as before";
              }).ok());
}

// SGD without momentum keeps no state: what a dead rank alone holds is the
// new values of its range, from the optimizer's step until the boundary's
// gather. With one copy, rank 1 dies in that gather: both survivors say
// its range is lost, and keep their shards. Had it died after the gather,
// nothing would be lost: every rank holds every value.
TEST(OptimizerShardsStateTest, WithOneCopyStatelessValuesSteppedOnlyByADeadRankAreNotFound) {
  const Kind plain_sgd{"Sgd", [](Net& n) {
                         return std::make_unique<torch::optim::SGD>(n->parameters(),
                                                                    torch::optim::SGDOptions(0.05));
                       }};
  for (const bool gathered : {false, true}) {
    std::vector<std::unique_ptr<Held>> held;
    for (int i = 0; i < 3; ++i) held.push_back(std::make_unique<Held>(plain_sgd));
    ASSERT_TRUE(RunCommWorld(3, "gloo", [&](int rank, Communicator* comm) {
                  Held& me = *held[rank];
                  me.Step(rank, 0, comm, /*copies=*/1);
                  if (gathered) return;
                  // The next step up to the optimizer's, not gathered.
                  Backward(me.sharded, rank, 1);
                  for (int g = 0; g < me.shards->groups(); ++g) {
                    torch::Tensor flat = me.shards->FlatGradients(g);
                    ASSERT_TRUE(comm->AllReduce(flat.data_ptr(), flat.numel(), DataType::kFloat32,
                                                ReduceOp::kAverage,
                                                absl::Now() + absl::Seconds(30))
                                    .ok());
                    me.shards->SetGradients(g, flat);
                  }
                  me.sharded_opt->step();
                }).ok());
    Held* now[2] = {held[0].get(), held[2].get()};
    ASSERT_TRUE(RunCommWorld(2, "gloo", [&](int rank, Communicator* comm) {
                  Held& me = *now[rank];
                  const absl::Status s = me.shards->Unshard({true, false, true}, comm,
                                                            absl::Now() + absl::Seconds(30));
                  if (gathered) {
                    EXPECT_TRUE(s.ok()) << s;
                    me.ExpectReference(absl::StrCat("survivor ", rank, ", after the gather"));
                    return;
                  }
                  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
                  EXPECT_NE(s.message().find("(shard 1) has no living holder and was stepped"),
                            std::string::npos)
                      << s;
                  EXPECT_EQ(me.sharded_opt->param_groups()[0].params().size(), 2u)
                      << "its master and the frozen bias, as before";
                }).ok());
  }
}

// Four ranks on one node, two copies, two Adam steps: each shard's two
// copies agree, and every rank's masters hold its parameters' values. A
// changed moment in rank 3's copy of shard 1, or a parameter of rank 2
// given storage of its own and changed there (its masters are views of
// the parameters' storage until then), is DATA_LOSS on every rank naming
// it; the state stays sharded throughout.
TEST(OptimizerShardsStateTest, TheCopiesOfEachShardAreComparedWhereTheyAreKept) {
  const Kind adam = Kinds()[2];
  std::vector<std::unique_ptr<Held>> held;
  for (int i = 0; i < 4; ++i) held.push_back(std::make_unique<Held>(adam));
  ASSERT_TRUE(RunCommWorld(4, "gloo", [&](int rank, Communicator* comm) {
                Held& me = *held[rank];
                for (int step = 0; step < 2; ++step) me.Step(rank, step, comm);
                const auto check = [&] {
                  return me.shards->CheckCopiesAgree(comm, absl::Now() + absl::Seconds(30));
                };
                const absl::Status agree = check();
                EXPECT_TRUE(agree.ok()) << agree;
                // The group's list: this rank's master, the one it backs up,
                // the frozen bias.
                const std::vector<torch::Tensor> listed =
                    me.sharded_opt->param_groups()[0].params();
                ASSERT_EQ(listed.size(), 3u);
                torch::NoGradGuard no_grad;
                if (rank == 3) {
                  ASSERT_EQ(me.shards->layout().KeptBy(3), (std::vector<int>{3, 1}));
                  auto* state = static_cast<torch::optim::AdamParamState*>(
                      FindOptimizerState(*me.sharded_opt, listed[1]));
                  ASSERT_NE(state, nullptr);
                  state->exp_avg().narrow(0, 0, 1).add_(1e-3);
                }
                const absl::Status copies = check();
                EXPECT_EQ(copies.code(), absl::StatusCode::kDataLoss) << copies;
                EXPECT_NE(copies.message().find("the two copies of optimizer shard 1 differ: "
                                                "rank 1 (its owner) and rank 3 (its buddy)"),
                          std::string::npos)
                    << copies;
                if (rank == 2) {
                  torch::Tensor first = me.sharded->parameters()[0];
                  first.set_data(first.detach().clone());
                  first.add_(1e-3);
                }
                const absl::Status values = check();
                EXPECT_EQ(values.code(), absl::StatusCode::kDataLoss) << values;
                EXPECT_NE(values.message().find("rank 2's optimizer shards hold other values than "
                                                "its parameters"),
                          std::string::npos)
                    << values;
                EXPECT_EQ(me.sharded_opt->param_groups()[0].params().size(), 3u);
              }).ok());
}

// The parameters of a sharded group become views of one flat vector and
// each master a view of its range in it: the masters take no memory of
// their own, and the optimizer's step writes the kept ranges of the
// parameters themselves, so that a change the program makes to its
// parameters after its step (a WGAN's weight clipping, on every rank) is
// kept as unsharded. A group with a channels-last parameter keeps its
// layout, and its masters copy their ranges. Both train bit for bit as
// unsharded (without the clipping: with copies the gather writes every
// range from the masters).
TEST(OptimizerShardsStateTest, MastersAreViewsOfTheParametersWhereTheyAreContiguous) {
  const Kind adam = Kinds()[2];
  for (const bool channels_last : {false, true}) {
    const std::string where = channels_last ? "with a channels-last weight" : "contiguous";
    std::vector<std::unique_ptr<Held>> held;
    for (int i = 0; i < 3; ++i) held.push_back(std::make_unique<Held>(adam, channels_last));
    ASSERT_TRUE(RunCommWorld(3, "gloo", [&](int rank, Communicator* comm) {
                  Held& me = *held[rank];
                  const auto clip = [](Net& net) {
                    torch::NoGradGuard no_grad;
                    for (torch::Tensor& p : net->parameters()) p.clamp_(-0.25, 0.25);
                  };
                  for (int step = 0; step < 3; ++step) {
                    me.Step(rank, step, comm, /*copies=*/2,
                            channels_last ? std::function<void(Net&)>() : clip);
                    const auto want = me.reference->parameters(), got = me.sharded->parameters();
                    for (size_t i = 0; i < want.size(); ++i) {
                      ASSERT_TRUE(torch::equal(want[i], got[i]))
                          << where << ", rank " << rank << ", step " << step << ", parameter "
                          << i;
                    }
                  }
                  std::vector<torch::Tensor> trained;
                  for (const torch::Tensor& p : me.sharded->parameters()) {
                    if (p.requires_grad()) trained.push_back(p);
                  }
                  const std::vector<torch::Tensor> listed =
                      me.sharded_opt->param_groups()[0].params();
                  ASSERT_EQ(listed.size(), 3u) << "two masters and the frozen bias";
                  for (int k = 0; k < 2; ++k) {
                    EXPECT_EQ(listed[k].storage().is_alias_of(trained[0].storage()),
                              !channels_last)
                        << where << ", rank " << rank << ", master " << k;
                  }
                  for (size_t i = 1; i < trained.size(); ++i) {
                    EXPECT_EQ(trained[i].storage().is_alias_of(trained[0].storage()),
                              !channels_last)
                        << where << ", rank " << rank << ", parameter " << i;
                  }
                  if (channels_last) {
                    EXPECT_TRUE(me.sharded->named_parameters()["conv"].is_contiguous(
                        torch::MemoryFormat::ChannelsLast))
                        << "the program's layout is kept";
                  }
                }).ok());
  }
}

// A new world of four: two survivors of the newest layout (generation 5,
// three ranks, whose rank 1 is gone), a rank whose shards are of an older
// layout (3) and a joiner. Every rank learns the same: each rank's node,
// the newest layout, who of it lives on, and whose shards count.
TEST(OptimizerShardsStateTest, ANewWorldAgreesOnTheNewestLayoutAndWhoOfItLivesOn) {
  struct Claim {
    int node;
    uint64_t generation;
    int rank, world;
  };
  const Claim claims[4] = {{0, 5, 2, 3}, {0, 5, 0, 3}, {1, 3, 1, 4}, {1, 0, -1, 0}};
  ASSERT_TRUE(RunCommWorld(4, "gloo", [&](int rank, Communicator* comm) {
                const Claim& c = claims[rank];
                auto agreed = AgreeOnShards(comm, c.node, c.generation, c.rank, c.world,
                                            absl::Now() + absl::Seconds(30));
                ASSERT_TRUE(agreed.ok()) << agreed.status();
                EXPECT_EQ(agreed->node_of_rank, std::vector<int>({0, 0, 1, 1}));
                EXPECT_EQ(agreed->generation, 5u);
                EXPECT_EQ(agreed->layout_rank, std::vector<int>({2, 0, -1, -1}));
                EXPECT_EQ(agreed->alive, std::vector<bool>({true, false, true}));
              }).ok());
  // Ranks that hold the whole state: of the newest layout, the first is its
  // whole source; of an older one, nothing. Alone they make no layout.
  const Claim wholes[4] = {
      {0, 5, 2, 3}, {1, 5, kHoldsWholeState, 3}, {0, 4, kHoldsWholeState, 3},
      {1, 5, kHoldsWholeState, 3}};
  ASSERT_TRUE(RunCommWorld(4, "gloo", [&](int rank, Communicator* comm) {
                const Claim& c = wholes[rank];
                auto agreed = AgreeOnShards(comm, c.node, c.generation, c.rank, c.world,
                                            absl::Now() + absl::Seconds(30));
                ASSERT_TRUE(agreed.ok()) << agreed.status();
                EXPECT_EQ(agreed->generation, 5u);
                EXPECT_EQ(agreed->layout_rank, std::vector<int>({2, -1, -1, -1}));
                EXPECT_EQ(agreed->alive, std::vector<bool>({false, false, true}));
                EXPECT_EQ(agreed->whole_source, 1);
              }).ok());
  ASSERT_TRUE(RunCommWorld(2, "gloo", [&](int rank, Communicator* comm) {
                auto agreed = AgreeOnShards(comm, rank, 5, kHoldsWholeState, 3,
                                            absl::Now() + absl::Seconds(30));
                ASSERT_TRUE(agreed.ok()) << agreed.status();
                EXPECT_EQ(agreed->generation, 0u);
                EXPECT_EQ(agreed->whole_source, -1);
              }).ok());
  // Two ranks that claim one rank of the layout: refused on every rank.
  ASSERT_TRUE(RunCommWorld(2, "gloo", [&](int rank, Communicator* comm) {
                (void)rank;
                auto agreed = AgreeOnShards(comm, 0, 7, 1, 2, absl::Now() + absl::Seconds(30));
                EXPECT_EQ(agreed.status().code(), absl::StatusCode::kInvalidArgument)
                    << agreed.status();
              }).ok());
}

// A rank outside the failed step of the others holds no shards (a joiner)
// or the shards the step began from; one behind it drops its shards.
TEST(OptimizerShardsStateTest, ARankOutsideOrBehindTheFailedStepHoldsNoStaleShards) {
  // Survivors of a failed step (step 9 of generation 5) and a rank outside
  // it: not one step, but the rank is outside it where it holds nothing (a
  // joiner), or holds the shards of the layout as of step 9 (its boundary
  // broke before it began the step), or of an earlier step (8), which the
  // world has stepped past: it drops them and is a joiner. Shards of a step
  // it does not say make no such world.
  struct Outside {
    bool holds;
    int64_t step;
    bool outside;
  };
  for (const Outside& o : {Outside{false, -1, true}, Outside{true, -1, false},
                           Outside{true, 9, true}, Outside{true, 8, true}}) {
    ASSERT_TRUE(RunCommWorld(3, "gloo", [&](int rank, Communicator* comm) {
                  const bool other = rank == 2;
                  const bool none = other && !o.holds;
                  auto agreed = AgreeOnShards(
                      comm, rank, none ? 0 : 5, none ? -1 : rank, none ? 0 : 3,
                      absl::Now() + absl::Seconds(30), other ? -1 : 9, other ? 0 : 5,
                      other ? o.step : 9);
                  ASSERT_TRUE(agreed.ok()) << agreed.status();
                  EXPECT_FALSE(agreed->one_step);
                  const std::vector<bool> outside =
                      o.outside ? std::vector<bool>({false, false, true}) : std::vector<bool>();
                  EXPECT_EQ(agreed->outside_step, outside) << o.holds << " " << o.step;
                  EXPECT_EQ(agreed->layout_rank[2], o.holds && o.step != 8 ? 2 : -1)
                      << o.holds << " " << o.step;
                }).ok());
  }
  // A rank whose own step failed a step earlier (8, its node a step
  // behind): its shards are dropped, and it is in the step the others
  // failed, which it takes with the state it receives.
  ASSERT_TRUE(RunCommWorld(3, "gloo", [&](int rank, Communicator* comm) {
                const bool behind = rank == 2;
                auto agreed = AgreeOnShards(comm, rank, 5, rank, 3,
                                            absl::Now() + absl::Seconds(30), behind ? 8 : 9, 5,
                                            behind ? 8 : 9);
                ASSERT_TRUE(agreed.ok()) << agreed.status();
                EXPECT_TRUE(agreed->one_step);
                EXPECT_EQ(agreed->layout_rank, std::vector<int>({0, 1, -1}));
                EXPECT_EQ(agreed->alive, std::vector<bool>({true, true, false}));
              }).ok());
}

// Where every rank would keep every part (a world of one, or of two with
// two copies), sharding would only add the masters' copies: the state
// stays whole and the optimizer steps the model's own parameters, as
// unsharded. A third rank, or one copy, shards it.
TEST(OptimizerShardsStateTest, AWorldWhereEachRankWouldKeepEveryPartStaysWhole) {
  struct Case {
    int world, copies;
    bool sharded;
  };
  for (const Case c : {Case{1, 2, false}, Case{2, 2, false}, Case{2, 1, true}, Case{3, 2, true}}) {
    const std::string where = absl::StrCat("world ", c.world, ", ", c.copies, " copies");
    std::vector<Net> nets;
    std::vector<std::unique_ptr<torch::optim::Adam>> adams;
    std::vector<std::unique_ptr<ShardedOptimizers>> state;
    for (int r = 0; r < c.world; ++r) {
      nets.push_back(MakeNet());
      adams.push_back(std::make_unique<torch::optim::Adam>(nets.back()->parameters(),
                                                           torch::optim::AdamOptions(0.01)));
      state.push_back(std::make_unique<ShardedOptimizers>(
          std::vector<torch::optim::Optimizer*>{adams.back().get()}, c.copies));
    }
    ASSERT_TRUE(RunCommWorld(c.world, "gloo", [&](int rank, Communicator* comm) {
                  ShardedOptimizers& mine = *state[rank];
                  const absl::Time deadline = absl::Now() + absl::Seconds(30);
                  ASSERT_TRUE(mine.Gather(comm, 1, /*node=*/rank % 2, deadline).ok()) << where;
                  ASSERT_TRUE(mine.Reshard(comm).ok()) << where;
                  EXPECT_EQ(mine.KeepsWhole(c.world), !c.sharded) << where;
                  EXPECT_EQ(mine.sharded(), c.sharded) << where;
                  const torch::Tensor stepped = adams[rank]->param_groups()[0].params()[0];
                  EXPECT_EQ(stepped.is_same(nets[rank]->parameters()[0]), !c.sharded) << where;
                }).ok())
        << where;
  }
}

TEST(OptimizerShardsStateTest, WhatCannotBeShardedIsRefusedNamingIt) {
  Net net = MakeNet();
  torch::optim::LBFGS lbfgs(net->parameters(), torch::optim::LBFGSOptions(0.1));
  auto refused = OptimizerShards::Make({&lbfgs}, 0, {0}, 1);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("LBFGS"), std::string::npos) << refused.status();

  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{torch::zeros({3}, torch::requires_grad())});
  groups.emplace_back(std::vector<torch::Tensor>{
      torch::zeros({3}, torch::TensorOptions().dtype(torch::kFloat64).requires_grad(true))});
  torch::optim::SGD sgd(groups, torch::optim::SGDOptions(0.1));
  refused = OptimizerShards::Make({&sgd}, 0, {0}, 1);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("optimizer 0 group 1: parameter 0 is Double"),
            std::string::npos)
      << refused.status();
  EXPECT_EQ(sgd.param_groups()[0].params().size(), 1u);
  EXPECT_EQ(sgd.param_groups()[0].params()[0].numel(), 3) << "a refusal swaps nothing";
}

}  // namespace
}  // namespace muster
