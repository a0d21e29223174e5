#include "device_sum.hpp"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/awaitables.hpp"
#include "dlasync/runtime/sim_cuda.hpp"

#ifdef DLASYNC_EXAMPLES_HAVE_CUDA
#include "sum_kernel.hpp"
#endif

namespace dlasync::examples {
namespace {

constexpr std::size_t slots_per_block = 1024;

template <typename T>
double sum_as(const void* data, std::int64_t count) noexcept {
  const auto* p = static_cast<const T*>(data);
  double acc = 0;
  for (std::int64_t i = 0; i < count; ++i) acc += static_cast<double>(p[i]);
  return acc;
}

}  // namespace

bool summable(dtype t) noexcept {
  return t == dtypes::float32 || t == dtypes::float64 || t == dtypes::int32 || t == dtypes::int64 ||
         t == dtypes::uint8;
}

double host_sum(const void* data, dtype type, std::int64_t count) noexcept {
  if (type == dtypes::float32) return sum_as<float>(data, count);
  if (type == dtypes::float64) return sum_as<double>(data, count);
  if (type == dtypes::int32) return sum_as<std::int32_t>(data, count);
  if (type == dtypes::int64) return sum_as<std::int64_t>(data, count);
  return sum_as<std::uint8_t>(data, count);
}

absl::StatusOr<std::unique_ptr<device_sum>> device_sum::create(runtime& rt, int streams_per_gpu) {
  std::unique_ptr<device_sum> self(new device_sum(rt));
  cuda::api* api = rt.cuda();
  if (api == nullptr) return self;
  const served_devices* gpus = rt.registry().find(device_kind::cuda);
  const int count = gpus == nullptr ? 0 : gpus->count;
  self->streams_.resize(static_cast<std::size_t>(count));
  self->next_stream_.assign(static_cast<std::size_t>(count), 0);
  for (int d = 0; d < count; ++d) {
    if (!rt.registry().check_device({device_kind::cuda, d}, "compute").ok()) continue;
    DLASYNC_CUDA_RETURN_IF_ERROR("cudaSetDevice", d, api->set_device(d));
    for (int i = 0; i < streams_per_gpu; ++i) {
      cuda::stream_t s = nullptr;
      DLASYNC_CUDA_RETURN_IF_ERROR("cudaStreamCreateWithFlags", d, api->stream_create(&s));
      self->streams_[static_cast<std::size_t>(d)].push_back(s);
    }
  }
  return self;
}

device_sum::~device_sum() {
  cuda::api* api = rt_.cuda();
  if (api == nullptr) return;
  for (std::size_t d = 0; d < streams_.size(); ++d) {
    if (streams_[d].empty()) continue;
    (void)api->set_device(static_cast<int>(d));
    for (cuda::stream_t s : streams_[d]) (void)api->stream_destroy(s);
  }
  for (void* block : slot_blocks_) (void)api->free_host(block);
}

std::optional<std::int64_t> device_sum::stream_for(device d) {
  if (d.kind != device_kind::cuda || d.ordinal < 0 ||
      static_cast<std::size_t>(d.ordinal) >= streams_.size() ||
      streams_[static_cast<std::size_t>(d.ordinal)].empty()) {
    return std::nullopt;
  }
  const auto o = static_cast<std::size_t>(d.ordinal);
  std::lock_guard lock(mutex_);
  cuda::stream_t s = streams_[o][next_stream_[o]++ % streams_[o].size()];
  return reinterpret_cast<std::int64_t>(s);
}

absl::StatusOr<double*> device_sum::take_slot() {
  std::lock_guard lock(mutex_);
  if (free_slots_.empty()) {
    void* block = nullptr;
    DLASYNC_CUDA_RETURN_IF_ERROR("cudaMallocHost", -1,
                                 rt_.cuda()->malloc_host(&block, slots_per_block * sizeof(double)));
    slot_blocks_.push_back(block);
    for (std::size_t i = 0; i < slots_per_block; ++i) {
      free_slots_.push_back(static_cast<double*>(block) + i);
    }
  }
  double* slot = free_slots_.back();
  free_slots_.pop_back();
  return slot;
}

void device_sum::return_slot(double* slot) {
  std::lock_guard lock(mutex_);
  free_slots_.push_back(slot);
}

asio::awaitable<absl::StatusOr<double>> device_sum::sum(const tensor& t,
                                                        std::optional<std::int64_t> stream) {
  if (!summable(t.dtype())) {
    co_return absl::InvalidArgumentError(absl::StrCat(
        "cannot sum dtype ", t.dtype().name(), ": send float32, float64, int32, int64 or uint8"));
  }
  if (!t.is_compact()) {
    co_return absl::InvalidArgumentError("cannot sum a strided tensor: import it contiguous");
  }
  const device d = t.device();
  if (is_host_memory(d.kind)) co_return host_sum(t.data(), t.dtype(), t.element_count());
  if (d.kind != device_kind::cuda || !stream) {
    co_return absl::InvalidArgumentError(
        absl::StrCat("cannot sum on ", d.name(), " without a stream from stream_for"));
  }

  cuda::api* api = rt_.cuda();
  absl::StatusOr<double*> slot = take_slot();
  if (!slot.ok()) co_return slot.status();
  double* out = *slot;
  auto s = reinterpret_cast<cuda::stream_t>(*stream);
  if (auto* sim = dynamic_cast<cuda::sim_api*>(api)) {
    const void* data = t.data();
    const dtype type = t.dtype();
    const std::int64_t count = t.element_count();
    const cuda::error e = sim->launch_host_func(s, [=] { *out = host_sum(data, type, count); });
    if (e != cuda::error::success) {
      return_slot(out);
      co_return cuda::to_status(e, "launch of the sum", d.ordinal);
    }
  } else {
#ifdef DLASYNC_EXAMPLES_HAVE_CUDA
    int e = static_cast<int>(api->set_device(d.ordinal));
    if (e == 0) {
      e = launch_sum_kernel(t.data(), t.dtype().code, t.dtype().bits, t.element_count(), out, s);
    }
    if (e != 0) {
      return_slot(out);
      co_return cuda::to_status(static_cast<cuda::error>(e), "sum kernel launch", d.ordinal);
    }
#else
    return_slot(out);
    co_return absl::UnimplementedError("this build of the examples has no CUDA kernels");
#endif
  }
  const absl::Status done = co_await wait_for(rt_.backend_for(d).record_producer(d, *stream));
  const double result = *out;
  return_slot(out);
  if (!done.ok()) co_return done;
  co_return result;
}

}  // namespace dlasync::examples
