// muster checkpoints [--all] [--verify]: the checkpoint catalog; --verify
// re-reads every committed file and checks its size and checksum.
// muster checkpoints --consolidate DIR: a checkpoint of sharded optimizer
// state gets its optimizer.safetensors, from its files alone.
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "cli/command.h"
#include "cli/format.h"
#include "common/file_system.h"
#include "trainer/checkpoint/optimizer_shard_files.h"
#include "trainer/checkpoint/safetensors.h"

namespace muster::cli {
namespace {

// What is wrong with `file` on disk, or "".
std::string Problem(const v1::ShardFile& file) {
  absl::StatusOr<std::string> bytes = DefaultFileSystem()->ReadFile(file.path(), uint64_t{64} << 30);
  if (!bytes.ok()) return std::string(bytes.status().message());
  if (bytes->size() != file.bytes()) {
    return absl::StrCat("size ", bytes->size(), ", the catalog says ", file.bytes());
  }
  if (Xxh3Hex(bytes->data(), bytes->size()) != file.checksum()) return "checksum mismatch";
  return "";
}

// Prints a line per committed checkpoint; returns how many files are bad.
int Verify(const v1::ListCheckpointsResponse& list) {
  int bad = 0;
  for (const v1::Checkpoint& c : list.checkpoints()) {
    if (c.state() != v1::Checkpoint::COMMITTED) continue;
    const int bad_before = bad;
    for (const v1::ShardFile& f : c.files()) {
      if (const std::string problem = Problem(f); !problem.empty()) {
        ++bad;
        std::cout << "BAD  step " << c.step() << "  " << f.path() << ": " << problem << "\n";
      }
    }
    if (bad == bad_before) {
      std::cout << "ok   step " << c.step() << "  " << c.files_size() << " files\n";
    }
  }
  return bad;
}

}  // namespace

int Consolidate(const std::string& dir) {
  std::string d = dir;
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  absl::StatusOr<std::string> path = ConsolidateCheckpointDir(DefaultFileSystem(), d);
  if (!path.ok()) {
    std::cerr << "muster: checkpoints --consolidate " << dir << ": " << path.status() << "\n";
    return 1;
  }
  std::cout << "wrote " << *path << "\n";
  return 0;
}

int Checkpoints(const Invocation& in) {
  v1::ListCheckpointsRequest req;
  req.set_include_all(absl::GetFlag(FLAGS_all));
  v1::ListCheckpointsResponse resp;
  grpc::Status s = in.stub->ListCheckpoints(in.ctx, req, &resp);
  if (!s.ok()) return Fail("checkpoints", s);
  if (in.json) {
    Print(resp);
  } else {
    std::cout << FormatCheckpoints(resp);
  }
  if (!absl::GetFlag(FLAGS_verify)) return 0;
  return Verify(resp) == 0 ? 0 : 1;
}

}  // namespace muster::cli
