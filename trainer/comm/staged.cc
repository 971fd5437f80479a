#include "trainer/comm/staged.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>


namespace muster {

std::vector<StagedChunk> PlanStagedChunks(size_t bytes, size_t element_bytes,
                                          size_t chunk_bytes) {
  std::vector<StagedChunk> chunks;
  if (bytes == 0) return chunks;
  element_bytes = std::max<size_t>(element_bytes, 1);
  size_t step = bytes;
  if (chunk_bytes > 0 && chunk_bytes < bytes) {
    step = std::max(element_bytes, chunk_bytes / element_bytes * element_bytes);
  }
  chunks.reserve((bytes + step - 1) / step);
  for (size_t offset = 0; offset < bytes; offset += step) {
    chunks.push_back({offset, std::min(step, bytes - offset)});
  }
  return chunks;
}

absl::Status RunStagedChunks(const std::vector<StagedChunk>& chunks, void* host,
                             StagingCopies& copies,
                             const std::function<absl::Status(void*, const StagedChunk&)>& op) {
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (absl::Status s = copies.QueueToHost(i, chunks[i]); !s.ok()) return s;
  }
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (absl::Status s = copies.WaitToHost(i); !s.ok()) return s;
    if (absl::Status s = op(static_cast<char*>(host) + chunks[i].offset, chunks[i]); !s.ok()) {
      return s;
    }
    if (absl::Status s = copies.QueueToBuffer(i, chunks[i]); !s.ok()) return s;
  }
  return copies.Finish();
}

namespace {

class PipelinedStaged : public Communicator {
 public:
  PipelinedStaged(std::unique_ptr<Communicator> host, std::unique_ptr<StagingCopies> copies,
                  MemorySpace memory, size_t chunk_bytes)
      : host_(std::move(host)),
        copies_(std::move(copies)),
        memory_(memory),
        chunk_bytes_(chunk_bytes) {}

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  std::string name() const override { return host_->name(); }
  MemorySpace memory() const override { return memory_; }

  absl::Status AllReduce(void* data, size_t count, DataType type, ReduceOp op,
                         absl::Time deadline) override {
    const size_t element = DataTypeSize(type);
    return Staged(data, count * element, chunk_bytes_, element,
                  [&](void* host, const StagedChunk& c) {
                    return host_->AllReduce(host, c.bytes / element, type, op, deadline);
                  });
  }

  absl::Status ReduceScatter(void* data, const std::vector<size_t>& counts, DataType type,
                             ReduceOp op, absl::Time deadline) override {
    if (absl::Status s = CheckCounts(counts, size()); !s.ok()) return s;
    const size_t element = DataTypeSize(type);
    return Staged(data, TotalCount(counts) * element, /*chunk_bytes=*/0, element,
                  [&](void* host, const StagedChunk&) {
                    return host_->ReduceScatter(host, counts, type, op, deadline);
                  });
  }

  absl::Status AllGather(void* data, const std::vector<size_t>& counts, DataType type,
                         absl::Time deadline) override {
    if (absl::Status s = CheckCounts(counts, size()); !s.ok()) return s;
    const size_t element = DataTypeSize(type);
    return Staged(data, TotalCount(counts) * element, /*chunk_bytes=*/0, element,
                  [&](void* host, const StagedChunk&) {
                    return host_->AllGather(host, counts, type, deadline);
                  });
  }

  absl::Status Broadcast(void* data, size_t count, DataType type, int root,
                         absl::Time deadline) override {
    const size_t element = DataTypeSize(type);
    return Staged(data, count * element, chunk_bytes_, element,
                  [&](void* host, const StagedChunk& c) {
                    return host_->Broadcast(host, c.bytes / element, type, root, deadline);
                  });
  }

  absl::Status Barrier(absl::Time deadline) override { return host_->Barrier(deadline); }
  std::vector<int> Unreachable() override { return host_->Unreachable(); }
  void Abort(const absl::Status& why) override { host_->Abort(why); }

 private:
  // A failed copy breaks the host communicator too: the peers must not
  // wait for this rank's part of the next collective.
  absl::Status Staged(void* data, size_t bytes, size_t chunk_bytes, size_t element,
                      const std::function<absl::Status(void*, const StagedChunk&)>& op) {
    const std::vector<StagedChunk> chunks = PlanStagedChunks(bytes, element, chunk_bytes);
    if (chunks.empty()) return absl::OkStatus();
    absl::StatusOr<void*> host = copies_->Begin(data, bytes, chunks.size());
    if (!host.ok()) {
      host_->Abort(host.status());
      return host.status();
    }
    bool op_failed = false;
    absl::Status s = RunStagedChunks(chunks, *host, *copies_,
                                     [&](void* h, const StagedChunk& c) {
                                       absl::Status r = op(h, c);
                                       op_failed = !r.ok();
                                       return r;
                                     });
    if (!s.ok() && !op_failed) host_->Abort(s);
    return s;
  }

  std::unique_ptr<Communicator> host_;
  std::unique_ptr<StagingCopies> copies_;
  const MemorySpace memory_;
  const size_t chunk_bytes_;
};

class HostStagingCopies : public StagingCopies {
 public:
  absl::StatusOr<void*> Begin(void* data, size_t bytes, size_t) override {
    data_ = static_cast<char*>(data);
    if (host_.size() < bytes) host_.resize(bytes);
    return host_.data();
  }
  absl::Status QueueToHost(size_t, const StagedChunk& c) override {
    std::memcpy(host_.data() + c.offset, data_ + c.offset, c.bytes);
    return absl::OkStatus();
  }
  absl::Status WaitToHost(size_t) override { return absl::OkStatus(); }
  absl::Status QueueToBuffer(size_t, const StagedChunk& c) override {
    std::memcpy(data_ + c.offset, host_.data() + c.offset, c.bytes);
    return absl::OkStatus();
  }
  absl::Status Finish() override { return absl::OkStatus(); }

 private:
  char* data_ = nullptr;
  std::vector<char> host_;
};

}  // namespace

std::unique_ptr<Communicator> NewPipelinedStagedCommunicator(std::unique_ptr<Communicator> host,
                                                             std::unique_ptr<StagingCopies> copies,
                                                             MemorySpace memory,
                                                             size_t chunk_bytes) {
  return std::make_unique<PipelinedStaged>(std::move(host), std::move(copies), memory,
                                           chunk_bytes);
}

std::unique_ptr<StagingCopies> NewHostStagingCopies() {
  return std::make_unique<HostStagingCopies>();
}

}  // namespace muster
