// The coordinator's KV of one generation as a communicator's Store: where
// Gloo addresses, shared-memory names and NCCL ids meet
// (trainer/comm/store.h).
#ifndef MUSTER_TRAINER_CLIENT_COORDINATOR_STORE_H_
#define MUSTER_TRAINER_CLIENT_COORDINATOR_STORE_H_

#include <cstdint>
#include <memory>

#include "trainer/client/coordinator_client.h"
#include "trainer/comm/store.h"

namespace muster {

// `client` must outlive the store.
std::unique_ptr<Store> NewCoordinatorStore(CoordinatorClient* client, uint64_t generation);

}  // namespace muster

#endif  // MUSTER_TRAINER_CLIENT_COORDINATOR_STORE_H_
