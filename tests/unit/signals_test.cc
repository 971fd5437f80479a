// muster's SIGUSR1/SIGTERM handlers keep the program's own: a handler the
// program installed before is still called, after muster's flag is set.
#include "trainer/lib/signals.h"

#include <signal.h>

#include <atomic>

#include <gtest/gtest.h>

#include "muster/signals.h"

namespace muster {
namespace {

std::atomic<int> g_program_usr1{0};
std::atomic<int> g_program_term{0};
std::atomic<bool> g_flag_was_set{false};

void ProgramUsr1(int) {
  g_flag_was_set = StopSignalled().load();
  ++g_program_usr1;
}
void ProgramTerm(int, siginfo_t* info, void*) {
  if (info != nullptr && info->si_signo == SIGTERM) ++g_program_term;
}

// One test: the handlers are installed once per process.
TEST(SignalsTest, TheProgramsHandlersAreKeptAndCalledAfterMuster) {
  struct sigaction usr1 = {};
  sigemptyset(&usr1.sa_mask);
  usr1.sa_handler = ProgramUsr1;
  ASSERT_EQ(::sigaction(SIGUSR1, &usr1, nullptr), 0);
  struct sigaction term = {};
  sigemptyset(&term.sa_mask);
  term.sa_sigaction = ProgramTerm;
  term.sa_flags = SA_SIGINFO;
  ASSERT_EQ(::sigaction(SIGTERM, &term, nullptr), 0);

  InstallSignalHandlers();
  InstallSignalHandlers();  // idempotent: must not chain to itself

  struct sigaction now = {};
  ASSERT_EQ(::sigaction(SIGUSR1, nullptr, &now), 0);
  EXPECT_NE(now.sa_flags & SA_RESTART, 0) << "blocking calls of the program would be cut short";

  ASSERT_EQ(::raise(SIGUSR1), 0);
  EXPECT_TRUE(StopSignalled().load());
  EXPECT_EQ(g_program_usr1.load(), 1);
  EXPECT_TRUE(g_flag_was_set.load()) << "muster's flag is set before the program's handler runs";

  ASSERT_EQ(::raise(SIGTERM), 0);  // the program's handler catches it: the process lives
  EXPECT_TRUE(LeaveSignalled().load());
  EXPECT_EQ(g_program_term.load(), 1);
}

}  // namespace
}  // namespace muster
