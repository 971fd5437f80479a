// muster::Blob: bytes of a program's own state that travel with its model
// (muster::State::blobs).
#ifndef MUSTER_BLOB_H_
#define MUSTER_BLOB_H_

#include <functional>
#include <string>

#include "absl/status/status.h"

namespace muster {

// Bytes of your own state (counters, RNG, a data loader's position). `save`
// is called at checkpoints and state transfers; `load` receives what a save
// on the source rank returned and reports a bad value as an error. Equal
// states must save equal bytes on every rank: the ranks' state digests
// include them (so no pointers, no torch::save of an optimizer, whose bytes
// hold addresses). A digest that differs names the entries that differ.
struct Blob {
  std::string name;
  std::function<std::string()> save;
  std::function<absl::Status(const std::string&)> load;
};

}  // namespace muster

#endif  // MUSTER_BLOB_H_
