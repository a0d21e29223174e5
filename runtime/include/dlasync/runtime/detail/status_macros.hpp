// dlasync/runtime/detail/status_macros.hpp
//
// The abseil of Debian 12 has no status macros; these are the project's own.
#pragma once

#include "absl/status/status.h"

// Evaluates `expr` (an absl::Status) and returns it from the enclosing
// function when it is not OK.
#define DLASYNC_RETURN_IF_ERROR(expr)                                                  \
  do {                                                                                 \
    if (::absl::Status dlasync_status_ = (expr); !dlasync_status_.ok()) [[unlikely]] { \
      return dlasync_status_;                                                          \
    }                                                                                  \
  } while (false)
