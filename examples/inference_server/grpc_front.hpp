// The inference server's gRPC front: the Open Inference Protocol's
// inference.GRPCInferenceService (grpc_service.proto) with Debian's gRPC.
//
// gRPC's callback API takes each call on gRPC's threads; an inference is
// handed to the server's Asio executor as a coroutine, so one import path
// (kserve_models.hpp) serves every front. ModelInfer takes the request's
// bytes, not a message gRPC parsed: they are answered as the UCX
// transport's are (kserve_service.hpp, message_server::answer_serialized),
// walked against the message's descriptor and bounded before protobuf
// parses them, so that a message of many tiny fields cannot make the server
// build a hundred times its size. Tensors imported in place from
// raw_input_contents view the parsed message, which lives until their
// DLPack deleters have run; the call is finished once the answer is ready.
//
// A request message is at most --max_request_mib (larger ones get
// RESOURCE_EXHAUSTED from gRPC before any of it reaches the server), and
// its bytes are taken from the memory budget until the parsed message is
// gone: it waits for room, as the other fronts' requests do
// (RESOURCE_EXHAUSTED at once when larger than the whole budget). gRPC's
// own memory (messages received, waiting or not, and a request's bytes
// until its call is finished) is bounded by a resource quota (the server
// gives it the budget plus one request's size). Errors carry the
// absl::StatusCode of the error as the gRPC status code (the two share
// their numbering) and the same messages as the REST front.
//
// Connections are accepted by the server's own accept loop (accept_loop.hpp),
// so that they count against --max_connections with the HTTP and UCX ones,
// and handed to gRPC (adopt()). gRPC tells nobody when it closes one, so a
// sweep looks every `sweep_interval` whether each adopted descriptor still
// is the socket it was (its device and inode), and gives the connection's
// slot back once it is not.
//
// Thread safety: all members are safe from any thread; stop() waits for the
// calls under way, so not from the executor's threads.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "asio/any_io_executor.hpp"
#include "asio/ip/tcp.hpp"
#include "buffer_pool.hpp"
#include "connection_limit.hpp"
#include "dlasync/dlasync.hpp"
#include "kserve_models.hpp"
#include "server_stats.hpp"
#include "shm_registry.hpp"

namespace dlasync::examples {

class grpc_front {
 public:
  struct options {
    std::uint32_t max_message = 0;
    std::uint64_t memory_quota = 0;  // gRPC's own memory; 0: gRPC's default
    std::chrono::milliseconds sweep_interval{250};
    // A connection with no call for this long is closed (--idle_timeout_ms;
    // 0: gRPC's default, none); calls still under way this long after stop()
    // began are cancelled (--read_timeout_ms; 0: one second).
    std::chrono::milliseconds idle_timeout{0};
    std::chrono::milliseconds stop_grace{0};
  };

  // Serves the connections adopt() hands it until stop(). Everything passed
  // in outlives this object.
  static absl::StatusOr<std::unique_ptr<grpc_front>> start(const options& o,
                                                           asio::any_io_executor executor,
                                                           kserve::model_handler& models,
                                                           kserve::shm_registry& shm,
                                                           std::shared_ptr<memory_budget> budget,
                                                           buffer_pool& pool, server_stats& stats);
  ~grpc_front();

  // Hands an accepted connection to gRPC, which owns it from here on; its
  // slot is given back once gRPC has closed it.
  void adopt(asio::ip::tcp::socket socket, connection_limit::slot slot);
  // Stops taking calls, waits until those under way have finished, closes
  // every connection and gives their slots back. Idempotent.
  void stop();

 private:
  class service;
  grpc_front() = default;

  std::unique_ptr<service> service_;
  struct server_holder;
  std::unique_ptr<server_holder> server_;
  struct adopted;
  struct adoptions;
  std::shared_ptr<adoptions> adopted_;
  std::chrono::milliseconds stop_grace_{1000};
};

}  // namespace dlasync::examples
