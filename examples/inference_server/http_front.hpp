// The inference server's REST front: the Open Inference Protocol (KServe v2)
// over HTTP/1.1, with its binary tensor data extension.
//
//   GET  /v2/health/live, /v2/health/ready         200, no body
//   GET  /v2                                       server metadata
//   GET  /v2/models/{m}[/versions/{v}]             model metadata
//   GET  /v2/models/{m}[/versions/{v}]/ready       200, or 404 naming the models
//   POST /v2/models/{m}[/versions/{v}]/infer       inference (kserve_json.hpp)
//   GET  /v2/systemsharedmemory[/region/{r}]/status       the system
//   POST /v2/systemsharedmemory/region/{r}/register       shared-memory
//   POST /v2/systemsharedmemory[/region/{r}]/unregister   extension
//                                                  (shm_registry.hpp; 403
//                                                  without --allow_client_shm)
//
// Each connection is one coroutine on its own strand, reading requests with
// http_parse: keep-alive, pipelined requests (answered in order), chunked
// bodies, and Expect: 100-continue. A request's head is checked before its
// body is taken: a head over --http_max_header_kib gets 431, a body over
// --max_request_mib or over the connection's share of the memory budget gets
// 413, and the body then waits for room in the budget, as a UCX message or a
// gRPC call does. A body of known length is read straight into its buffer and
// imported from there. Every read and write has the server's deadlines
// (--read_timeout_ms from a request's first byte, --idle_timeout_ms
// between requests): a slow peer gets 408 and is cut off. Errors are the
// protocol's {"error": "..."} with a status that follows the error's code.
// After an error that leaves a body unread, the connection is closed.
//
// Thread safety: all members are safe to call from any thread; close_all()
// waits, so not from the executor's threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "asio/awaitable.hpp"
#include "asio/ip/tcp.hpp"
#include "buffer_pool.hpp"
#include "connection_limit.hpp"
#include "dlasync/dlasync.hpp"
#include "kserve_models.hpp"
#include "server_stats.hpp"
#include "session_set.hpp"
#include "shm_registry.hpp"

namespace dlasync::examples {

class http_front {
 public:
  // Bodies are reserved from `budget`, in buffers from `pool`; answers and cut-offs are counted in
  // `stats`. `models` and `stats` outlive this object.
  http_front(kserve::model_handler& models, kserve::shm_registry& shm,
             std::shared_ptr<memory_budget> budget, buffer_pool& pool, const server_limits& limits,
             std::size_t max_head_bytes, server_stats& stats)
      : models_(models),
        shm_(shm),
        pool_(pool),
        budget_(std::move(budget)),
        limits_(limits),
        max_head_bytes_(max_head_bytes),
        stats_(stats) {}

  // Serves one accepted connection, which holds `slot` until it ends.
  void serve_connection(asio::ip::tcp::socket socket, connection_limit::slot slot);

  // Answers a connection turned away (past --max_connections) with 503,
  // when the socket takes it at once; never blocks.
  static void refuse_connection(asio::ip::tcp::socket& socket, std::size_t max_connections);

  // Closes every connection and waits until all ended.
  void close_all() { sessions_.close_all(); }

  // The HTTP status for an error of `code`.
  static int http_status(absl::StatusCode code);

 private:
  struct reply;
  struct endpoint;
  class connection;

  asio::awaitable<void> session(std::shared_ptr<asio::ip::tcp::socket> socket, std::uint64_t id,
                                connection_limit::slot slot);
  asio::awaitable<reply> route(const endpoint& e, const struct http_head& head,
                               std::shared_ptr<std::byte[]> body, std::uint64_t length);
  asio::awaitable<reply> infer(const struct http_head& head, absl::string_view model,
                               absl::string_view version, std::shared_ptr<std::byte[]> body,
                               std::uint64_t length);

  reply shared_memory(const endpoint& e, absl::string_view body);

  kserve::model_handler& models_;
  kserve::shm_registry& shm_;
  buffer_pool& pool_;
  std::shared_ptr<memory_budget> budget_;
  const server_limits limits_;
  const std::size_t max_head_bytes_;
  server_stats& stats_;
  session_set sessions_;
};

}  // namespace dlasync::examples
