// FileSystem: the seam through which checkpoints reach the disk, so that
// tests can inject full disks, I/O errors and torn writes (LevelDB's Env).
//
// Errors map errno: ENOSPC/EDQUOT -> RESOURCE_EXHAUSTED, EACCES/EPERM/EROFS ->
// PERMISSION_DENIED, ENOENT -> NOT_FOUND, EIO and the rest -> UNAVAILABLE; the
// message names the path and the operation. Implementations are thread-safe;
// a WritableFile is used by one thread.
#ifndef MUSTER_COMMON_FILE_SYSTEM_H_
#define MUSTER_COMMON_FILE_SYSTEM_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace muster {

inline constexpr size_t kDirectAlignment = 4096;

class WritableFile {
 public:
  virtual ~WritableFile() = default;
  virtual absl::Status Append(const void* data, size_t n) = 0;
  // Flushes to stable storage (fsync).
  virtual absl::Status Sync() = 0;
  // Cuts the file to `size` bytes (after direct writes rounded up to blocks).
  virtual absl::Status Truncate(uint64_t size) = 0;
  virtual absl::Status Close() = 0;
};

// What Stat tells of a file.
struct FileStat {
  uint64_t bytes = 0;
  absl::Time modified;
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;
  // Creates or truncates `path`.
  virtual absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) = 0;
  // Like NewWritableFile, but bypassing the page cache (O_DIRECT) where the
  // file system allows it: then every Append must pass a buffer aligned to
  // kDirectAlignment and a multiple of it in size. Where O_DIRECT is not
  // available it returns an ordinary file (*direct = false).
  virtual absl::StatusOr<std::unique_ptr<WritableFile>> NewDirectFile(const std::string& path,
                                                                      bool* direct) = 0;
  // Atomically replaces `to` with `from`.
  virtual absl::Status Rename(const std::string& from, const std::string& to) = 0;
  // fsync of a directory, so that a rename in it is durable.
  virtual absl::Status SyncDir(const std::string& dir) = 0;
  virtual absl::Status CreateDir(const std::string& dir) = 0;
  virtual absl::Status Remove(const std::string& path) = 0;
  // Removes `dir` and everything under it (missing: OK).
  virtual absl::Status RemoveAll(const std::string& dir) = 0;
  // The whole file; RESOURCE_EXHAUSTED above `max_bytes`.
  virtual absl::StatusOr<std::string> ReadFile(const std::string& path, uint64_t max_bytes) = 0;
  virtual absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) = 0;
  virtual absl::StatusOr<FileStat> Stat(const std::string& path) = 0;
};

// The real POSIX file system. Never destroyed.
FileSystem* DefaultFileSystem();

// Writes `bytes` to `path` so that a reader, after a crash too, finds the
// old file or the whole new one: written beside it (`path`.tmp.<pid>, so
// that processes writing the same path do not share one), synced, renamed
// over `path`, and its directory synced. On error the temporary file is
// removed and `path` is unchanged.
absl::Status WriteFileAtomically(FileSystem* fs, const std::string& path,
                                 std::string_view bytes);

// absl::Status for errno `err` from `op` on `path`.
absl::Status ErrnoStatus(int err, const std::string& op, const std::string& path);

}  // namespace muster

#endif  // MUSTER_COMMON_FILE_SYSTEM_H_
