// OptimizerShards: the state whole again: from the living holders of each
// range (Unshard), or from a rank that holds it whole (optimizer_shards.h).
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

absl::Status CheckAliveWords(const std::vector<bool>& alive, const ShardLayout& layout, int rank,
                             const char* what) {
  if (static_cast<int>(alive.size()) == layout.world() && (rank < 0 || alive[rank])) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      what, ": ", alive.size(), " ranks said alive or not, of a layout of ", layout.world(),
      rank >= 0 ? absl::StrCat(", this rank ", rank, " among them") : std::string()));
}

absl::Status OptimizerShards::CheckAlive(const std::vector<bool>& alive,
                                         const char* what) const {
  return CheckAliveWords(alive, layout_, rank_, what);
}

absl::Status OptimizerShards::Unshard(const std::vector<bool>& alive, Communicator* comm,
                                      absl::Time deadline, int whole_source) {
  MUSTER_RETURN_IF_ERROR(CheckAlive(alive, "unshard"));
  MUSTER_RETURN_IF_ERROR(
      Assemble(groups_, &layout_, rank_, alive, whole_source, comm, deadline));
  groups_.clear();
  return absl::OkStatus();
}

absl::Status OptimizerShards::Check(const std::vector<torch::optim::Optimizer*>& optimizers) {
  std::vector<Group> groups;
  std::vector<int64_t> elements;
  return Collect(optimizers, &groups, &elements);
}

void OptimizerShards::ResetParameterGradients() {
  for (Group& group : groups_) {
    for (torch::Tensor& p : group.params) p.mutable_grad().reset();
  }
}

void OptimizerShards::Restore(std::vector<Group>& groups) {
  for (Group& group : groups) {
    for (const torch::Tensor& master : group.masters) {
      EraseOptimizerState(*group.optimizer, master);
    }
    group.optimizer->param_groups()[group.index].params() = group.listed;
    group.masters.clear();
  }
}

void OptimizerShards::Release() {
  Restore(groups_);
  groups_.clear();
}

absl::Status OptimizerShards::ReceiveUnsharded(
    const std::vector<torch::optim::Optimizer*>& optimizers, Communicator* comm,
    absl::Time deadline) {
  std::vector<Group> groups;
  std::vector<int64_t> elements;
  MUSTER_RETURN_IF_ERROR(Collect(optimizers, &groups, &elements));
  return Assemble(groups, /*layout=*/nullptr, /*rank=*/-1, {}, /*whole_source=*/-1, comm,
                  deadline);
}

absl::Status OptimizerShards::SendWhole(const std::vector<torch::optim::Optimizer*>& optimizers,
                                        const ShardLayout& layout,
                                        const std::vector<bool>& alive, Communicator* comm,
                                        absl::Time deadline) {
  std::vector<Group> groups;
  std::vector<int64_t> elements;
  MUSTER_RETURN_IF_ERROR(Collect(optimizers, &groups, &elements));
  MUSTER_RETURN_IF_ERROR(CheckAliveWords(alive, layout, /*rank=*/-1, "send whole"));
  return Assemble(groups, &layout, kHoldsWholeState, alive, comm->rank(), comm, deadline);
}

// Whether some shard comes from the whole source (ShardSources).
bool AnyFromWhole(const std::vector<int>& source) {
  return std::find(source.begin(), source.end(), kHoldsWholeState) != source.end();
}

// The rank of `layout` that sends each shard: the first of its holders
// that `alive` says lives on; else kHoldsWholeState where a rank holds the
// whole state (`whole`), or -1. `*lost` names the first range with
// elements that nobody sends ("" when there is none).
std::vector<int> ShardSources(const ShardLayout& layout, const std::vector<bool>& alive,
                              bool whole, std::string* lost) {
  std::vector<int> source;
  for (int s = 0; s < layout.world(); ++s) {
    int from = -1;
    for (int h : layout.Holders(s)) {
      if (alive[h]) {
        from = h;
        break;
      }
    }
    if (from < 0 && whole) from = kHoldsWholeState;
    source.push_back(from);
    for (int g = 0; g < layout.groups() && from == -1 && lost->empty(); ++g) {
      const ElementRange r = layout.Range(g, s);
      if (r.size() > 0) {
        *lost = absl::StrCat("the optimizer state of group ", g, " elements [", r.begin, ", ",
                             r.end, ") (shard ", s, ") has no living holder");
      }
    }
  }
  return source;
}

// Every rank of `comm`: a header (a range lost anywhere? state in which
// groups?) summed over the world, then, for each group with state, one
// buffer of its fields, flat over the group's elements, into which the
// living holder of each range writes its master's state and everyone else
// zeros. The buffer is summed as int64 words: each word has one writer,
// so the sum moves the float32 bits exactly (a float sum would turn -0
// into +0).
absl::Status OptimizerShards::Assemble(std::vector<Group>& groups, const ShardLayout* layout,
                                       int rank, const std::vector<bool>& alive,
                                       int whole_source, Communicator* comm,
                                       absl::Time deadline) {
  const size_t G = groups.size();
  const bool whole = rank == kHoldsWholeState;
  std::string lost;
  const std::vector<int> source =
      layout != nullptr ? ShardSources(*layout, alive, whole_source >= 0, &lost)
                        : std::vector<int>();
  torch::NoGradGuard no_grad;
  std::vector<int64_t> header;
  MUSTER_RETURN_IF_ERROR(AgreeOnHeader(groups, layout, rank, lost, comm, deadline, &header));
  for (size_t g = 0; g < G; ++g) {
    Group& group = groups[g];
    // Nobody holds sharded state for it: each rank keeps what its own
    // optimizer holds (none before a first step, or what its constructor
    // made, as Adagrad's does), which the state transfer that follows a
    // new world makes equal.
    if (header[g + 1] == 0) continue;
    MUSTER_ASSIGN_OR_RETURN(
        FlatState state,
        StartFlatState(group, static_cast<int>(g), *comm, group.PaddedElements()));
    if (layout != nullptr) {
      MUSTER_RETURN_IF_ERROR(
          whole ? WriteWholeState(group, static_cast<int>(g), *layout, source, &state)
                : WriteHeldState(group, static_cast<int>(g), *layout, rank, source, &state));
    }
    MUSTER_RETURN_IF_ERROR(comm->AllReduce(state.flat.data_ptr(),
                                           static_cast<size_t>(state.flat.numel() / 2),
                                           DataType::kInt64, ReduceOp::kSum, deadline));
    MUSTER_RETURN_IF_ERROR(InstallFlatState(group, state));
  }
  for (size_t g = 0; g < G; ++g) {
    if (header[G + g + 1] == 0) continue;
    MUSTER_RETURN_IF_ERROR(
        AssembleValues(groups[g], static_cast<int>(g), layout, rank, source, comm, deadline));
  }
  Restore(groups);
  return absl::OkStatus();
}

// Between an optimizer step and the boundary's GatherParameters only the
// masters hold the new values of their ranges (a world that broke in that
// gather leaves the parameters differing by rank): each range's values
// come from the rank that sends its state, moved as int64 words as the
// state is. A range nobody sends keeps this rank's own values; a joiner
// (`layout` null) keeps its own, which the state transfer replaces.
namespace {

// For each parameter of `params` (laid end to end) that meets `range`:
// fn(p, at, n, into): its `n` elements from `at` (in its own flat order)
// are those from `into` within `range`.
template <typename Fn>
void ForEachPiece(const std::vector<torch::Tensor>& params, ElementRange range, Fn fn) {
  int64_t offset = 0;
  for (const torch::Tensor& p : params) {
    const ElementRange piece = Overlap(ElementRange{offset, offset + p.numel()}, range);
    if (piece.size() > 0) fn(p, piece.begin - offset, piece.size(), piece.begin - range.begin);
    offset += p.numel();
  }
}

// `from` (1-D, of `range`'s size) into the elements `range` of `params`
// laid end to end. A piece that holds these bits already is not written:
// a graph built on its parameter before the regroup (a GAN's generated
// images, made before the step's first pass) checks its version in its
// backward. A parameter that is not contiguous goes through a copy of it.
void WriteValues(const std::vector<torch::Tensor>& params, ElementRange range,
                 const torch::Tensor& from) {
  ForEachPiece(params, range, [&](const torch::Tensor& p, int64_t at, int64_t n, int64_t into) {
    const torch::Tensor values = from.narrow(0, into, n).to(p.device());
    torch::Tensor target = p.detach();
    const bool contiguous = target.is_contiguous();
    torch::Tensor flat = contiguous ? target.view({-1}) : target.reshape({-1}).clone();
    torch::Tensor part = flat.narrow(0, at, n);
    if (!SameBits(part, values)) {
      part.copy_(values);
      if (!contiguous) target.copy_(flat.view_as(target));
    }
  });
}

}  // namespace

void ReadValues(const std::vector<torch::Tensor>& params, ElementRange range, torch::Tensor to) {
  ForEachPiece(params, range, [&](const torch::Tensor& p, int64_t at, int64_t n, int64_t into) {
    to.narrow(0, into, n).copy_(p.detach().reshape({-1}).narrow(0, at, n));
  });
}

absl::Status OptimizerShards::AssembleValues(const Group& group, int g, const ShardLayout* layout,
                                             int rank, const std::vector<int>& source,
                                             Communicator* comm, absl::Time deadline,
                                             int64_t chunk) {
  const torch::TensorOptions options =
      torch::TensorOptions().dtype(torch::kFloat32).device(CommDevice(*comm));
  const bool from_whole = rank == kHoldsWholeState && AnyFromWhole(source);
  const std::vector<int> kept =
      layout != nullptr && rank >= 0 ? layout->KeptBy(rank) : std::vector<int>();
  // In rounds of `chunk` elements (even: they travel as int64 words), so
  // that a rank holds one round beside the model, never a copy of it.
  const int64_t padded = group.PaddedElements();
  chunk = std::max<int64_t>(chunk, 2);
  chunk += chunk % 2;
  for (int64_t begin = 0; begin < padded; begin += chunk) {
    const ElementRange round{begin, std::min(padded, begin + chunk)};
    torch::Tensor flat = torch::zeros({round.size()}, options);
    const auto in_round = [&](ElementRange piece) {
      return flat.narrow(0, piece.begin - round.begin, piece.size());
    };
    for (int s = 0; from_whole && s < layout->world(); ++s) {
      const ElementRange piece = Overlap(layout->Range(g, s), round);
      if (source[s] == kHoldsWholeState && piece.size() > 0) {
        ReadValues(group.params, piece, in_round(piece));
      }
    }
    for (size_t k = 0; k < kept.size() && k < group.masters.size(); ++k) {
      const ElementRange range = layout->Range(g, kept[k]);
      const ElementRange piece = Overlap(range, round);
      if (source[kept[k]] != rank || piece.size() <= 0) continue;
      in_round(piece).copy_(group.masters[k].narrow(0, piece.begin - range.begin, piece.size()));
    }
    MUSTER_RETURN_IF_ERROR(comm->AllReduce(flat.data_ptr(),
                                           static_cast<size_t>(flat.numel() / 2),
                                           DataType::kInt64, ReduceOp::kSum, deadline));
    for (int s = 0; layout != nullptr && s < layout->world(); ++s) {
      const ElementRange piece = Overlap(layout->Range(g, s), round);
      if (source[s] != -1 && piece.size() > 0) {
        WriteValues(group.params, piece, in_round(piece));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace muster
