// OptimizerShards: moving ranges between worlds: each rank of a new world
// takes the ranges it will keep, round by round (Redistribute;
// optimizer_shards.h).
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

// `fields` (a master's state over `whole`, its range) cut to `piece`, a
// range inside it: WriteFields' input for the piece.
OptimizerCodec::Fields CutFields(const OptimizerCodec::Fields& fields, ElementRange whole,
                                 ElementRange piece) {
  OptimizerCodec::Fields out;
  for (const auto& [name, t] : fields) {
    out.emplace_back(name, t.dim() > 0 ? t.reshape({-1}).narrow(0, piece.begin - whole.begin,
                                                               piece.size())
                                       : t);
  }
  return out;
}

// The whole source's fields over `piece` of the group's elements (laid
// end to end), from `by_param`, each parameter's of `params`: each
// per-element field read piece by piece (a copy of the piece alone), the
// scalars the first parameter's.
OptimizerCodec::Fields WholePiece(const std::vector<torch::Tensor>& params,
                                  const std::vector<OptimizerCodec::Fields>& by_param,
                                  ElementRange piece) {
  OptimizerCodec::Fields out;
  for (const auto& named : by_param[0]) {
    const std::string& name = named.first;
    const torch::Tensor& first = named.second;
    if (!PerElement(first, params[0])) {
      out.emplace_back(name, first);
      continue;
    }
    std::vector<torch::Tensor> field;
    for (const OptimizerCodec::Fields& fields : by_param) {
      const auto it = std::find_if(fields.begin(), fields.end(),
                                   [&](const auto& f) { return f.first == name; });
      field.push_back(it != fields.end() ? it->second : torch::Tensor());
    }
    torch::Tensor to = torch::empty({piece.size()}, first.options());
    ReadValues(field, piece, to);
    out.emplace_back(name, to);
  }
  return out;
}

// MoveGroup's part on a sender: the old shards of `before` it sends of
// group `g` (`*sent`) and the state they are read from (`*fields`): each
// sent master's fields, or for the whole source (`before_rank`
// kHoldsWholeState) each parameter's. (A template: OptimizerShards::Group
// is private.)
template <typename Group>
absl::Status SentState(const Group& group, int g, const ShardLayout* before, int before_rank,
                       const std::vector<int>& source, std::vector<int>* sent,
                       std::vector<OptimizerCodec::Fields>* fields) {
  const auto& options = group.optimizer->param_groups()[group.index].options();
  if (before_rank == kHoldsWholeState) {
    // Read from the parameters' own state round by round (WholePiece).
    for (int s = 0; s < before->world(); ++s) {
      if (source[s] == kHoldsWholeState) sent->push_back(s);
    }
    for (size_t i = 0; i < group.params.size() && !sent->empty(); ++i) {
      torch::optim::OptimizerParamState* state =
          FindOptimizerState(*group.optimizer, group.params[i]);
      if (state == nullptr) {
        return absl::InternalError(
            absl::StrCat("optimizer group ", g, ": a parameter of the whole state has none"));
      }
      fields->push_back(group.codec->Save(*state, options));
    }
    return absl::OkStatus();
  }
  if (before == nullptr) return absl::OkStatus();  // a joiner sends nothing
  const std::vector<int> old_kept = before->KeptBy(before_rank);
  for (size_t k = 0; k < old_kept.size(); ++k) {
    if (source[old_kept[k]] != before_rank) continue;
    torch::optim::OptimizerParamState* state =
        FindOptimizerState(*group.optimizer, group.masters[k]);
    if (state == nullptr) {
      return absl::InternalError(
          absl::StrCat("optimizer group ", g, ": a master it sends has no state"));
    }
    sent->push_back(old_kept[k]);
    fields->push_back(group.codec->Save(*state, options));
  }
  return absl::OkStatus();
}

// A round `round` of new shard `range`, summed over the world (`buffer`),
// into the shard's fields `out`, made where `device` at the first round.
void KeepRound(const FlatState& buffer, ElementRange range, ElementRange round,
               torch::Device device, std::map<std::string, torch::Tensor>* out) {
  const torch::Tensor words = ScalarWords(buffer);
  int64_t f = 0, c = 0;
  for (const FieldSpec& spec : buffer.specs) {
    if (spec.per_element) {
      torch::Tensor& field = (*out)[spec.name];
      if (!field.defined()) {
        field = torch::empty({range.size()},
                             torch::TensorOptions().dtype(spec.dtype).device(device));
      }
      field.narrow(0, round.begin - range.begin, round.size())
          .copy_(buffer.flat.narrow(0, buffer.ElementOffset(f++), round.size()));
    } else {
      (*out)[spec.name] = ScalarAt(words, c++, spec.dtype);
    }
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<OptimizerShards>> OptimizerShards::Redistribute(
    OptimizerShards* held, const ShardLayout* whole,
    const std::vector<torch::optim::Optimizer*>& optimizers, const ShardWorld& agreed, int copies,
    Communicator* comm, absl::Time deadline, int64_t chunk) {
  return MoveTo(held, whole, optimizers, agreed, copies, comm->rank(), comm, deadline, chunk);
}

absl::StatusOr<std::unique_ptr<OptimizerShards>> OptimizerShards::HandOver(
    OptimizerShards* held, const std::vector<torch::optim::Optimizer*>& optimizers,
    const std::vector<bool>& leaving, int copies, Communicator* comm, absl::Time deadline,
    int64_t chunk) {
  const ShardLayout& layout = held->layout_;
  if (static_cast<int>(leaving.size()) != layout.world() || comm->size() != layout.world() ||
      comm->rank() != held->rank_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "hand the shards over: rank ", comm->rank(), " of ", comm->size(), " is not rank ",
        held->rank_, " of the layout's ", layout.world()));
  }
  // The layout of the ranks that stay, in their order; every holder of the
  // old one lives to send.
  ShardWorld agreed;
  agreed.alive.assign(leaving.size(), true);
  int rank = -1;
  for (int r = 0; r < layout.world(); ++r) {
    agreed.layout_rank.push_back(r);
    if (leaving[r]) continue;
    if (r == comm->rank()) rank = static_cast<int>(agreed.node_of_rank.size());
    agreed.node_of_rank.push_back(layout.node_of_rank()[r]);
  }
  return MoveTo(held, /*whole=*/nullptr, optimizers, agreed, copies, rank, comm, deadline, chunk);
}

absl::StatusOr<std::unique_ptr<OptimizerShards>> OptimizerShards::MoveTo(
    OptimizerShards* held, const ShardLayout* whole,
    const std::vector<torch::optim::Optimizer*>& optimizers, const ShardWorld& agreed, int copies,
    int rank, Communicator* comm, absl::Time deadline, int64_t chunk) {
  // This rank's view of the groups: a holder's own (its optimizers list
  // the masters), a joiner's or the whole source's from its optimizers.
  std::vector<Group> collected;
  std::vector<int64_t> elements;
  if (held == nullptr) {
    MUSTER_RETURN_IF_ERROR(Collect(optimizers, &collected, &elements));
    if (whole != nullptr) {
      MUSTER_RETURN_IF_ERROR(
          CheckAliveWords(agreed.alive, *whole, /*rank=*/-1, "redistribute from the whole state"));
    }
  } else {
    MUSTER_RETURN_IF_ERROR(held->CheckAlive(agreed.alive, "redistribute"));
    for (int g = 0; g < held->layout_.groups(); ++g) {
      elements.push_back(held->layout_.group_elements(g));
    }
  }
  const std::vector<Group>& groups = held != nullptr ? held->groups_ : collected;
  // The layout the state is held in on this rank (none for a joiner), and
  // this rank in it.
  const ShardLayout* before = held != nullptr ? &held->layout_ : whole;
  const int before_rank = held != nullptr ? held->rank_ : whole != nullptr ? kHoldsWholeState : -1;
  MUSTER_ASSIGN_OR_RETURN(ShardLayout after,
                          ShardLayout::Make(elements, agreed.node_of_rank, copies));
  const size_t G = groups.size();
  std::string lost;
  const std::vector<int> source =
      before != nullptr ? ShardSources(*before, agreed.alive, agreed.whole_source >= 0, &lost)
                        : std::vector<int>();
  torch::NoGradGuard no_grad;
  std::vector<int64_t> header;
  MUSTER_RETURN_IF_ERROR(AgreeOnHeader(groups, before, before_rank, lost, comm, deadline, &header));
  const bool stepped = header[2 * G + 1] > 0;
  // Every group's kept shards' fields, aside until every round is done.
  const size_t kept = rank >= 0 ? after.KeptBy(rank).size() : 0;
  std::vector<std::vector<KeptFields>> fields(G);
  for (size_t g = 0; g < G; ++g) {
    if (elements[g] == 0) continue;  // not sharded
    fields[g].resize(kept);
    if (header[g + 1] == 0) continue;  // no state yet: the masters get none
    MUSTER_RETURN_IF_ERROR(MoveGroup(groups, static_cast<int>(g), before, before_rank, source,
                                     after, rank, comm, deadline, chunk, &fields[g]));
  }
  for (size_t g = 0; g < G && stepped; ++g) {
    if (header[G + g + 1] == 0) continue;
    MUSTER_RETURN_IF_ERROR(AssembleValues(groups[g], static_cast<int>(g), before, before_rank,
                                          source, comm, deadline, chunk));
  }
  // Every rank has its fields only once every rank's rounds are done: a
  // rank that passes this word knows that no rank keeps the old shards
  // for lack of the new.
  int64_t done = 1;
  MUSTER_RETURN_IF_ERROR(
      AllReduceValues(comm, &done, 1, DataType::kInt64, ReduceOp::kSum, deadline));
  if (held != nullptr) {
    Restore(held->groups_);
    held->groups_.clear();
    elements.clear();
    if (rank < 0) return std::unique_ptr<OptimizerShards>();  // it keeps nothing
    MUSTER_RETURN_IF_ERROR(Collect(optimizers, &collected, &elements));
  }
  return Build(std::move(collected), std::move(after), rank, fields);
}

absl::Status OptimizerShards::MoveGroup(const std::vector<Group>& groups, int g,
                                        const ShardLayout* before, int before_rank,
                                        const std::vector<int>& source, const ShardLayout& after,
                                        int rank, Communicator* comm, absl::Time deadline,
                                        int64_t chunk, std::vector<KeptFields>* kept) {
  const Group& group = groups[g];
  const torch::Device device = group.params[0].device();
  // What this rank sends: the old shards it is the source of, and the
  // state they are read from.
  std::vector<int> sent;
  std::vector<OptimizerCodec::Fields> sent_fields;
  MUSTER_RETURN_IF_ERROR(SentState(group, g, before, before_rank, source, &sent, &sent_fields));
  const bool whole_source = before_rank == kHoldsWholeState;
  const std::vector<int> mine = rank >= 0 ? after.KeptBy(rank) : std::vector<int>();
  chunk = std::max<int64_t>(chunk, 1);
  // The fields, once: each round's buffer is made alike.
  MUSTER_ASSIGN_OR_RETURN(const FlatState fields, StartFlatState(group, g, *comm, 0));
  for (int s = 0; s < after.world(); ++s) {
    const ElementRange range = after.Range(g, s);
    const auto it = std::find(mine.begin(), mine.end(), s);
    KeptFields* out = it != mine.end() ? &(*kept)[static_cast<size_t>(it - mine.begin())] : nullptr;
    // At least one round, for the scalars of an empty range.
    for (int64_t begin = range.begin;;) {
      const int64_t n = std::min(chunk, range.end - begin);
      const ElementRange round{begin, begin + n};
      FlatState buffer = fields;
      buffer.padded = n + n % 2;
      buffer.flat = torch::zeros({buffer.ScalarOffset(buffer.scalars)}, fields.flat.options());
      for (size_t i = 0; i < sent.size(); ++i) {
        const ElementRange whole = before->Range(g, sent[i]);
        const ElementRange piece = Overlap(whole, round);
        // The group's scalars have one writer: the sender of old shard 0.
        const bool scalars = sent[i] == 0;
        const bool empty = piece.size() <= 0;
        if (empty && !scalars) continue;
        const ElementRange at = empty ? ElementRange{whole.begin, whole.begin} : piece;
        const ElementRange into = empty ? ElementRange{0, 0}
                                        : ElementRange{piece.begin - begin, piece.end - begin};
        MUSTER_RETURN_IF_ERROR(WriteFields(whole_source ? WholePiece(group.params, sent_fields, at)
                                                        : CutFields(sent_fields[i], whole, at),
                                           g, into, scalars, &buffer));
      }
      // Every rank sizes the round alike: none is empty on one rank alone.
      if (buffer.flat.numel() > 0) {
        MUSTER_RETURN_IF_ERROR(comm->AllReduce(buffer.flat.data_ptr(),
                                               static_cast<size_t>(buffer.flat.numel() / 2),
                                               DataType::kInt64, ReduceOp::kSum, deadline));
      }
      if (out != nullptr) KeepRound(buffer, range, round, device, out);
      begin += n;
      if (begin >= range.end) break;
    }
  }
  return absl::OkStatus();
}

}  // namespace muster
