// Status macros (internal): the abseil of Debian 12 has none.
#pragma once

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Evaluates `expr` (an absl::Status) and returns it from the enclosing
// function when it is not OK.
#define DLASYNC_RETURN_IF_ERROR(expr)                                                  \
  do {                                                                                 \
    if (::absl::Status dlasync_status_ = (expr); !dlasync_status_.ok()) [[unlikely]] { \
      return dlasync_status_;                                                          \
    }                                                                                  \
  } while (false)

// The arguments below are a declaration and a name, which parentheses would
// break.
// NOLINTBEGIN(bugprone-macro-parentheses)

// Evaluates `rexpr` (an absl::StatusOr<T>) and returns its status from the
// enclosing function when it is not OK; else moves its value into `lhs`, a
// declaration (`auto x`) or an lvalue.
#define DLASYNC_ASSIGN_OR_RETURN(lhs, rexpr) \
  DLASYNC_ASSIGN_OR_RETURN_IMPL(DLASYNC_STATUS_CONCAT(dlasync_statusor_, __LINE__), lhs, rexpr)

#define DLASYNC_ASSIGN_OR_RETURN_IMPL(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                  \
  if (!statusor.ok()) [[unlikely]]                          \
    return std::move(statusor).status();                    \
  lhs = *std::move(statusor)

#define DLASYNC_STATUS_CONCAT(a, b) DLASYNC_STATUS_CONCAT_IMPL(a, b)
#define DLASYNC_STATUS_CONCAT_IMPL(a, b) a##b
// NOLINTEND(bugprone-macro-parentheses)
