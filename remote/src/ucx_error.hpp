// UCX statuses as absl statuses (internal).
#pragma once

#include <string>

#include <ucp/api/ucp.h>

#include "absl/status/status.h"

namespace dlasync::remote_detail {

// A UCX status as an absl status with `what` in front: UCS_ERR_NO_MEMORY as
// ResourceExhausted, timeouts as DeadlineExceeded, a lost peer as
// Unavailable, a cancelled request as Cancelled, the rest as Internal.
absl::Status ucx_error(ucs_status_t status, const std::string& what);

}  // namespace dlasync::remote_detail
