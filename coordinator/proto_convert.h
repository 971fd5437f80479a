// Conversions between the coordinator's domain values (types.h) and the v1
// protocol's messages, shared by the unary service and the session streams.
#ifndef MUSTER_COORDINATOR_PROTO_CONVERT_H_
#define MUSTER_COORDINATOR_PROTO_CONVERT_H_

#include <cstdint>

#include "coordinator/rendezvous_waiters.h"
#include "coordinator/types.h"
#include "muster/v1/coordinator.pb.h"

namespace muster {

MemberKey ToKey(const v1::MemberRef& ref);
void ToProto(const MemberKey& key, v1::MemberRef* out);
void ToProto(const Assignment& a, v1::Assignment* out);
// The world's summary: a fixed number of fields, whatever its size.
void ToProto(const World& world, v1::World* out);
// What the member at `rank` receives: the summary, itself and its node.
void ToProto(const World& world, uint32_t rank, v1::RendezvousResponse* out);
// A Rendezvous answer: as above, or the summary and the delta when the
// result carries one.
void ToProto(const RendezvousResult& result, v1::RendezvousResponse* out);
BrokenWorldReport FromProto(const v1::BrokenWorld& broken);

}  // namespace muster

#endif  // MUSTER_COORDINATOR_PROTO_CONVERT_H_
