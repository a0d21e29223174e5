// The host backend (internal): CPU memory, with virtual host devices, and
// pinned CUDA host memory read as host memory. It allocates host memory
// through a cache of freed blocks and gives each host device in-order
// streams whose tasks run on the runtime's worker pool. Host copies
// (transfer/src/copy/host_copy.cpp) run on those streams.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/src/backend.hpp"
#include "runtime/src/completion_marker.hpp"
#include "runtime/src/host/host_block_cache.hpp"
#include "runtime/src/host/host_stream.hpp"
#include "runtime/src/work_pool.hpp"

namespace dlasync::detail {

struct host_backend_options {
  int host_devices = 1;
  int streams_per_device = 2;
  // Freed blocks of at least `cache_min_bytes` are kept for reuse, up to
  // `cache_max_bytes` in all. From a page: a small copy's buffer from
  // aligned_alloc, and its free, cost more than the copy itself.
  std::uint64_t cache_min_bytes = 4096;
  std::uint64_t cache_max_bytes = 0;
};

class host_backend final : public backend {
 public:
  host_backend(host_backend_options options, work_pool& pool);
  ~host_backend() override;

  const char* name() const noexcept override { return "host"; }
  std::vector<served_devices> served() const override;
  absl::StatusOr<device_buffer> allocate(device d, std::uint64_t bytes, std::size_t alignment,
                                         stream_slot s,
                                         const free_stream_cell& free_stream) override;
  // Host memory is never freed stream-ordered.
  absl::StatusOr<device_buffer> allocate(device d, std::uint64_t bytes, std::size_t alignment,
                                         stream_slot s) {
    return allocate(d, bytes, alignment, s, nullptr);
  }

  // Stream `s.index` of host device `s.device`; pinned host memory is the
  // host's, and its work runs on cpu:0's streams.
  host_stream& stream(stream_slot s);

  // A marker that completes when stream `s` has run what it holds now.
  marker_ptr record(stream_slot s);

  // Bytes of freed blocks kept for reuse.
  std::uint64_t cached_bytes() const;

 private:
  host_backend_options options_;
  host_block_cache_ref cache_;
  std::vector<std::unique_ptr<host_stream>> streams_;
};

}  // namespace dlasync::detail
