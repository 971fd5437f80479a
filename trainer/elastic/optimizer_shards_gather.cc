// OptimizerShards: the parameters from the owners of each range at a step
// boundary, and what the optimizers stepped since the last gather (the
// catch-up after a salvaged step; optimizer_shards.h).
#include "trainer/elastic/optimizer_shards.h"

#include <c10/util/strides.h>
#include <torch/torch.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "trainer/checkpoint/optimizer_codecs.h"
#include "trainer/checkpoint/state_tensors.h"
#include "trainer/comm/values.h"
#include "trainer/ddp/device_comm.h"
#include "trainer/ddp/storage_alias.h"
#include "trainer/elastic/optimizer_shards_internal.h"

namespace muster {

namespace {

// A fingerprint of `t`'s bits: XXH3 of its bytes on the CPU; elsewhere the
// sum of its 32-bit words, reduced where it lives (a copy to the host at
// every gather would cost the masters' size each step).
int64_t Fingerprint(const torch::Tensor& t) {
  torch::NoGradGuard no_grad;
  if (t.numel() == 0) return 0;
  if (t.device().is_cpu() && t.is_contiguous()) {
    return static_cast<int64_t>(
        XXH3_64bits(t.data_ptr(), static_cast<size_t>(t.numel()) * t.element_size()));
  }
  return t.detach().contiguous().view(torch::kInt32).sum(torch::kInt64).item<int64_t>();
}

}  // namespace

bool OptimizerShards::SteppedSinceGathered(const Group& group, int g, const ShardLayout& layout,
                                           int rank) {
  for (size_t k = 0; k < group.masters.size() && k < group.gathered_versions.size(); ++k) {
    if (static_cast<int64_t>(group.masters[k]._version()) != group.gathered_versions[k]) {
      return true;
    }
  }
  if (!group.values.defined()) {
    return MastersDifferFromParameters(group.params, group.masters, g, layout, rank);
  }
  for (size_t k = 0; k < group.masters.size() && k < group.gathered_prints.size(); ++k) {
    if (Fingerprint(group.masters[k]) != group.gathered_prints[k]) return true;
  }
  return false;
}

void OptimizerShards::MarkGathered(Group& group) {
  group.gathered_versions.clear();
  group.gathered_prints.clear();
  for (const torch::Tensor& m : group.masters) {
    group.gathered_versions.push_back(static_cast<int64_t>(m._version()));
    if (group.values.defined()) group.gathered_prints.push_back(Fingerprint(m));
  }
}

absl::Status OptimizerShards::GatherParameters(Communicator* comm, absl::Time deadline,
                                               int64_t chunk_elements) {
  return GatherGroups(comm, deadline, chunk_elements, std::vector<int64_t>(groups_.size(), 1));
}

absl::Status OptimizerShards::GatherStepped(Communicator* comm, absl::Time deadline,
                                            int64_t chunk_elements) {
  std::vector<int64_t> stepped(groups_.size(), 0);
  for (size_t g = 0; g < groups_.size(); ++g) {
    stepped[g] = SteppedSinceGathered(groups_[g], static_cast<int>(g), layout_, rank_);
  }
  // A rank whose kept ranges of a group are empty cannot tell: the world's
  // sum decides for all.
  MUSTER_RETURN_IF_ERROR(AllReduceValues(comm, stepped.data(), stepped.size(), DataType::kInt64,
                                         ReduceOp::kSum, deadline));
  return GatherGroups(comm, deadline, chunk_elements, stepped);
}

absl::Status OptimizerShards::GatherGroups(Communicator* comm, absl::Time deadline,
                                           int64_t chunk_elements,
                                           const std::vector<int64_t>& gather) {
  if (comm->size() != layout_.world()) {
    return absl::InvalidArgumentError(absl::StrCat("a layout of ", layout_.world(),
                                                   " ranks gathered over ", comm->size()));
  }
  // Rounds, not contiguous chunks: each takes a piece of every shard, so
  // every rank sends in every round (PlanGatherRounds).
  const std::vector<GatherRound> rounds = PlanGatherRounds(layout_, chunk_elements);
  int64_t largest = 0;
  for (const GatherRound& round : rounds) {
    int64_t n = 0;
    for (const ElementRange& piece : round.pieces) n += piece.size();
    largest = std::max(largest, n);
  }
  // Inside each node where its ranks keep every shard: `provider[s]` is
  // the node-local rank that sends shard s's pieces there. Where every
  // rank keeps every shard (two copies in a world of two), each is its
  // own "node" and nothing is sent at all.
  int node_size = 1;
  std::vector<std::vector<int>> node_plan = PlanNodeGather(layout_, node_size);
  if (node_plan.empty()) {
    node_size = static_cast<int>(comm->NodeRanks().size());
    node_plan = PlanNodeGather(layout_, node_size);
  }
  const bool in_node = !node_plan.empty();
  const int local = in_node ? rank_ % node_size : rank_;
  const std::vector<int> provider = in_node ? node_plan[rank_ / node_size] : std::vector<int>();
  // One round's buffer, reused: the pieces by sender, each sender's in
  // shard order (in rank order when every rank sends its own).
  torch::Tensor buffer = torch::empty(
      {largest}, torch::TensorOptions().dtype(torch::kFloat32).device(CommDevice(*comm)));
  const int W = layout_.world();
  const std::vector<int> kept = layout_.KeptBy(rank_);
  for (const GatherRound& round : rounds) {
    const int g = round.group;
    // A group with nothing trained is the same on every rank.
    if (groups_[g].masters.empty() || gather[g] == 0) continue;
    const std::vector<size_t> sizes = round.counts();
    std::vector<size_t> counts(in_node ? node_size : W, 0);
    std::vector<int> sender(W);
    for (int s = 0; s < W; ++s) {
      sender[s] = in_node ? provider[s] : s;
      counts[sender[s]] += sizes[s];
    }
    std::vector<torch::Tensor> parts(W);
    int64_t at = 0;
    for (size_t who = 0; who < counts.size(); ++who) {
      for (int s = 0; s < W; ++s) {
        if (sender[s] != static_cast<int>(who)) continue;
        parts[s] = buffer.narrow(0, at, static_cast<int64_t>(sizes[s]));
        at += static_cast<int64_t>(sizes[s]);
      }
    }
    for (int s = 0; s < W; ++s) {
      if (sender[s] == local) WriteKept(g, s, round.pieces[s], &parts[s]);
    }
    if (!in_node) {
      MUSTER_RETURN_IF_ERROR(
          comm->AllGather(buffer.data_ptr(), counts, DataType::kFloat32, deadline));
    } else if (node_size > 1) {
      MUSTER_RETURN_IF_ERROR(
          comm->AllGatherInNode(buffer.data_ptr(), counts, DataType::kFloat32, deadline));
    }
    // Where this rank's masters are its parameters' storage, the pieces
    // it keeps are in place already.
    const bool shared = MastersShareParameters(g);
    for (int s = 0; s < W; ++s) {
      const bool in_place = shared && std::find(kept.begin(), kept.end(), s) != kept.end();
      if (sizes[s] > 0 && !in_place) Install(g, round.pieces[s], parts[s]);
    }
  }
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (gather[g] != 0) MarkGathered(groups_[g]);
  }
  return absl::OkStatus();
}

}  // namespace muster
