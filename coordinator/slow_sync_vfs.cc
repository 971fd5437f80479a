#include "coordinator/slow_sync_vfs.h"

#include <sqlite3.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"

namespace muster {
namespace {

struct SlowSyncFile {
  sqlite3_file base;
  int64_t delay_us;
  sqlite3_file* real;  // follows this struct in the same allocation
};

sqlite3_file* Real(sqlite3_file* f) { return reinterpret_cast<SlowSyncFile*>(f)->real; }

int SlowSync(sqlite3_file* f, int flags) {
  const int64_t us = reinterpret_cast<SlowSyncFile*>(f)->delay_us;
  if (us > 0) std::this_thread::sleep_for(std::chrono::microseconds(us));
  return Real(f)->pMethods->xSync(Real(f), flags);
}

const sqlite3_io_methods* SlowSyncMethods(int version) {
  static sqlite3_io_methods m = [] {
    sqlite3_io_methods x{};
    x.xClose = [](sqlite3_file* f) { return Real(f)->pMethods->xClose(Real(f)); };
    x.xRead = [](sqlite3_file* f, void* b, int n, sqlite3_int64 o) {
      return Real(f)->pMethods->xRead(Real(f), b, n, o);
    };
    x.xWrite = [](sqlite3_file* f, const void* b, int n, sqlite3_int64 o) {
      return Real(f)->pMethods->xWrite(Real(f), b, n, o);
    };
    x.xTruncate = [](sqlite3_file* f, sqlite3_int64 n) {
      return Real(f)->pMethods->xTruncate(Real(f), n);
    };
    x.xSync = SlowSync;
    x.xFileSize = [](sqlite3_file* f, sqlite3_int64* n) {
      return Real(f)->pMethods->xFileSize(Real(f), n);
    };
    x.xLock = [](sqlite3_file* f, int l) { return Real(f)->pMethods->xLock(Real(f), l); };
    x.xUnlock = [](sqlite3_file* f, int l) { return Real(f)->pMethods->xUnlock(Real(f), l); };
    x.xCheckReservedLock = [](sqlite3_file* f, int* r) {
      return Real(f)->pMethods->xCheckReservedLock(Real(f), r);
    };
    x.xFileControl = [](sqlite3_file* f, int op, void* a) {
      return Real(f)->pMethods->xFileControl(Real(f), op, a);
    };
    x.xSectorSize = [](sqlite3_file* f) { return Real(f)->pMethods->xSectorSize(Real(f)); };
    x.xDeviceCharacteristics = [](sqlite3_file* f) {
      return Real(f)->pMethods->xDeviceCharacteristics(Real(f));
    };
    x.xShmMap = [](sqlite3_file* f, int p, int s, int e, void volatile** m) {
      return Real(f)->pMethods->xShmMap(Real(f), p, s, e, m);
    };
    x.xShmLock = [](sqlite3_file* f, int o, int n, int fl) {
      return Real(f)->pMethods->xShmLock(Real(f), o, n, fl);
    };
    x.xShmBarrier = [](sqlite3_file* f) { Real(f)->pMethods->xShmBarrier(Real(f)); };
    x.xShmUnmap = [](sqlite3_file* f, int d) { return Real(f)->pMethods->xShmUnmap(Real(f), d); };
    return x;
  }();
  m.iVersion = std::min(version, 2);  // no memory-mapped I/O through the shim
  return &m;
}

int SlowOpen(sqlite3_vfs* vfs, sqlite3_filename name, sqlite3_file* f, int flags,
             int* out_flags) {
  sqlite3_vfs* const real = sqlite3_vfs_find(nullptr);
  auto* file = reinterpret_cast<SlowSyncFile*>(f);
  file->delay_us = *static_cast<const int64_t*>(vfs->pAppData);
  file->real = reinterpret_cast<sqlite3_file*>(file + 1);
  const int rc = real->xOpen(real, name, file->real, flags, out_flags);
  file->base.pMethods = file->real->pMethods != nullptr
                            ? SlowSyncMethods(file->real->pMethods->iVersion)
                            : nullptr;
  return rc;
}

// One registered VFS: its name and delay live as long as the process.
struct Registered {
  std::string name;
  int64_t delay_us = 0;
  sqlite3_vfs vfs{};
};

}  // namespace

absl::StatusOr<const char*> SlowSyncVfs(absl::Duration delay) {
  static std::mutex mu;
  static auto* const registered = new std::map<int64_t, std::unique_ptr<Registered>>();
  const int64_t us = absl::ToInt64Microseconds(delay);
  std::lock_guard<std::mutex> lock(mu);
  std::unique_ptr<Registered>& r = (*registered)[us];
  if (r != nullptr) return r->name.c_str();
  auto fresh = std::make_unique<Registered>();
  sqlite3_vfs* const real = sqlite3_vfs_find(nullptr);
  fresh->name = absl::StrCat("muster-slow-sync-", us, "us");
  fresh->delay_us = us;
  fresh->vfs = *real;
  fresh->vfs.pNext = nullptr;
  fresh->vfs.zName = fresh->name.c_str();
  fresh->vfs.pAppData = &fresh->delay_us;
  fresh->vfs.szOsFile = static_cast<int>(sizeof(SlowSyncFile)) + real->szOsFile;
  fresh->vfs.xOpen = SlowOpen;
  if (sqlite3_vfs_register(&fresh->vfs, /*makeDflt=*/0) != SQLITE_OK) {
    registered->erase(us);
    return absl::InternalError("cannot register the slow-sync SQLite VFS");
  }
  r = std::move(fresh);
  return r->name.c_str();
}

}  // namespace muster
