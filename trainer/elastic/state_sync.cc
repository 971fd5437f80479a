#include "trainer/elastic/state_sync.h"

#include <torch/torch.h>
#include <xxhash.h>

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "trainer/comm/values.h"
#include "trainer/ddp/device_comm.h"

namespace muster {
namespace {

std::vector<torch::Tensor> Tensors(const NamedTensors& named) {
  std::vector<torch::Tensor> out;
  for (const auto& [name, t] : named) out.push_back(t);
  return out;
}

bool IsBuffer(const std::string& name) { return name.rfind("buffer.", 0) == 0; }

// The model (without its buffers: `buffers` false), `optimizer` (the
// state's optimizer tensors) and extra tensors, in one order on every rank.
std::vector<torch::Tensor> StateTensors(const TrainingState& state,
                                        const NamedTensors& optimizer, bool buffers = true) {
  std::vector<torch::Tensor> out;
  for (const auto& [name, t] : state.Model()) {
    if (buffers || !IsBuffer(name)) out.push_back(t);
  }
  for (const torch::Tensor& t : Tensors(optimizer)) out.push_back(t);
  for (const auto& [name, t] : state.tensors) out.push_back(t);
  return out;
}

}  // namespace

uint64_t StateDigest(const TrainingState& state, const std::vector<int64_t>& counters,
                     bool buffers) {
  torch::NoGradGuard no_grad;
  XXH3_state_t* h = XXH3_createState();
  XXH3_64bits_reset(h);
  XXH3_64bits_update(h, counters.data(), counters.size() * sizeof(int64_t));
  for (const torch::Tensor& t : StateTensors(state, state.OptimizerState(), buffers)) {
    torch::Tensor c = t.detach().contiguous().cpu();
    XXH3_64bits_update(h, c.data_ptr(), static_cast<size_t>(c.numel()) * c.element_size());
  }
  for (const Blob& b : state.blobs) {
    const std::string bytes = b.save();
    XXH3_64bits_update(h, bytes.data(), bytes.size());
  }
  const uint64_t digest = XXH3_64bits_digest(h);
  XXH3_freeState(h);
  return digest;
}

namespace {

// Whether every rank holds the same 64-bit value in each of `values`:
// pieces x of 8 bits and their squares, summed exactly in float64; all
// ranks agree on a piece iff n * sum(x^2) == sum(x)^2 (Cauchy-Schwarz),
// and every rank computes the same verdict. Every rank passes as many
// values.
absl::StatusOr<std::vector<bool>> SameOnEveryRank(const std::vector<uint64_t>& values,
                                                  Communicator* comm, absl::Time deadline) {
  const size_t n = values.size();
  std::vector<double> sums(16 * n + 1, 0);
  for (size_t v = 0; v < n; ++v) {
    for (size_t i = 0; i < 8; ++i) {
      const double x = static_cast<double>((values[v] >> (8 * i)) & 0xff);
      sums[16 * v + i] = x;
      sums[16 * v + 8 + i] = x * x;
    }
  }
  sums[16 * n] = 1;
  MUSTER_RETURN_IF_ERROR(AllReduceValues(comm, sums.data(), sums.size(), DataType::kFloat64,
                                         ReduceOp::kSum, deadline));
  std::vector<bool> same(n, true);
  for (size_t v = 0; v < n; ++v) {
    for (size_t i = 0; i < 8; ++i) {
      const double s = sums[16 * v + i];
      if (sums[16 * n] * sums[16 * v + 8 + i] != s * s) same[v] = false;
    }
  }
  return same;
}

uint64_t TensorHash(const torch::Tensor& t) {
  torch::Tensor c = t.detach().contiguous().cpu();
  return XXH3_64bits(c.data_ptr(), static_cast<size_t>(c.numel()) * c.element_size());
}

// Each registered entry (the counters, every model and optimizer tensor,
// extra tensor and blob) with its hash, in one order on every rank.
std::vector<std::pair<std::string, uint64_t>> EntryHashes(const TrainingState& state,
                                                          const std::vector<int64_t>& counters,
                                                          bool buffers) {
  torch::NoGradGuard no_grad;
  std::vector<std::pair<std::string, uint64_t>> out;
  out.emplace_back("the step and sample counters",
                   XXH3_64bits(counters.data(), counters.size() * sizeof(int64_t)));
  for (const auto& [name, t] : state.Model()) {
    if (buffers || !IsBuffer(name)) out.emplace_back("model " + name, TensorHash(t));
  }
  for (const auto& [name, t] : state.OptimizerState()) {
    out.emplace_back("optimizer " + name, TensorHash(t));
  }
  for (const auto& [name, t] : state.tensors) out.emplace_back("tensor " + name, TensorHash(t));
  for (const Blob& b : state.blobs) {
    const std::string bytes = b.save();
    out.emplace_back("blob " + b.name, XXH3_64bits(bytes.data(), bytes.size()));
  }
  return out;
}

}  // namespace

absl::Status CheckSameDigest(uint64_t digest, Communicator* comm, absl::Time deadline) {
  MUSTER_ASSIGN_OR_RETURN(std::vector<bool> same, SameOnEveryRank({digest}, comm, deadline));
  if (same[0]) return absl::OkStatus();
  return absl::DataLossError("the ranks' training state differs after the state transfer");
}

namespace {

// Collective: DATA_LOSS naming the first kind of entry (EntryHashes's
// names) of which the ranks hold different numbers, and why that happens.
absl::Status CheckSameCounts(const std::vector<std::pair<std::string, uint64_t>>& entries,
                             Communicator* comm, absl::Time deadline) {
  struct Kind {
    const char* prefix;
    const char* why;
  };
  static constexpr Kind kKinds[] = {
      {"model ", "a model built differently on some ranks"},
      {"optimizer ", "an optimizer over other parameters or groups on some ranks"},
      {"tensor ", "State::tensors registered on some ranks only"},
      {"blob ", "State::blobs registered on some ranks only"},
  };
  std::vector<uint64_t> counts;
  for (const Kind& k : kKinds) {
    counts.push_back(std::count_if(entries.begin(), entries.end(), [&](const auto& e) {
      return absl::StartsWith(e.first, k.prefix);
    }));
  }
  MUSTER_ASSIGN_OR_RETURN(std::vector<bool> same, SameOnEveryRank(counts, comm, deadline));
  for (size_t i = 0; i < counts.size(); ++i) {
    if (same[i]) continue;
    return absl::DataLossError(
        absl::StrCat("the ranks' training state differs: this rank holds ", counts[i], " ",
                     absl::StripSuffix(kKinds[i].prefix, " "),
                     " entries, another rank a different number (", kKinds[i].why, ")"));
  }
  return absl::OkStatus();
}

// Collective, after the digests were found to differ: the entries whose
// hashes differ between ranks, in registration order. Errors: the
// communicator's; DATA_LOSS when the ranks hold different numbers of
// entries of a kind (CheckSameCounts).
absl::StatusOr<std::vector<std::string>> DifferingEntries(const TrainingState& state,
                                                          const std::vector<int64_t>& counters,
                                                          Communicator* comm,
                                                          absl::Time deadline,
                                                          bool buffers = true) {
  const auto entries = EntryHashes(state, counters, buffers);
  MUSTER_RETURN_IF_ERROR(CheckSameCounts(entries, comm, deadline));
  std::vector<uint64_t> hashes;
  for (const auto& e : entries) hashes.push_back(e.second);
  MUSTER_ASSIGN_OR_RETURN(std::vector<bool> same, SameOnEveryRank(hashes, comm, deadline));
  std::vector<std::string> differ;
  for (size_t i = 0; i < entries.size(); ++i) {
    if (!same[i]) differ.push_back(entries[i].first);
  }
  return differ;
}

constexpr char kEqualBlobs[] =
    "a blob's bytes must be equal for equal states: no addresses, no torch::save of an "
    "optimizer";
constexpr char kRatesDiffer[] =
    "the learning rates differ: a rate the program sets must be set alike on every rank, from "
    "Distributed::step(); LibTorch's LR schedulers count their own step() calls, which a "
    "replacement or a resumed run does not share: set Options::lr_schedule instead";

// What to tell of the entries `differ`: the learning rates first where they
// differ (the parameters then differ for that reason), and why blobs differ.
std::string DifferenceHint(std::vector<std::string>* differ) {
  const auto rates =
      std::find(differ->begin(), differ->end(), absl::StrCat("blob ", kLearningRatesBlob));
  if (rates != differ->end()) {
    std::rotate(differ->begin(), rates, rates + 1);
    return absl::StrCat(" (", kRatesDiffer, ")");
  }
  const bool blob = std::any_of(differ->begin(), differ->end(),
                                [](const std::string& e) { return e.rfind("blob ", 0) == 0; });
  return blob ? absl::StrCat(" (", kEqualBlobs, ")") : std::string();
}

}  // namespace

absl::Status CheckSameState(const TrainingState& state, const std::vector<int64_t>& counters,
                            Communicator* comm, absl::Time deadline, bool buffers) {
  absl::Status s = CheckSameDigest(StateDigest(state, counters, buffers), comm, deadline);
  if (!absl::IsDataLoss(s)) return s;
  MUSTER_ASSIGN_OR_RETURN(std::vector<std::string> differ,
                          DifferingEntries(state, counters, comm, deadline, buffers));
  return absl::DataLossError(absl::StrCat(
      "the ranks' training state differs after the state transfer, in ",
      differ.empty() ? std::string("no single entry") : absl::StrJoin(differ, ", "), " (",
      kEqualBlobs, ")"));
}

absl::Status CheckRanksAgree(const TrainingState& state, const std::vector<int64_t>& counters,
                             Communicator* comm, absl::Time deadline) {
  // Every rank's digest in its own slot: a sum of one value and zeros is
  // exact, so every rank ends with all of them.
  std::vector<int64_t> digests(static_cast<size_t>(comm->size()), 0);
  digests[static_cast<size_t>(comm->rank())] =
      static_cast<int64_t>(StateDigest(state, counters));
  MUSTER_RETURN_IF_ERROR(AllReduceValues(comm, digests.data(), digests.size(), DataType::kInt64,
                                         ReduceOp::kSum, deadline));
  // The state most ranks hold (rank 0's on a tie) is the reference.
  std::map<int64_t, int> holders;
  for (int64_t d : digests) ++holders[d];
  int64_t reference = digests[0];
  for (int64_t d : digests) {
    if (holders[d] > holders[reference]) reference = d;
  }
  std::vector<int> same, other;
  for (size_t r = 0; r < digests.size(); ++r) {
    (digests[r] == reference ? same : other).push_back(static_cast<int>(r));
  }
  if (other.empty()) return absl::OkStatus();
  MUSTER_ASSIGN_OR_RETURN(std::vector<std::string> differ,
                          DifferingEntries(state, counters, comm, deadline));
  const std::string hint = DifferenceHint(&differ);
  const auto ranks = [](const std::vector<int>& r) {
    return absl::StrCat(r.size() == 1 ? "rank " : "ranks ", absl::StrJoin(r, ", "));
  };
  return absl::DataLossError(absl::StrCat(
      "the ranks disagree: ", ranks(other), " of ", digests.size(),
      other.size() == 1 ? " holds" : " hold", " another state than ", ranks(same),
      differ.empty() ? std::string("; no single entry differs")
                     : absl::StrCat("; first difference: ", differ.front(), " (", differ.size(),
                                    differ.size() == 1 ? " entry differs)" : " entries differ)"),
      hint));
}

absl::Status SyncStateFrom(int source, Communicator* comm, const TrainingState& state,
                           TrainingCounters* counters, absl::Time deadline, bool in_step,
                           bool* buffers_held) {
  // The source's counter count first (the counters may differ in length:
  // they end with the sampler's returned examples), then the counters with
  // the source's blob sizes.
  std::vector<int64_t> words = counters->ToWords();
  int64_t count = static_cast<int64_t>(words.size());
  MUSTER_RETURN_IF_ERROR(BroadcastValues(comm, &count, 1, DataType::kInt64, source, deadline));
  if (count < 0 || count > (int64_t{1} << 30)) {
    return absl::DataLossError(absl::StrCat("state source sent ", count, " counters"));
  }
  words.resize(static_cast<size_t>(count), 0);
  std::vector<std::string> blobs;
  for (const Blob& b : state.blobs) blobs.push_back(b.save());
  std::vector<int64_t> head = words;
  for (const std::string& b : blobs) head.push_back(static_cast<int64_t>(b.size()));
  head.push_back(in_step ? 1 : 0);  // the source's: whether the buffers stay out
  MUSTER_RETURN_IF_ERROR(BroadcastValues(comm, head.data(), head.size(), DataType::kInt64,
                                         source, deadline));
  std::copy(head.begin(), head.begin() + words.size(), words.begin());
  const bool buffers = head.back() == 0;
  MUSTER_ASSIGN_OR_RETURN(TrainingCounters received_counters, TrainingCounters::FromWords(words));
  // Every rank must hold the same set of optimizer tensors before the
  // broadcast (a newcomer has none yet): TrainingState::Optimizer sees to it.
  const NamedTensors optimizer_tensors = state.OptimizerState();  // step tensors: read back below
  std::vector<torch::Tensor> tensors = StateTensors(state, optimizer_tensors, buffers);
  std::map<std::string, std::string> received;
  for (size_t i = 0; i < state.blobs.size(); ++i) {
    const size_t size = static_cast<size_t>(head[words.size() + i]);
    blobs[i].resize(size);  // the source's size; its bytes arrive below
    tensors.push_back(BytesTensor(blobs[i]));
  }
  // A rank that holds the source's state keeps its tensors untouched: a
  // graph its program built before this transfer (between the passes of a
  // step) stays usable.
  MUSTER_RETURN_IF_ERROR(BroadcastTensors(tensors, comm, source, deadline, /*keep_equal=*/true));
  for (size_t i = 0; i < state.blobs.size(); ++i) {
    received[state.blobs[i].name] = TensorBytes(tensors[tensors.size() - state.blobs.size() + i]);
  }
  MUSTER_RETURN_IF_ERROR(state.LoadOptimizer(optimizer_tensors));
  MUSTER_RETURN_IF_ERROR(state.LoadBlobs(received));
  MUSTER_RETURN_IF_ERROR(CheckSameState(state, words, comm, deadline, buffers));
  *counters = std::move(received_counters);
  if (buffers_held != nullptr) *buffers_held = !buffers;
  return absl::OkStatus();
}

}  // namespace muster
