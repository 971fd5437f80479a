// Agent: runs one node's trainers as child processes and keeps them running.
//
// The agent starts `nproc` + `spares` copies of `command`, each with MUSTER_NODE_ID,
// MUSTER_LOCAL_RANK, MUSTER_LOCAL_WORLD_SIZE, MUSTER_RESTART_COUNT and
// MUSTER_SPARE (1 for local ranks nproc and up) set (the trainer takes its
// identity from them before any launcher variable). A
// trainer that dies is restarted as the Supervisor decides. Spares are
// trainers like the others, started at once (LibTorch loaded, model built,
// data read): the coordinator keeps them out of a full world, and when a
// member fails one of them takes its place in the next generation; the dead
// trainer's restart then waits outside the full world, which refills the
// pool. MUSTER_SPARE=1 makes the coordinator take a spare only after every
// other candidate, so a world forms from the trainers meant for it. SIGTERM, SIGINT,
// SIGUSR1 and SIGHUP are forwarded to every trainer and stop restarts; a
// second SIGINT (Ctrl-C twice), or `stop_grace` after the first signal, kills
// the trainers. Further signals while stopping are ignored: a batch system
// that sends SIGTERM after its warning signal must not cut a checkpoint short. Children die with the agent (PR_SET_PDEATHSIG), and before it
// returns the agent kills what is left of its process group, so nothing
// outlives it.
//
// With a coordinator in AgentOptions::node_session, the agent holds the
// node's one session with the coordinator for its trainers (node_session.h):
// a trainer whose process ends is reported at once with its exit status.
//
// Run() owns the calling process's signal mask and SIGCHLD: call it once,
// from main, before any other thread exists.
#ifndef MUSTER_AGENT_AGENT_H_
#define MUSTER_AGENT_AGENT_H_

#include <map>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "agent/node_session.h"
#include "agent/supervisor.h"

namespace muster {

struct AgentOptions {
  std::string node_id;
  // With a coordinator: the agent holds one session for the node's trainers
  // (see node_session.h; node_session.node is set from node_id). Without
  // one, each trainer holds its own session.
  NodeSessionOptions node_session;
  int nproc = 1;
  int spares = 0;  // extra trainers waiting for a place (slots nproc..nproc+spares-1)
  SupervisorOptions supervisor;
  absl::Duration stop_grace = absl::Seconds(60);
  // A trainer held stopped this long (stopped_trainers.h): wholly (SIGSTOP,
  // a debugger) its member is detached and the world goes on without it;
  // partly (a thread frozen while its heartbeats go on) it is ended and
  // restarted. Zero: never.
  absl::Duration stopped_limit = absl::Seconds(1);
  std::vector<std::string> command;  // argv of the trainer
  // Set in every trainer's environment, as torchrun hands MASTER_ADDR to
  // its workers: the coordinator and token file the agent was given
  // (MUSTER_COORDINATOR, MUSTER_TOKEN_FILE), so a program of the user's
  // finds the job without being told again.
  std::map<std::string, std::string> trainer_env;
};

// Runs the trainers until all are done or have given up; returns the agent's
// exit code (Supervisor::ExitCode) after logging the summary.
int RunAgent(const AgentOptions& options);

}  // namespace muster

#endif  // MUSTER_AGENT_AGENT_H_
