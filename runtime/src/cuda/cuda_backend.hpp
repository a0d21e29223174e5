// The CUDA backend: per-device pools of non-blocking streams, pooled events
// polled by a reactor thread (spin briefly, then park), a pool of pinned
// staging chunks, and the copy paths between host and device memory and
// between devices. Every CUDA call goes through dlasync::cuda::api, so the
// same code runs on a real GPU and on the simulated runtime.
#pragma once

#include <atomic>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "asio/thread_pool.hpp"
#include "dlasync/runtime/backend.hpp"
#include "dlasync/runtime/cuda_api.hpp"

namespace dlasync::detail {

struct cuda_backend_options {
  int streams_per_device = 2;
  // Streams per device that carry pipeline chunks, so that transfers in
  // flight overlap with the staging of the next chunks.
  int staging_streams = 2;
  std::uint64_t staging_chunk_bytes = 4 << 20;
  int staging_chunks = 8;
};

// Counters the tests read to see that a pipeline overlapped.
struct cuda_backend_stats {
  int peak_concurrent_gathers = 0;  // staging threads filling chunks at once
  int peak_chunks_in_flight = 0;    // pinned chunks taken at once
  std::uint64_t pipelined_copies = 0;
  std::uint64_t direct_copies = 0;
};

class cuda_context;

class cuda_backend final : public backend {
 public:
  // Discovers the devices of `api` and creates their streams.
  static absl::StatusOr<std::unique_ptr<cuda_backend>> create(std::shared_ptr<cuda::api> api,
                                                              cuda_backend_options options,
                                                              asio::thread_pool& pool);
  ~cuda_backend() override;

  const char* name() const noexcept override;
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
  void quiesce() override;

  int device_count() const noexcept;
  cuda::api& api() noexcept;
  cuda_backend_stats stats() const;

 private:
  cuda_backend(std::shared_ptr<cuda_context> context, asio::thread_pool& pool);

  std::shared_ptr<cuda_context> context_;
  asio::thread_pool& pool_;
};

}  // namespace dlasync::detail
