// muster::InstallSignalHandlers: SIGUSR1 makes every rank checkpoint and stop
// at the next step boundary (exit 75, resume later); SIGTERM makes this rank
// leave at the next boundary, or, when every rank got it (a whole job being
// preempted), stop like SIGUSR1. Distributed::Start installs them when
// Options::handle_signals is set; a program calls this first thing so that
// a signal during start-up is acted on at the first step.
//
// A handler the program installed before is kept: muster's sets its flag,
// then calls it. Installed with SA_RESTART (the program's blocking reads are
// not cut short). Async-signal-safe (flags only); installs once; any thread.
// A program that owns its signals sets Options::handle_signals = false and
// calls Distributed::RequestStop / RequestLeave from its own handlers.
// No LibTorch in this header: programs with Abseil flags include it.
#ifndef MUSTER_SIGNALS_H_
#define MUSTER_SIGNALS_H_

namespace muster {

void InstallSignalHandlers();

}  // namespace muster

#endif  // MUSTER_SIGNALS_H_
