#include "common/process_limits.h"

#include <sys/resource.h>

#include "common/logging.h"

namespace muster {

void RaiseOpenFileLimit() {
  if (rlimit nofile; ::getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    const rlim_t soft = nofile.rlim_cur;
    nofile.rlim_cur = nofile.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &nofile) == 0) {
      MUSTER_LOG(INFO) << "open files: soft limit raised from " << soft << " to "
                       << nofile.rlim_max;
    }
  }
}

}  // namespace muster
