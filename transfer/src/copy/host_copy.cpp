#include "transfer/src/copy/host_copy.hpp"

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "transfer/src/kernels/gather.hpp"

namespace dlasync::detail {
namespace {

// Copies units [begin, end), checking for cancellation about every 256 KiB.
void run_units(const copy_services& with, const strided_copy& copy, const copy_request& request,
               std::int64_t begin, std::int64_t end) {
  const std::uint64_t unit = std::max<std::uint64_t>(copy.unit_bytes(), 1);
  const std::int64_t step =
      static_cast<std::int64_t>(std::max<std::uint64_t>(1, (256 << 10) / unit));
  const std::shared_ptr<copy_control>& control = request.control;
  for (std::int64_t u = begin; u < end; u += step) {
    if (control && control->cancel_requested.load(std::memory_order_relaxed)) {
      control->aborted.store(true, std::memory_order_release);
      return;
    }
    copy.run(request.from, request.to, u, std::min(end, u + step));
    with.observe_unit();
  }
}

// The copy as a host stream task: on this worker, or split among several.
void run_copy(const copy_services& with, const copy_request& request, host_stream::done_fn done) {
  const std::shared_ptr<copy_control>& control = request.control;
  if (control && control->cancel_requested.load(std::memory_order_acquire)) {
    control->aborted.store(true, std::memory_order_release);
    return std::move(done)();
  }
  auto copy = std::make_shared<const strided_copy>(request.layout);
  const std::int64_t units = copy->units();
  std::int64_t parts = 1;
  if (copy->bytes() >= with.parallel_copy_bytes && with.worker_threads > 1) {
    const std::uint64_t part_bytes = std::max<std::uint64_t>(with.parallel_copy_bytes / 2, 1);
    const auto by_size = static_cast<std::int64_t>(std::min<std::uint64_t>(
        copy->bytes() / part_bytes, static_cast<std::uint64_t>(with.worker_threads)));
    parts = std::min<std::int64_t>(units, by_size);
  }
  if (parts <= 1) {
    run_units(with, *copy, request, 0, units);
    return std::move(done)();
  }

  // Split the units among `parts` workers; the last one to finish calls done.
  struct shared_state {
    std::atomic<std::int64_t> remaining;
    host_stream::done_fn done;
  };
  auto state = std::make_shared<shared_state>();
  state->remaining = parts;
  state->done = std::move(done);
  auto run_part = [with, copy, request, state, units, parts](std::int64_t p) {
    run_units(with, *copy, request, units * p / parts, units * (p + 1) / parts);
    if (state->remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::move(state->done)();
    }
  };
  // The other parts go to other workers; this worker takes the first.
  for (std::int64_t p = 1; p < parts; ++p) {
    with.workers->post([run_part, p] { run_part(p); });
  }
  run_part(0);
}

marker_ptr enqueue(const copy_services& with, stream_slot s, copy_request request) {
  host_backend& host = *with.host;
  host.stream(s).enqueue([with, request = std::move(request)](host_stream::done_fn done) mutable {
    run_copy(with, request, std::move(done));
  });
  return host.record(s);
}

// The slices of one copy_here call, shared with its helpers: they may run
// after the call returned, and then find every slice claimed.
struct slices final : shared_job {
  const strided_copy* copy = nullptr;  // read only after claiming a slice
  const void* from = nullptr;
  void* to = nullptr;
  std::int64_t count = 0;               // slices
  std::int64_t units = 0;               // the copy's units
  const copy_services* with = nullptr;  // its unit observer
  std::atomic<std::int64_t> next{0};
  std::atomic<std::int64_t> done{0};

  // Claims and copies slices until none is left.
  void help() noexcept override {
    for (std::int64_t i = next.fetch_add(1, std::memory_order_relaxed); i < count;
         i = next.fetch_add(1, std::memory_order_relaxed)) {
      copy->run(from, to, units * i / count, units * (i + 1) / count);
      with->observe_unit();
      if (done.fetch_add(1, std::memory_order_acq_rel) + 1 == count) done.notify_one();
    }
  }
};

}  // namespace

void copy_here(const copy_services& with, const strided_copy& copy, const void* from, void* to) {
  const std::int64_t units = copy.units();
  // Helpers only where a slice outlasts the wake-up of the worker that
  // takes it: slices of a quarter of parallel_copy_bytes, from copies of
  // parallel_copy_bytes up.
  const std::uint64_t slice_bytes = std::max<std::uint64_t>(with.parallel_copy_bytes / 4, 1);
  const auto count = static_cast<std::int64_t>(
      std::min<std::uint64_t>(copy.bytes() / slice_bytes, static_cast<std::uint64_t>(units)));
  if (copy.bytes() < with.parallel_copy_bytes || with.worker_threads < 2 || count < 2) {
    copy.run(from, to, 0, units);
    with.observe_unit();
    return;
  }
  auto shared = std::make_shared<slices>();
  shared->copy = &copy;
  shared->from = from;
  shared->to = to;
  shared->count = count;
  shared->units = units;
  shared->with = &with;
  // This thread is one of worker_threads copying threads, as in a parallel
  // loop.
  const int helpers = std::min<int>(with.worker_threads - 1, static_cast<int>(count - 1));
  work_pool& workers = *with.workers;
  workers.offer(shared, helpers);
  shared->help();
  workers.withdraw(shared.get());
  // Only slices already running are left: a short spin, as they end within
  // a slice's time, then a sleep.
  for (int spin = 0; spin < 2000; ++spin) {
    if (shared->done.load(std::memory_order_acquire) == count) return;
#if defined(__SSE2__)
    _mm_pause();
#endif
  }
  for (std::int64_t seen = shared->done.load(std::memory_order_acquire); seen != count;
       seen = shared->done.load(std::memory_order_acquire)) {
    shared->done.wait(seen, std::memory_order_acquire);
  }
}

marker_ptr copy_on_host(const copy_services& with, stream_slot s, copy_request request) {
  if (!request.produced) return enqueue(with, s, std::move(request));
  // Pinned memory written on a CUDA stream: the host copies it once the
  // stream has reached the point the import recorded.
  marker_ptr produced = request.produced;
  auto copied = std::make_shared<completion_marker>();
  produced->on_complete(
      [with, s, request = std::move(request), copied](const absl::Status& status) mutable {
        if (!status.ok()) return copied->complete(status);
        if (cuda::api* api = with.cuda_api; api != nullptr) {
          const cuda::memory_range read = source_extent(request.from, request.layout);
          api->host_access(read.begin, read.bytes, cuda::host_use::read,
                           "a host copy reads the page-locked source");
        }
        enqueue(with, s, std::move(request))->on_complete([copied](const absl::Status& st) {
          copied->complete(st);
        });
      });
  return copied;
}

}  // namespace dlasync::detail
