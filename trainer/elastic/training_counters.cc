#include "trainer/elastic/training_counters.h"

#include "absl/strings/str_cat.h"

namespace muster {
namespace {

// The fixed words before the returned examples.
constexpr size_t kFixedWords = 5;

}  // namespace

std::vector<int64_t> TrainingCounters::ToWords() const {
  std::vector<int64_t> words = {step, position.offset, lr_world_size, position.returned_epoch,
                                pass};
  words.insert(words.end(), position.returned.begin(), position.returned.end());
  return words;
}

absl::StatusOr<TrainingCounters> TrainingCounters::FromWords(const std::vector<int64_t>& words) {
  if (words.size() < kFixedWords) {
    return absl::DataLossError(absl::StrCat("training counters of ", words.size(),
                                            " words (at least ", kFixedWords, " expected)"));
  }
  TrainingCounters c;
  c.step = words[0];
  c.position.offset = words[1];
  c.lr_world_size = static_cast<int>(words[2]);
  c.position.returned_epoch = words[3];
  c.pass = static_cast<int>(words[4]);
  c.position.returned.assign(words.begin() + kFixedWords, words.end());
  return c;
}

}  // namespace muster
