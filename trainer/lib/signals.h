// The flags muster's SIGUSR1/SIGTERM handlers set (include/muster/signals.h
// installs them). Only the engine reads them.
#ifndef MUSTER_TRAINER_LIB_SIGNALS_H_
#define MUSTER_TRAINER_LIB_SIGNALS_H_

#include <atomic>

namespace muster {

// SIGUSR1 came (stop: checkpoint, exit 75).
const std::atomic<bool>& StopSignalled();
// SIGTERM came (leave; at every rank at once, a stop).
const std::atomic<bool>& LeaveSignalled();

}  // namespace muster

#endif  // MUSTER_TRAINER_LIB_SIGNALS_H_
