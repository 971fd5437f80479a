// Counting what a rank holds into a muster::MemoryAccount: each storage
// once, in the first category that reaches it (muster/memory_account.h
// says the order).
//
// Not thread-safe: one counting pass, on the training thread.
#ifndef MUSTER_TRAINER_ELASTIC_MEMORY_ACCOUNT_H_
#define MUSTER_TRAINER_ELASTIC_MEMORY_ACCOUNT_H_

#include <torch/types.h>

#include <string>
#include <unordered_set>

#include "muster/memory_account.h"

namespace muster {

class StorageCounter {
 public:
  // Adds the bytes of `t`'s storage to `*into` unless a tensor counted
  // before shares it; an undefined tensor adds nothing.
  void Add(const torch::Tensor& t, int64_t* into);

 private:
  std::unordered_set<const void*> seen_;
};

// "parameters 204.6 MB, gradients 204.6 MB, ..., total 818.4 MB".
std::string DescribeMemory(const MemoryAccount& account);

}  // namespace muster

#endif  // MUSTER_TRAINER_ELASTIC_MEMORY_ACCOUNT_H_
