// What a muster-agent and the trainers it starts agree on besides the
// coordinator's protocol (which the agent relays, protos/muster/v1): how a
// trainer finds its agent, and how it names its process to it.
#ifndef MUSTER_RPC_AGENT_PROTOCOL_H_
#define MUSTER_RPC_AGENT_PROTOCOL_H_

namespace muster {

// The environment variable that hands a trainer its agent's address.
inline constexpr char kAgentSessionEnv[] = "MUSTER_AGENT_SESSION";
// The metadata entry in which a trainer names its process id to the agent.
inline constexpr char kTrainerPidMetadata[] = "muster-trainer-pid";

}  // namespace muster

#endif  // MUSTER_RPC_AGENT_PROTOCOL_H_
