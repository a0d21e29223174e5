#include "dlasync/runtime/runtime.hpp"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "cuda/cuda_backend.hpp"
#include "host_backend.hpp"

namespace dlasync {
namespace {

int resolve_workers(int requested) {
  if (requested > 0) return requested;
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

absl::Status check_options(const runtime_options& o) {
  auto bad = [](const char* what, int value, const char* range) {
    return absl::InvalidArgumentError(
        absl::StrCat("runtime_options::", what, " is ", value, "; it must be ", range));
  };
  if (o.executor_threads < 1 || o.executor_threads > 1024) {
    return bad("executor_threads", o.executor_threads, "in [1, 1024]");
  }
  if (o.worker_threads < 0 || o.worker_threads > 1024) {
    return bad("worker_threads", o.worker_threads, "in [0, 1024] (0: one per hardware thread)");
  }
  if (o.host_devices < 0 || o.host_devices > max_host_devices) {
    return bad("host_devices", o.host_devices, "in [0, 1024] (0: the topology's count)");
  }
  if (o.streams_per_device < 1 || o.streams_per_device > 64) {
    return bad("streams_per_device", o.streams_per_device, "in [1, 64]");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<runtime>> runtime::create(runtime_options options) {
  if (absl::Status s = check_options(options); !s.ok()) return s;
  process_topology topology;
  if (options.topology) {
    topology = *options.topology;
  } else {
    absl::StatusOr<process_topology> from_env = process_topology::from_environment();
    if (!from_env.ok()) return from_env.status();
    topology = *std::move(from_env);
  }
  if (options.host_devices > 0) topology.host_device_count = options.host_devices;
  options.host_devices = topology.host_device_count;
  options.worker_threads = resolve_workers(options.worker_threads);
  if (options.cuda.empty()) {
    const char* env = std::getenv("DLASYNC_CUDA");
    options.cuda = env != nullptr ? env : "auto";
  }
  std::unique_ptr<runtime> rt(new runtime(std::move(options)));
  if (absl::Status s = rt->start(topology); !s.ok()) return s;
  return rt;
}

runtime::runtime(runtime_options options)
    : options_(std::move(options)),
      budget_(std::make_shared<memory_budget>(options_.copy_memory_budget)),
      workers_(static_cast<std::size_t>(options_.worker_threads)) {}

absl::Status runtime::start(const process_topology& topology) {
  detail::host_backend_options host;
  host.host_devices = options_.host_devices;
  host.streams_per_device = options_.streams_per_device;
  host.worker_threads = options_.worker_threads;
  host.parallel_copy_bytes = options_.parallel_copy_bytes;
  host.cache_max_bytes = options_.host_cache_bytes;
  host.copy_unit_observer = options_.copy_unit_observer;
  host_ = std::make_unique<detail::host_backend>(std::move(host), workers_);
  std::vector<served_devices> served = host_->served();

  cuda_api_ = options_.cuda_api;
  if (!cuda_api_) {
    absl::StatusOr<std::unique_ptr<cuda::api>> api = cuda::make_api(options_.cuda);
    if (!api.ok()) return api.status();
    cuda_api_ = *std::move(api);
  }
  if (cuda_api_) {
    detail::cuda_backend_options o;
    o.streams_per_device = options_.streams_per_device;
    o.staging_streams = options_.staging_streams;
    o.staging_chunk_bytes = options_.staging_chunk_bytes;
    o.staging_chunks = options_.staging_chunks;
    absl::StatusOr<std::unique_ptr<detail::cuda_backend>> cuda =
        detail::cuda_backend::create(cuda_api_, o, workers_);
    if (!cuda.ok()) return cuda.status();
    cuda_devices_ = (*cuda)->device_count();
    std::vector<served_devices> more = (*cuda)->served();
    served.insert(served.end(), more.begin(), more.end());
    cuda_ = *std::move(cuda);
  }
  absl::StatusOr<device_registry> registry = device_registry::create(topology, served);
  if (!registry.ok()) return registry.status();
  registry_.emplace(*std::move(registry));
  next_stream_ = std::make_unique<std::atomic<std::uint32_t>[]>(
      static_cast<std::size_t>(options_.host_devices + 1 + cuda_devices_));
  work_.emplace(io_.get_executor());
  for (int i = 0; i < options_.executor_threads; ++i) {
    executor_threads_.emplace_back([this] { io_.run(); });
  }
  return absl::OkStatus();
}

runtime::~runtime() {
  shutdown();
}

backend& runtime::backend_for(device d) noexcept {
  const bool gpu = d.kind == device_kind::cuda || d.kind == device_kind::cuda_managed;
  return gpu && cuda_ ? *cuda_ : *host_;
}

backend& runtime::stream_backend(device d) noexcept {
  return d.kind == device_kind::cuda_host && cuda_ ? *cuda_ : backend_for(d);
}

backend& runtime::copy_backend(device source, device target) noexcept {
  return backend_for(copy_device(source, target));
}

device runtime::copy_device(device source, device target) noexcept {
  if (target.kind == device_kind::cuda) return target;
  // From GPU or managed memory to the host: the source GPU's streams.
  if (source.kind == device_kind::cuda || source.kind == device_kind::cuda_managed) {
    return {device_kind::cuda, source.ordinal};
  }
  return target;
}

absl::Status runtime::check_location(const void* pointer, device claimed) const {
  const bool gpu = claimed.kind == device_kind::cuda || claimed.kind == device_kind::cuda_managed;
  if (!gpu || !cuda_) return absl::OkStatus();
  const absl::StatusOr<std::optional<device>> where = cuda_->device_of(pointer);
  if (!where.ok()) {
    return absl::Status(where.status().code(),
                        absl::StrCat("cannot tell where the data of a tensor on ", claimed.name(),
                                     " lives: ", where.status().message()));
  }
  const std::optional<device>& actual = *where;
  if (actual == claimed) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "the tensor says it lives on ", claimed.name(), " but its data pointer ",
      absl::Hex(reinterpret_cast<std::uintptr_t>(pointer)), " is ",
      actual ? absl::StrCat("memory of ", actual->name()) : std::string("not CUDA device memory"),
      "; the producer exported a wrong device: fix its DLDevice"));
}

stream_ref runtime::next_stream(device d) noexcept {
  std::size_t slot = static_cast<std::size_t>(options_.host_devices);  // pinned host memory
  if (d.kind == device_kind::cpu) slot = static_cast<std::size_t>(d.ordinal);
  if (d.kind == device_kind::cuda) slot += 1 + static_cast<std::size_t>(d.ordinal);
  const std::uint32_t n = next_stream_[slot].fetch_add(1, std::memory_order_relaxed);
  return {d, static_cast<int>(n % static_cast<std::uint32_t>(options_.streams_per_device))};
}

std::size_t runtime::in_flight() const {
  std::lock_guard lock(ops_mutex_);
  return ops_.size();
}

std::uint64_t runtime::begin_operation(std::function<void()> cancel) {
  std::lock_guard lock(ops_mutex_);
  if (!accepting_.load(std::memory_order_acquire)) return 0;
  const std::uint64_t id = next_op_++;
  ops_.emplace(id, std::move(cancel));
  return id;
}

void runtime::end_operation(std::uint64_t id) {
  std::lock_guard lock(ops_mutex_);
  ops_.erase(id);
  if (ops_.empty()) ops_done_.notify_all();
}

void runtime::shutdown() {
  std::vector<std::function<void()>> cancels;
  {
    std::lock_guard lock(ops_mutex_);
    if (shut_down_) return;
    shut_down_ = true;
    accepting_.store(false, std::memory_order_release);
    for (auto& [id, cancel] : ops_) cancels.push_back(cancel);
  }
  for (std::function<void()>& cancel : cancels) cancel();
  {
    std::unique_lock lock(ops_mutex_);
    ops_done_.wait(lock, [this] { return ops_.empty(); });
  }
  // Every import has released its source; now stop the threads, once no
  // CUDA completion callback is still handing work to them.
  if (cuda_) cuda_->quiesce();
  work_.reset();
  io_.stop();
  for (std::thread& t : executor_threads_) t.join();
  workers_.join();
  cuda_.reset();
}

}  // namespace dlasync
