// The host backend: CPU memory (with virtual host devices) and pinned CUDA
// host memory read as host memory. Streams are in-order queues whose tasks
// run on the runtime's worker pool; large copies are split across it.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <mutex>

#include "absl/functional/any_invocable.h"
#include "asio/thread_pool.hpp"
#include "dlasync/runtime/backend.hpp"
#include "dlasync/runtime/memory_budget.hpp"

namespace dlasync::detail {

struct host_backend_options {
  int host_devices = 1;
  int streams_per_device = 2;
  int worker_threads = 1;
  std::uint64_t parallel_copy_bytes = 1 << 20;
  std::uint64_t cache_min_bytes = 256 << 10;
  std::uint64_t cache_max_bytes = 0;
  std::function<void()> copy_unit_observer;
};

class host_stream;
class host_block_cache;

class host_backend final : public backend {
 public:
  host_backend(host_backend_options options, asio::thread_pool& pool);
  ~host_backend() override;

  const char* name() const noexcept override { return "host"; }
  std::vector<served_devices> served() const override;
  int stream_count(device d) const noexcept override;
  absl::StatusOr<device_buffer> allocate(device d, std::uint64_t bytes, std::size_t alignment,
                                         stream_ref s) override;
  marker_ptr enqueue_copy(stream_ref s, copy_job job) override;
  marker_ptr record(stream_ref s) override;
  absl::Status wait(stream_ref s, marker_ptr m) override;
  absl::StatusOr<std::optional<device>> device_of(const void* pointer) const override;
  marker_ptr record_producer(device d, std::int64_t producer_stream) override;
  absl::Status order_consumer(device d, std::int64_t consumer_stream, const marker_ptr& m) override;

 private:
  host_stream& stream(stream_ref s);
  void run_copy(copy_job& job, absl::AnyInvocable<void() &&> done);
  void run_units(const strided_copy& copy, const copy_job& job, std::int64_t begin,
                 std::int64_t end) const;

  host_backend_options options_;
  asio::thread_pool& pool_;
  std::shared_ptr<host_block_cache> cache_;
  std::vector<std::unique_ptr<host_stream>> streams_;
};

}  // namespace dlasync::detail
