// Process resource limits that muster's servers raise for themselves.
#ifndef MUSTER_COMMON_PROCESS_LIMITS_H_
#define MUSTER_COMMON_PROCESS_LIMITS_H_

namespace muster {

// Raises the soft limit on open files to the hard limit, logging when it
// did: a server holds a descriptor per connection, and the usual soft limit
// of 1024 is a few hundred trainers. Best effort.
void RaiseOpenFileLimit();

}  // namespace muster

#endif  // MUSTER_COMMON_PROCESS_LIMITS_H_
