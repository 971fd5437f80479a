// muster::InstallSignalHandlers: SIGUSR1 makes every rank checkpoint and stop
// at the next step boundary (exit 75, resume later); SIGTERM makes this rank
// leave at the next boundary, or, when every rank got it (a whole job being
// preempted), stop like SIGUSR1. Distributed::Start installs them when
// Options::handle_signals is set; a program calls this first thing so that
// a signal during start-up is acted on at the first step. Async-signal-safe
// handlers (they set flags); idempotent; call from any thread.
// No LibTorch in this header: programs with Abseil flags include it.
#ifndef MUSTER_SIGNALS_H_
#define MUSTER_SIGNALS_H_

namespace muster {

void InstallSignalHandlers();

}  // namespace muster

#endif  // MUSTER_SIGNALS_H_
