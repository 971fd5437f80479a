// When a session's other end counts as gone. Every heartbeat on a session
// is acknowledged, so a coordinator that has said nothing for three
// heartbeat periods and a second is hung, or cut off behind a connection
// that may look alive for minutes: the client drops the stream and
// reconnects (with common/backoff.h) to whoever holds the lease by then.
// The trainer's session and the agent's node session both follow it, and a
// handshake that gets no answer within it is given up the same way.
#ifndef MUSTER_COMMON_SESSION_LIVENESS_H_
#define MUSTER_COMMON_SESSION_LIVENESS_H_

#include "absl/time/time.h"

namespace muster {

inline absl::Duration SilenceLimit(absl::Duration heartbeat_interval) {
  return 3 * heartbeat_interval + absl::Seconds(1);
}

}  // namespace muster

#endif  // MUSTER_COMMON_SESSION_LIVENESS_H_
