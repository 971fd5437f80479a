// The input format of coordinator_fuzz, shared by the target and the seed
// generator. An input is read with FuzzedDataProvider as:
//
//   setup:  min_members   ConsumeIntegralInRange<uint32_t>(1, 3)
//           extra_members ConsumeIntegralInRange<uint32_t>(0, 2)  max = min + extra
//           last_call     ConsumeBool()                            true: kLastCall
//           multiple      ConsumeIntegralInRange<uint32_t>(1, 2)   (invalid rules: input skipped)
//           keep_last     ConsumeIntegralInRange<uint32_t>(0, 3)
//           keep_best     ConsumeIntegralInRange<uint8_t>(0, 2)    none, "loss", "accuracy"
//   then up to kMaxOps operations, each:
//           op            ConsumeIntegralInRange<uint8_t>(0, kOpCount - 1)
//           auth          ConsumeIntegralInRange<uint8_t>(0, 3)    0, 1: the job token,
//                                                                  2: a wrong one, 3: none
//           parsed        ConsumeBool()   (rpc and session ops only)
//     parsed: the request is ParseFromString of a slice:
//           length        ConsumeIntegralInRange<uint16_t>(0, kMaxSliceBytes)
//           bytes         ConsumeBytesAsString(length)
//       (kSessionOpen: a count ConsumeIntegralInRange<uint8_t>(1, kMaxSessionMessages)
//        and that many slices, each a SessionRequest)
//     otherwise the fields are drawn one by one (see coordinator_fuzz.cc).
//   kTick reads ConsumeIntegralInRange<size_t>(0, 7) (how far the fake clock
//   moves, see kTickSteps); kSessionHeartbeat and kSessionClose read a session
//   index ConsumeIntegralInRange<uint8_t>(0, kMaxSessions - 1), the heartbeat
//   then its fields; kRestart reads nothing. None of them reads auth or parsed.
#ifndef MUSTER_TESTS_FUZZ_COORDINATOR_INPUT_H_
#define MUSTER_TESTS_FUZZ_COORDINATOR_INPUT_H_

#include <cstddef>
#include <cstdint>

namespace muster::fuzz {

enum class Op : uint8_t {
  kJoin,
  kRendezvous,
  kLeave,
  kDrain,
  kKvSet,
  kKvGet,
  kKvAdd,
  kKvCompareAndSet,
  kBarrier,
  kBeginCheckpoint,
  kReportShard,
  kAbortCheckpoint,
  kListCheckpoints,
  kGetStatus,
  // Opens a Session stream and keeps it open (a member with a live session).
  kSessionOpen,
  kSessionHeartbeat,
  // Ends an open session from the client side (the member fails).
  kSessionClose,
  // Advances the coordinator's fake clock and calls Tick().
  kTick,
  // Shuts the coordinator down and starts a new one on the same state store
  // (a coordinator restart; members reattach).
  kRestart,
  // One page of the membership.
  kGetWorld,
  kOpCount,
};
inline constexpr uint8_t kOpCount = static_cast<uint8_t>(Op::kOpCount);

enum class Auth : uint8_t { kToken, kToken2, kWrongToken, kNoToken };

inline constexpr size_t kMaxOps = 48;
inline constexpr uint16_t kMaxSliceBytes = 2048;
inline constexpr uint8_t kMaxSessionMessages = 4;
inline constexpr uint8_t kMaxSessions = 4;
inline constexpr uint32_t kLastCallMs = 200;
// kTick: how far the clock moves, in milliseconds: nothing, a last call, a
// heartbeat interval, past the heartbeat timeout, past the reattach grace,
// past the longest wait, and past the join timeout.
inline constexpr uint32_t kTickSteps[] = {0, 100, 250, 1'000, 6'000, 31'000, 601'000, 3'600'000};

inline constexpr char kJobToken[] = "fuzz-job-token";
inline constexpr char kWrongToken[] = "fuzz-job-tokeN";

}  // namespace muster::fuzz

#endif  // MUSTER_TESTS_FUZZ_COORDINATOR_INPUT_H_
