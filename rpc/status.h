// Conversion between absl::Status and grpc::Status (the codes share their
// numbering).
#ifndef MUSTER_RPC_STATUS_H_
#define MUSTER_RPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace muster {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace muster

#endif  // MUSTER_RPC_STATUS_H_
