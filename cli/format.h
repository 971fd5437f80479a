// Human-readable tables for the muster command line client.
#ifndef MUSTER_CLI_FORMAT_H_
#define MUSTER_CLI_FORMAT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "muster/v1/coordinator.pb.h"

namespace muster {

std::string FormatStatus(const v1::GetStatusResponse& status);
std::string FormatCheckpoints(const v1::ListCheckpointsResponse& list);
// `world` holds every page of GetWorld: the summary and all members.
std::string FormatWorld(const v1::GetWorldResponse& world);
// One line per event, oldest first: UTC time, kind, detail.
std::string FormatEvents(const v1::ListEventsResponse& events);
// --since: "" (any), a duration before `now` ("10m", "1h30m"), or an RFC
// 3339 time; Unix milliseconds. Errors: INVALID_ARGUMENT naming the text.
absl::StatusOr<int64_t> ParseSince(const std::string& text, absl::Time now);

}  // namespace muster

#endif  // MUSTER_CLI_FORMAT_H_
