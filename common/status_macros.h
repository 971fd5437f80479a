// Early-return helpers for absl::Status and absl::StatusOr.
#ifndef MUSTER_COMMON_STATUS_MACROS_H_
#define MUSTER_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Returns the status from the enclosing function when `expr` is not OK.
#define MUSTER_RETURN_IF_ERROR(expr)                \
  do {                                              \
    ::absl::Status muster_status_ = (expr);         \
    if (!muster_status_.ok()) return muster_status_; \
  } while (0)

#define MUSTER_CONCAT_INNER_(a, b) a##b
#define MUSTER_CONCAT_(a, b) MUSTER_CONCAT_INNER_(a, b)

// `lhs = value of expr`, or returns its status when it is not OK.
#define MUSTER_ASSIGN_OR_RETURN(lhs, expr) \
  MUSTER_ASSIGN_OR_RETURN_IMPL_(MUSTER_CONCAT_(muster_sor_, __LINE__), lhs, expr)
#define MUSTER_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()

#endif  // MUSTER_COMMON_STATUS_MACROS_H_
