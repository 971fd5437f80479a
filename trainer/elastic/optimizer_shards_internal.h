// What the files of OptimizerShards share (the class is split by concept:
// optimizer_shards.cc builds it; _gradients, _gather, _agreement, _whole,
// _flat_state and _moves hold the rest): the flat state of a group and
// small helpers over flat vectors. Not for other files.
#ifndef MUSTER_TRAINER_ELASTIC_OPTIMIZER_SHARDS_INTERNAL_H_
#define MUSTER_TRAINER_ELASTIC_OPTIMIZER_SHARDS_INTERNAL_H_

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "trainer/checkpoint/optimizer_codecs.h"
#include "trainer/ddp/shard_layout.h"

namespace muster {

// One field of a group's optimizer state, as the codec's Initial names it.
struct FieldSpec {
  std::string name;
  bool per_element;  // the parameter's shape and dtype; else a 0-dim scalar
  torch::Dtype dtype;
};

// One group's state, flat: for each per-element field the group's
// elements (padded to whole int64 words), then two float32 words for each
// scalar field.
struct FlatState {
  std::vector<FieldSpec> specs;
  int64_t per_element = 0, scalars = 0, padded = 0;
  torch::Tensor flat;

  int64_t ElementOffset(int64_t field) const { return field * padded; }
  int64_t ScalarOffset(int64_t scalar) const { return per_element * padded + 2 * scalar; }
};

// Whether the optimizer state field `t` of `param` is per element (the
// parameter's shape and dtype), not a scalar such as a step count.
bool PerElement(const torch::Tensor& t, const torch::Tensor& param);
// `parts` concatenated (float32 zeros of none).
torch::Tensor Flat(const std::vector<torch::Tensor>& parts);
// `params`' values, flat, in order.
torch::Tensor FlatValues(const std::vector<torch::Tensor>& params);
// Whether two float32 tensors of one shape hold the same bits (-0 is not
// +0, as the state digests see it).
bool SameBits(const torch::Tensor& a, const torch::Tensor& b);
// The elements [begin, end) of `range` ∩ `other`, empty when they do not meet.
ElementRange Overlap(ElementRange range, ElementRange other);
// Whether a master this rank keeps holds values its parameters do not.
bool MastersDifferFromParameters(const std::vector<torch::Tensor>& params,
                                 const std::vector<torch::Tensor>& masters, int g,
                                 const ShardLayout& layout, int rank);
// Whether `t` is `flat`'s elements from `offset` on, in `t`'s shape.
bool IsAliasAt(const torch::Tensor& t, const torch::Tensor& flat, int64_t offset);
// Whether `params` are `flat`'s elements, one after the other from its start.
bool LaidOutIn(const std::vector<torch::Tensor>& params, const torch::Tensor& flat);

// A scalar field's value as 8 bytes (int64 counters as they are, anything
// else as a double), and back.
int64_t ScalarBits(const torch::Tensor& t);
torch::Tensor ScalarFrom(int64_t bits, torch::Dtype dtype);
// The scalar words of flat state `state` (its 64-bit words, each held as
// two float32 elements), on the CPU, for ScalarAt.
torch::Tensor ScalarWords(const FlatState& state);
// Scalar field `c` of `words` (ScalarWords) as a 0-dim tensor of `dtype`.
torch::Tensor ScalarAt(const torch::Tensor& words, int64_t c, torch::Dtype dtype);
// `fields` (per-element ones of `range`'s elements, flat) into `state` at
// `range`; the scalars too where `scalars` (the sender of shard 0).
absl::Status WriteFields(const OptimizerCodec::Fields& fields, int g, ElementRange range,
                         bool scalars, FlatState* state);

// The elements `range` of `params` laid end to end (or of tensors shaped
// as they are: an optimizer state field of each), into `to` (1-D, of
// `range`'s size).
void ReadValues(const std::vector<torch::Tensor>& params, ElementRange range, torch::Tensor to);

// INVALID_ARGUMENT naming `what` unless `alive` has a word for each rank
// of `layout` and, where `rank` is one of them (not -1), says it lives.
absl::Status CheckAliveWords(const std::vector<bool>& alive, const ShardLayout& layout, int rank,
                             const char* what);

// Whether some shard comes from the whole source (ShardSources).
bool AnyFromWhole(const std::vector<int>& source);
// The rank of `layout` that sends each shard: the first of its holders
// that `alive` says lives on; else kHoldsWholeState where a rank holds the
// whole state (`whole`), or -1. `*lost` names the first range with
// elements that nobody sends ("" when there is none).
std::vector<int> ShardSources(const ShardLayout& layout, const std::vector<bool>& alive,
                              bool whole, std::string* lost);

}  // namespace muster

#endif  // MUSTER_TRAINER_ELASTIC_OPTIMIZER_SHARDS_INTERNAL_H_
