// A FileSystem for tests that fails writes to chosen paths, through the
// seam the checkpointer uses (the disk itself is never filled).
#ifndef MUSTER_TESTS_INTEGRATION_FAULTY_FILE_SYSTEM_H_
#define MUSTER_TESTS_INTEGRATION_FAULTY_FILE_SYSTEM_H_

#include <atomic>
#include <cerrno>
#include <memory>
#include <string>

#include "common/file_system.h"

namespace muster {

class FaultyFileSystem : public FileSystem {
 public:
  // Writes to paths containing `pattern` fail with `err` (e.g. ENOSPC) once
  // `after_bytes` bytes of that file were written.
  FaultyFileSystem(std::string pattern, int err, size_t after_bytes)
      : pattern_(std::move(pattern)), err_(err), after_(after_bytes) {}

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    auto f = DefaultFileSystem()->NewWritableFile(path);
    if (!f.ok() || path.find(pattern_) == std::string::npos) return f;
    return std::unique_ptr<WritableFile>(new Faulty(std::move(*f), path, err_, after_, &failures_));
  }
  absl::StatusOr<std::unique_ptr<WritableFile>> NewDirectFile(const std::string& path,
                                                              bool* direct) override {
    *direct = false;
    return NewWritableFile(path);
  }
  absl::Status Rename(const std::string& a, const std::string& b) override {
    return DefaultFileSystem()->Rename(a, b);
  }
  absl::Status SyncDir(const std::string& d) override { return DefaultFileSystem()->SyncDir(d); }
  absl::Status CreateDir(const std::string& d) override { return DefaultFileSystem()->CreateDir(d); }
  absl::Status Remove(const std::string& p) override { return DefaultFileSystem()->Remove(p); }
  absl::Status RemoveAll(const std::string& d) override { return DefaultFileSystem()->RemoveAll(d); }
  absl::StatusOr<std::string> ReadFile(const std::string& p, uint64_t max) override {
    return DefaultFileSystem()->ReadFile(p, max);
  }
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& d) override {
    return DefaultFileSystem()->ListDir(d);
  }
  absl::StatusOr<FileStat> Stat(const std::string& p) override {
    return DefaultFileSystem()->Stat(p);
  }
  int failures() const { return failures_.load(); }

 private:
  class Faulty : public WritableFile {
   public:
    Faulty(std::unique_ptr<WritableFile> f, std::string path, int err, size_t after,
           std::atomic<int>* failures)
        : f_(std::move(f)), path_(std::move(path)), err_(err), left_(after), failures_(failures) {}
    absl::Status Append(const void* data, size_t n) override {
      if (n > left_) {
        ++*failures_;
        return ErrnoStatus(err_, "write", path_);
      }
      left_ -= n;
      return f_->Append(data, n);
    }
    absl::Status Sync() override { return f_->Sync(); }
    absl::Status Truncate(uint64_t size) override { return f_->Truncate(size); }
    absl::Status Close() override { return f_->Close(); }

   private:
    std::unique_ptr<WritableFile> f_;
    std::string path_;
    int err_;
    size_t left_;
    std::atomic<int>* failures_;
  };

  std::string pattern_;
  int err_;
  size_t after_;
  std::atomic<int> failures_{0};
};

}  // namespace muster

#endif  // MUSTER_TESTS_INTEGRATION_FAULTY_FILE_SYSTEM_H_
