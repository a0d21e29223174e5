#include "runtime/src/host/host_backend.hpp"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "runtime/src/device_registry_factory.hpp"
#include "runtime/src/host/host_block_cache.hpp"

namespace dlasync::detail {

host_backend::host_backend(host_backend_options options, work_pool& pool)
    : options_(options),
      cache_(new host_block_cache(options_.cache_min_bytes, options_.cache_max_bytes)) {
  const int count = options_.host_devices * options_.streams_per_device;
  for (int i = 0; i < count; ++i) streams_.push_back(std::make_unique<host_stream>(pool));
}

host_backend::~host_backend() = default;

std::vector<served_devices> host_backend::served() const {
  return host_backend_devices(options_.host_devices);
}

host_stream& host_backend::stream(stream_slot s) {
  const auto per_device = static_cast<std::size_t>(options_.streams_per_device);
  const auto ordinal =
      static_cast<std::size_t>(s.device.kind == device_kind::cpu ? s.device.ordinal : 0);
  return *streams_[ordinal * per_device + static_cast<std::size_t>(s.index) % per_device];
}

absl::StatusOr<device_buffer> host_backend::allocate(device d, std::uint64_t bytes,
                                                     std::size_t alignment, stream_slot,
                                                     const free_stream_cell& /*free_stream*/) {
  if (bytes == 0) return device_buffer(d, nullptr, 0, nullptr);
  alignment = std::max<std::size_t>(alignment, 64);  // a cache line at least
  std::uint64_t capacity = 0;
  void* data = cache_->acquire(bytes, alignment, capacity);
  if (data == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", bytes, " bytes on ", d.name(), ": out of host memory"));
  }
  // Sixteen bytes of capture, held in the release function itself: the
  // capacity follows from the buffer's bytes, which the buffer passes back.
  auto release = [cache = cache_, alignment](void* p, std::uint64_t n) {
    cache->release(p, cache->capacity_for(n, alignment), alignment);
  };
  static_assert(sizeof(release) <= 2 * sizeof(void*));
  return device_buffer(d, data, bytes, std::move(release));
}

std::uint64_t host_backend::cached_bytes() const {
  return cache_->cached_bytes();
}

marker_ptr host_backend::record(stream_slot s) {
  auto marker = std::make_shared<completion_marker>();
  stream(s).enqueue([marker](host_stream::done_fn done) {
    marker->complete(absl::OkStatus());
    std::move(done)();
  });
  return marker;
}

}  // namespace dlasync::detail
