// This machine's host name (gethostname), or "localhost" when it has none.
#ifndef MUSTER_COMMON_HOST_NAME_H_
#define MUSTER_COMMON_HOST_NAME_H_

#include <string>

namespace muster {

std::string HostName();

}  // namespace muster

#endif  // MUSTER_COMMON_HOST_NAME_H_
