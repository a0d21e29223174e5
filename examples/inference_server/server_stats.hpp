// What the inference server counts, and what it lets one request and one
// connection take, whichever transport carried them.
//
// Thread safety: server_stats' members are safe from any thread;
// server_limits is a value.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dlasync::examples {

struct server_stats {
  std::atomic<std::uint64_t> connections{0};
  std::atomic<std::uint64_t> answered_ok{0};
  std::atomic<std::uint64_t> answered_error{0};
  std::atomic<std::uint64_t> closed_unframed{0};
  std::atomic<std::uint64_t> closed_late{0};
  std::atomic<std::uint64_t> closed_idle{0};
  std::atomic<std::uint64_t> refused_connection_budget{0};
  std::atomic<std::uint64_t> bytes_received{0};
  std::mutex mutex;
  std::map<std::string, std::uint64_t> errors_by_code;

  void count_error(absl::StatusCode code) {
    answered_error.fetch_add(1);
    std::lock_guard lock(mutex);
    ++errors_by_code[absl::StatusCodeToString(code)];
  }
  // One answer, OK or not, whichever transport sent it.
  void count_answer(absl::StatusCode code) {
    if (code == absl::StatusCode::kOk) {
      answered_ok.fetch_add(1);
    } else {
      count_error(code);
    }
  }
};

// What one request and one connection may take, in bytes and in time.
struct server_limits {
  std::uint32_t max_body = 0;                 // --max_request_mib
  std::uint64_t budget = 0;                   // --memory_budget_mib
  std::uint64_t connection_budget = 0;        // --connection_budget_mib
  std::chrono::milliseconds read_timeout{0};  // 0: none
  std::chrono::milliseconds idle_timeout{0};  // 0: none
};

// The refusal of a request of `bytes` bytes, more than the whole memory
// budget of `budget` bytes: at once, as waiting for room would never end.
inline absl::Status over_whole_budget(std::uint64_t bytes, std::uint64_t budget) {
  return absl::ResourceExhaustedError(
      absl::StrCat("request of ", bytes, " bytes exceeds the whole memory budget of ", budget,
                   " bytes (--memory_budget_mib): send smaller tensors"));
}

}  // namespace dlasync::examples
