// dlasync_load's KServe v2 drivers: requests to the server's `sum` model
// over REST (HTTP/1.1 with the binary tensor data extension), gRPC and UCX
// (the gRPC messages as active messages), each answer's SUM checked, and,
// with a share of malformed requests, each refusal checked for its status
// and a word of its message.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "common/stats.hpp"

namespace dlasync::examples {

// What the load client counts, over any transport.
struct load_stats {
  std::atomic<std::uint64_t> valid_ok{0};
  std::atomic<std::uint64_t> malformed_answered{0};
  std::atomic<std::uint64_t> wrong{0};
  std::atomic<std::uint64_t> reconnects{0};
  std::atomic<std::uint64_t> bytes_sent{0};
  latency_recorder latency;
  std::mutex mutex;
  std::vector<std::string> problems;

  void problem(std::string what) {
    wrong.fetch_add(1);
    std::lock_guard lock(mutex);
    if (problems.size() < 10) problems.push_back(std::move(what));
  }
};

// The server's limits, in bytes, as the flags give them; 0 when not given.
struct server_limits_given {
  std::uint32_t max_request = 0;
  std::uint32_t budget = 0;
  std::uint32_t connection_budget = 0;
};

struct kserve_load {
  std::string host = "127.0.0.1";
  int port = 0;
  int connections = 8;
  clock::time_point stop_at;
  int max_elements = 65536;  // the largest request, in FP32 elements
  double malformed = 0;      // the share of malformed requests
  std::uint32_t seed = 1;
  server_limits_given server;
  int threads = 2;  // REST: the threads that run its connections
  // UCX: valid requests' inputs are published as remote bundles on a node
  // listening on this address (the server fetches them); empty: sent in
  // the requests.
  std::string remote_inputs_address;
};

// Each runs `load.connections` connections until `load.stop_at`, counting
// into `stats`. REST: coroutines on `threads` threads; gRPC and UCX: a
// thread per connection (gRPC's synchronous stub; ucx_client). UCX's port
// is `load.port`, and its transports `ucx_transports`.
void run_rest(const kserve_load& load, load_stats& stats);
void run_grpc(const kserve_load& load, load_stats& stats);
void run_ucx(const kserve_load& load, const std::string& ucx_transports, load_stats& stats);

#if defined(DLASYNC_EXAMPLES_HAVE_UCX)
class ucx_client;
// Runs `use` with a UCX client whose progress runs on `threads` threads of
// its own, then stops it; a client that cannot be made is a problem in
// `stats`, and `use` does not run.
void with_ucx_client(const std::string& transports, int threads, load_stats& stats,
                     const std::function<void(ucx_client&)>& use);
#endif

}  // namespace dlasync::examples
