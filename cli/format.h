// Human-readable tables for the muster command line client.
#ifndef MUSTER_CLI_FORMAT_H_
#define MUSTER_CLI_FORMAT_H_

#include <string>

#include "muster/v1/coordinator.pb.h"

namespace muster {

std::string FormatStatus(const v1::GetStatusResponse& status);
std::string FormatCheckpoints(const v1::ListCheckpointsResponse& list);
// `world` holds every page of GetWorld: the summary and all members.
std::string FormatWorld(const v1::GetWorldResponse& world);

}  // namespace muster

#endif  // MUSTER_CLI_FORMAT_H_
