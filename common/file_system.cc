#include "common/file_system.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ftw.h>

#include "absl/strings/str_cat.h"

namespace muster {

absl::Status ErrnoStatus(int err, const std::string& op, const std::string& path) {
  const std::string msg = absl::StrCat(op, " ", path, ": ", std::strerror(err));
  switch (err) {
    case ENOSPC:
    case EDQUOT: return absl::ResourceExhaustedError(msg);
    case EACCES:
    case EPERM:
    case EROFS: return absl::PermissionDeniedError(msg);
    case ENOENT: return absl::NotFoundError(msg);
    default: return absl::UnavailableError(msg);
  }
}

namespace {

class PosixFile : public WritableFile {
 public:
  PosixFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~PosixFile() override {
    if (fd_ >= 0) ::close(fd_);
  }
  absl::Status Append(const void* data, size_t n) override {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        return ErrnoStatus(errno, "write", path_);
      }
      p += w;
      n -= static_cast<size_t>(w);
    }
    return absl::OkStatus();
  }
  absl::Status Sync() override {
    if (::fdatasync(fd_) != 0) return ErrnoStatus(errno, "fsync", path_);
    return absl::OkStatus();
  }
  absl::Status Truncate(uint64_t size) override {
    if (::ftruncate(fd_, static_cast<off_t>(size)) != 0) return ErrnoStatus(errno, "truncate", path_);
    return absl::OkStatus();
  }
  absl::Status Close() override {
    const int fd = fd_;
    fd_ = -1;
    if (fd >= 0 && ::close(fd) != 0) return ErrnoStatus(errno, "close", path_);
    return absl::OkStatus();
  }

 private:
  int fd_;
  std::string path_;
};

class PosixFileSystem : public FileSystem {
 public:
  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return ErrnoStatus(errno, "open", path);
    return std::unique_ptr<WritableFile>(new PosixFile(fd, path));
  }
  absl::StatusOr<std::unique_ptr<WritableFile>> NewDirectFile(const std::string& path,
                                                              bool* direct) override {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0644);
    if (fd >= 0) {
      *direct = true;
      return std::unique_ptr<WritableFile>(new PosixFile(fd, path));
    }
    if (errno != EINVAL) return ErrnoStatus(errno, "open", path);
    *direct = false;  // e.g. tmpfs
    return NewWritableFile(path);
  }
  absl::Status Rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) return ErrnoStatus(errno, "rename", from);
    return absl::OkStatus();
  }
  absl::Status SyncDir(const std::string& dir) override {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus(errno, "open", dir);
    const int rc = ::fsync(fd);
    const int err = errno;
    ::close(fd);
    if (rc != 0) return ErrnoStatus(err, "fsync", dir);
    return absl::OkStatus();
  }
  absl::Status CreateDir(const std::string& dir) override {
    if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) return ErrnoStatus(errno, "mkdir", dir);
    return absl::OkStatus();
  }
  absl::Status Remove(const std::string& path) override {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) return ErrnoStatus(errno, "unlink", path);
    return absl::OkStatus();
  }
  absl::Status RemoveAll(const std::string& dir) override {
    auto rm = [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); };
    if (::nftw(dir.c_str(), rm, 16, FTW_DEPTH | FTW_PHYS) != 0 && errno != ENOENT) {
      return ErrnoStatus(errno, "remove", dir);
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> ReadFile(const std::string& path, uint64_t max_bytes) override {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus(errno, "open", path);
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      return ErrnoStatus(err, "stat", path);
    }
    if (static_cast<uint64_t>(st.st_size) > max_bytes) {
      ::close(fd);
      return absl::ResourceExhaustedError(
          absl::StrCat(path, " is ", st.st_size, " bytes; the limit is ", max_bytes));
    }
    std::string out(static_cast<size_t>(st.st_size), '\0');
    size_t got = 0;
    while (got < out.size()) {
      const ssize_t r = ::read(fd, out.data() + got, out.size() - got);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        const int err = r < 0 ? errno : EIO;
        ::close(fd);
        return ErrnoStatus(err, "read", path);
      }
      got += static_cast<size_t>(r);
    }
    ::close(fd);
    return out;
  }
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return ErrnoStatus(errno, "opendir", dir);
    std::vector<std::string> out;
    while (dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") out.push_back(name);
    }
    ::closedir(d);
    return out;
  }
  absl::StatusOr<FileStat> Stat(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return ErrnoStatus(errno, "stat", path);
    return FileStat{static_cast<uint64_t>(st.st_size),
                    absl::TimeFromTimespec(st.st_mtim)};
  }
};

}  // namespace

FileSystem* DefaultFileSystem() {
  static FileSystem* fs = new PosixFileSystem();
  return fs;
}

absl::Status WriteFileAtomically(FileSystem* fs, const std::string& path,
                                 std::string_view bytes) {
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  absl::StatusOr<std::unique_ptr<WritableFile>> file = fs->NewWritableFile(tmp);
  absl::Status s = file.status();
  if (s.ok()) s = (*file)->Append(bytes.data(), bytes.size());
  if (s.ok()) s = (*file)->Sync();
  if (s.ok()) s = (*file)->Close();
  if (s.ok()) s = fs->Rename(tmp, path);
  if (!s.ok()) {
    if (file.ok()) fs->Remove(tmp).IgnoreError();
    return s;
  }
  const size_t slash = path.rfind('/');
  return fs->SyncDir(slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash));
}

}  // namespace muster
