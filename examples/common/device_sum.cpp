#include "device_sum.hpp"

#include <array>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "asio/use_awaitable.hpp"

#ifdef DLASYNC_EXAMPLES_HAVE_CUDA
#include "sum_kernel.hpp"
#endif

namespace dlasync::examples {
namespace {

constexpr std::size_t slots_per_block = 1024;

// Eight partial sums, element i into partial i % 8, then added in order:
// eight independent chains of additions instead of one, which the compiler
// may also vectorize. The order is fixed, so the rounding is the same from
// run to run (as the CUDA kernel's is).
template <typename T>
double sum_as(const void* data, std::int64_t count) noexcept {
  const auto* p = static_cast<const T*>(data);
  constexpr std::int64_t lanes = 8;
  std::array<double, lanes> acc{};
  std::int64_t i = 0;
  for (; i + lanes <= count; i += lanes) {
    for (std::int64_t k = 0; k < lanes; ++k) {
      acc[static_cast<std::size_t>(k)] += static_cast<double>(p[i + k]);
    }
  }
  for (; i < count; ++i) acc[static_cast<std::size_t>(i % lanes)] += static_cast<double>(p[i]);
  double total = 0;
  for (const double a : acc) total += a;
  return total;
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
  const served_devices* gpus = rt.registry().find(device_kind::cuda);
  const int count = gpus == nullptr ? 0 : gpus->count;
  self->streams_.resize(static_cast<std::size_t>(count));
  self->next_stream_.assign(static_cast<std::size_t>(count), 0);
  for (int d = 0; d < count; ++d) {
    const device gpu{device_kind::cuda, d};
    if (!rt.registry().check_device(gpu, "compute").ok()) continue;
    for (int i = 0; i < streams_per_gpu; ++i) {
      absl::StatusOr<gpu_stream> s = gpu_stream::create(rt, gpu);
      if (!s.ok()) return s.status();
      self->streams_[static_cast<std::size_t>(d)].push_back(*std::move(s));
    }
  }
  return self;
}

device_sum::~device_sum() = default;

std::optional<std::int64_t> device_sum::stream_for(device d) {
  if (d.kind != device_kind::cuda || d.ordinal < 0 ||
      static_cast<std::size_t>(d.ordinal) >= streams_.size() ||
      streams_[static_cast<std::size_t>(d.ordinal)].empty()) {
    return std::nullopt;
  }
  const auto o = static_cast<std::size_t>(d.ordinal);
  std::lock_guard lock(mutex_);
  return streams_[o][next_stream_[o]++ % streams_[o].size()].dlpack_stream();
}

gpu_stream* device_sum::find_stream(device d, std::int64_t value) {
  if (d.kind != device_kind::cuda || d.ordinal < 0 ||
      static_cast<std::size_t>(d.ordinal) >= streams_.size()) {
    return nullptr;
  }
  for (gpu_stream& s : streams_[static_cast<std::size_t>(d.ordinal)]) {
    if (s.dlpack_stream() == value) return &s;
  }
  return nullptr;
}

absl::StatusOr<double*> device_sum::take_slot() {
  std::lock_guard lock(mutex_);
  if (free_slots_.empty()) {
    absl::StatusOr<device_buffer> block =
        rt_.allocate({device_kind::cuda_host, 0}, slots_per_block * sizeof(double));
    if (!block.ok()) return block.status();
    auto* slots = static_cast<double*>(block->data());
    slot_blocks_.push_back(*std::move(block));
    for (std::size_t i = 0; i < slots_per_block; ++i) free_slots_.push_back(slots + i);
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
  gpu_stream* s = stream ? find_stream(d, *stream) : nullptr;
  if (s == nullptr) {
    co_return absl::InvalidArgumentError(
        absl::StrCat("cannot sum on ", d.name(), " without a stream from stream_for"));
  }

  absl::StatusOr<double*> slot = take_slot();
  if (!slot.ok()) co_return slot.status();
  double* out = *slot;
  if (rt_.is_simulated(d)) {
    // Simulated device memory is host memory: the "kernel" is a host
    // function in stream order.
    const void* data = t.data();
    const dtype type = t.dtype();
    const std::int64_t count = t.element_count();
    if (absl::Status launched =
            s->launch_host_function([=] { *out = host_sum(data, type, count); });
        !launched.ok()) {
      return_slot(out);
      co_return launched;
    }
  } else {
#ifdef DLASYNC_EXAMPLES_HAVE_CUDA
    const int e = launch_sum_kernel(d.ordinal, t.data(), t.dtype().code, t.dtype().bits,
                                    t.element_count(), out, s->native_handle());
    if (e != 0) {
      return_slot(out);
      co_return absl::InternalError(
          absl::StrCat("the sum kernel failed to launch on ", d.name(), ": CUDA error ", e));
    }
#else
    return_slot(out);
    co_return absl::UnimplementedError("this build of the examples has no CUDA kernels");
#endif
  }
  // The sum reads the tensor on `s`: a GPU copy's memory is then freed on
  // `s`, after the kernel, whenever its holder lets go of it, also when this
  // coroutine is cancelled before the kernel has run (tensor::set_stream).
  if (t.stream() != stream_no_sync) {
    if (absl::Status handed = t.set_stream(s->dlpack_stream()); !handed.ok()) {
      (void)co_await s->async_wait(asio::use_awaitable);
      return_slot(out);
      co_return handed;
    }
  }
  const absl::Status done = co_await s->async_wait(asio::use_awaitable);
  const double result = *out;
  return_slot(out);
  if (!done.ok()) co_return done;
  co_return result;
}

}  // namespace dlasync::examples
