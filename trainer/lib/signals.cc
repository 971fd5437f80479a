// SIGUSR1 and SIGTERM handlers that set a flag and then call the handler
// the program had installed before (a function; not SIG_DFL or SIG_IGN),
// with SA_RESTART so that the program's blocking calls are not cut short.
#include "trainer/lib/signals.h"

#include <signal.h>

#include <mutex>

#include "common/logging.h"
#include "muster/signals.h"

namespace muster {
namespace {

std::atomic<bool> g_stop{false};
std::atomic<bool> g_leave{false};
// The program's handlers, saved once before ours replace them; read by our
// handlers only after that.
struct sigaction g_program_usr1 = {};
struct sigaction g_program_term = {};

bool IsFunction(const struct sigaction& sa) {
  if ((sa.sa_flags & SA_SIGINFO) != 0) return sa.sa_sigaction != nullptr;
  return sa.sa_handler != SIG_DFL && sa.sa_handler != SIG_IGN && sa.sa_handler != nullptr;
}

void CallProgram(const struct sigaction& sa, int signo, siginfo_t* info, void* context) {
  if (!IsFunction(sa)) return;
  if ((sa.sa_flags & SA_SIGINFO) != 0) {
    sa.sa_sigaction(signo, info, context);
  } else {
    sa.sa_handler(signo);
  }
}

void OnStop(int signo, siginfo_t* info, void* context) {
  g_stop = true;
  CallProgram(g_program_usr1, signo, info, context);
}

void OnLeave(int signo, siginfo_t* info, void* context) {
  g_leave = true;
  CallProgram(g_program_term, signo, info, context);
}

void Install(int signo, void (*handler)(int, siginfo_t*, void*), struct sigaction* program) {
  struct sigaction sa = {};
  sigemptyset(&sa.sa_mask);
  sa.sa_sigaction = handler;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  ::sigaction(signo, nullptr, program);
  ::sigaction(signo, &sa, nullptr);
  if (IsFunction(*program)) {
    MUSTER_LOG(INFO) << "muster handles " << (signo == SIGUSR1 ? "SIGUSR1" : "SIGTERM")
                     << " and then calls the program's own handler";
  }
}

}  // namespace

const std::atomic<bool>& StopSignalled() { return g_stop; }
const std::atomic<bool>& LeaveSignalled() { return g_leave; }

void InstallSignalHandlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    Install(SIGUSR1, OnStop, &g_program_usr1);
    Install(SIGTERM, OnLeave, &g_program_term);
  });
}

}  // namespace muster
