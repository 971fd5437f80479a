// OptimizerShards: the agreement on who holds what: the world's shards
// (AgreeOnShards), the header of an assembly, and the check that the
// copies of each range agree (optimizer_shards.h).
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

void HashTensor(XXH3_state_t* h, const torch::Tensor& t) {
  const torch::Tensor c = t.detach().contiguous().cpu();
  XXH3_64bits_update(h, c.data_ptr(), static_cast<size_t>(c.numel()) * c.element_size());
}

}  // namespace

absl::Status OptimizerShards::CheckCopiesAgree(Communicator* comm, absl::Time deadline) const {
  const int W = layout_.world();
  if (comm->size() != W || comm->rank() != rank_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "check the shards' copies: rank ", comm->rank(), " of ", comm->size(),
        " is not rank ", rank_, " of the layout's ", W));
  }
  // By shard, its owner's digest, then its buddy's; then by rank, whether
  // its masters differ from its parameters. One writer per word: the sum
  // is exact.
  std::vector<int64_t> table(3 * static_cast<size_t>(W), 0);
  torch::NoGradGuard no_grad;
  const std::vector<int> kept = layout_.KeptBy(rank_);
  std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> h(XXH3_createState(),
                                                                      &XXH3_freeState);
  for (size_t k = 0; k < kept.size(); ++k) {
    XXH3_64bits_reset(h.get());
    for (const Group& group : groups_) {
      if (k >= group.masters.size()) continue;
      HashTensor(h.get(), group.masters[k]);
      torch::optim::OptimizerParamState* state =
          FindOptimizerState(*group.optimizer, group.masters[k]);
      if (state == nullptr) continue;
      const auto& options = group.optimizer->param_groups()[group.index].options();
      for (const auto& [name, field] : group.codec->Save(*state, options)) {
        XXH3_64bits_update(h.get(), name.data(), name.size());
        HashTensor(h.get(), field);
      }
    }
    table[k * W + static_cast<size_t>(kept[k])] =
        static_cast<int64_t>(XXH3_64bits_digest(h.get()));
  }
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (MastersDifferFromParameters(groups_[g].params, groups_[g].masters, static_cast<int>(g),
                                    layout_, rank_)) {
      table[2 * W + rank_] = 1;
    }
  }
  MUSTER_RETURN_IF_ERROR(AllReduceValues(comm, table.data(), table.size(), DataType::kInt64,
                                         ReduceOp::kSum, deadline));
  for (int r = 0; r < W; ++r) {
    if (table[2 * W + r] != 0) {
      return absl::DataLossError(absl::StrCat(
          "rank ", r, "'s optimizer shards hold other values than its parameters after the "
          "step's gather"));
    }
  }
  if (layout_.copies() < 2) return absl::OkStatus();
  for (int s = 0; s < W; ++s) {
    if (table[s] != table[W + s]) {
      const std::vector<int> holders = layout_.Holders(s);
      return absl::DataLossError(absl::StrCat("the two copies of optimizer shard ", s,
                                              " differ: rank ", holders[0],
                                              " (its owner) and rank ", holders[1],
                                              " (its buddy) hold other values or state"));
    }
  }
  return absl::OkStatus();
}

absl::Status OptimizerShards::AgreeOnHeader(const std::vector<Group>& groups,
                                            const ShardLayout* layout, int rank,
                                            const std::string& lost, Communicator* comm,
                                            absl::Time deadline, std::vector<int64_t>* header) {
  const size_t G = groups.size();
  const bool whole = rank == kHoldsWholeState;
  std::vector<int64_t>& h = *header;
  h.assign(2 * G + 2, 0);
  h[0] = lost.empty() ? 0 : 1;
  for (size_t g = 0; g < G; ++g) {
    const Group& group = groups[g];
    // The whole source holds every range in its parameters' own state.
    const std::vector<torch::Tensor>& mine = whole ? group.params : group.masters;
    const bool held = layout != nullptr && !mine.empty();
    h[g + 1] = held && FindOptimizerState(*group.optimizer, mine[0]) != nullptr;
    h[G + g + 1] = held;
    if (held && !whole && h[2 * G + 1] == 0 &&
        SteppedSinceGathered(group, static_cast<int>(g), *layout, rank)) {
      h[2 * G + 1] = 1;
    }
  }
  MUSTER_RETURN_IF_ERROR(
      AllReduceValues(comm, h.data(), h.size(), DataType::kInt64, ReduceOp::kSum, deadline));
  bool any_state = false;
  for (size_t g = 0; g < G; ++g) any_state = any_state || h[g + 1] > 0;
  // A lost range is lost whether it has state or only values: an optimizer
  // without state (SGD without momentum) that stepped since the last gather
  // holds the range's new values in its masters alone. Every rank steps
  // the same step, so a survivor that stepped means the dead one did too.
  if (h[0] > 0 && (any_state || h[2 * G + 1] > 0)) {
    return absl::NotFoundError(absl::StrCat(
        lost.empty() ? "a range of the optimizer state has no living holder" : lost,
        any_state ? "" : " and was stepped since the last gather",
        ": it must come from a checkpoint"));
  }
  return absl::OkStatus();
}

namespace {

// ShardWorld::outside_step from AgreeOnShards' words (`stride` a rank).
std::vector<bool> OutsideTheStep(const int64_t* words, int size, int stride) {
  const int64_t* in_step = nullptr;
  for (int r = 0; r < size && in_step == nullptr; ++r) {
    if (words[r * stride + 4] >= 0) in_step = words + r * stride;
  }
  if (in_step == nullptr) return {};
  std::vector<bool> outside(static_cast<size_t>(size), false);
  for (int r = 0; r < size; ++r) {
    const int64_t* w = words + r * stride;
    if (w[4] == in_step[4] && w[5] == in_step[5]) continue;
    if (w[4] >= 0) return {};  // in another step
    // Its state, if any, must be the one the step began from: it took
    // every step before it (its boundary broke), and none after.
    const bool holds = w[1] != 0 || w[2] != -1;
    if (holds && w[6] != in_step[4]) return {};
    outside[r] = true;
  }
  return outside;
}

// The newest layout some rank holds shards of (0: none); a rank that holds
// the whole state of a layout does not make it the newest.
uint64_t NewestLayout(const int64_t* words, int size, int stride) {
  uint64_t generation = 0;
  for (int r = 0; r < size; ++r) {
    if (words[r * stride + 2] == kHoldsWholeState) continue;
    generation = std::max(generation, static_cast<uint64_t>(words[r * stride + 1]));
  }
  return generation;
}

// A holder of the newest layout that has taken fewer steps than another
// holds state the world has stepped past: a failure can leave one node's
// ranks a step ahead of another's, since a boundary's gather may run inside
// the nodes. Its words become a joiner's (it holds nothing, and receives
// its new shards from the holders that are not behind); where it was in a
// failed step, it is in the failed step of the ranks ahead, if any: it
// takes that step as they do, with the state it receives.
void DropStaleHolders(int64_t* words, int size, int stride) {
  const uint64_t generation = NewestLayout(words, size, stride);
  const auto holds_newest = [&](const int64_t* w) {
    return generation != 0 && static_cast<uint64_t>(w[1]) == generation && w[6] >= 0;
  };
  int64_t newest_step = -1;
  const int64_t* ahead = nullptr;  // a rank of the newest step, in a failed step if any is
  for (int r = 0; r < size; ++r) {
    const int64_t* w = words + r * stride;
    const bool in_step = w[4] >= 0 && (ahead == nullptr || ahead[4] < 0);
    if (holds_newest(w) && (w[6] > newest_step || (w[6] == newest_step && in_step))) {
      newest_step = w[6];
      ahead = w;
    }
  }
  for (int r = 0; r < size; ++r) {
    int64_t* w = words + r * stride;
    if (!holds_newest(w) || w[6] >= newest_step) continue;
    w[1] = 0;
    w[2] = -1;
    w[3] = 0;
    if (w[4] >= 0) {
      w[4] = ahead[4];
      w[5] = ahead[5];
    }
  }
}

}  // namespace

absl::StatusOr<ShardWorld> AgreeOnShards(Communicator* comm, int node, uint64_t generation,
                                         int rank, int world, absl::Time deadline,
                                         int64_t failed_step, uint64_t failed_generation,
                                         int64_t step) {
  constexpr int64_t kWords = 7;
  const int size = comm->size();
  std::vector<int64_t> all(static_cast<size_t>(size * kWords), 0);
  int64_t* mine = all.data() + comm->rank() * kWords;
  mine[0] = node;
  mine[1] = static_cast<int64_t>(generation);
  mine[2] = rank;
  mine[3] = world;
  mine[4] = failed_step;
  mine[5] = static_cast<int64_t>(failed_generation);
  mine[6] = step;
  MUSTER_RETURN_IF_ERROR(AllGatherValues(comm, all.data(),
                                         std::vector<size_t>(size, static_cast<size_t>(kWords)),
                                         DataType::kInt64, deadline));
  DropStaleHolders(all.data(), size, static_cast<int>(kWords));
  const int64_t* words = all.data();
  ShardWorld out;
  out.generation = NewestLayout(words, size, static_cast<int>(kWords));
  for (int r = 0; r < size; ++r) {
    out.node_of_rank.push_back(static_cast<int>(words[r * kWords]));
    out.one_step = out.one_step && words[r * kWords + 4] == words[4] &&
                   words[r * kWords + 5] == words[5];
  }
  if (!out.one_step) out.outside_step = OutsideTheStep(words, size, static_cast<int>(kWords));
  int64_t layout_world = -1;
  for (int r = 0; r < size; ++r) {
    const int64_t* w = words + r * kWords;
    const bool newest = out.generation != 0 && static_cast<uint64_t>(w[1]) == out.generation;
    const bool whole = w[2] == kHoldsWholeState;
    out.layout_rank.push_back(newest && !whole ? static_cast<int>(w[2]) : -1);
    if (!newest) continue;
    if (whole && out.whole_source < 0) out.whole_source = r;
    if (layout_world >= 0 && w[3] != layout_world) {
      return absl::InvalidArgumentError(absl::StrCat("the shards of generation ", out.generation,
                                                     " are said to be of ", layout_world,
                                                     " and of ", w[3], " ranks"));
    }
    layout_world = w[3];
  }
  if (out.generation == 0) return out;
  out.alive.assign(static_cast<size_t>(layout_world), false);
  for (int r = 0; r < size; ++r) {
    const int held = out.layout_rank[r];
    if (held < 0) continue;
    if (held >= layout_world || out.alive[held]) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", r, " claims rank ", held,
                                                     " of the shards of generation ",
                                                     out.generation, ", of ", layout_world,
                                                     " ranks, which another holds or is none"));
    }
    out.alive[held] = true;
  }
  return out;
}

}  // namespace muster
