#include "host_backend.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <new>

#include "absl/strings/str_cat.h"
#include "asio/post.hpp"
#include "host_block_cache.hpp"

namespace dlasync::detail {

// An in-order queue: one task runs at a time, each on the worker pool, and
// the next starts when the running one calls its `done`. A task that calls
// `done` before it returns, or from a worker thread, has the next task run
// on that thread at once; only a `done` from elsewhere (a reactor, another
// executor) posts it: each post may cost a thread wake-up.
class host_stream {
 public:
  using done_fn = absl::AnyInvocable<void() &&>;
  using task = absl::AnyInvocable<void(done_fn) &&>;

  explicit host_stream(asio::thread_pool& pool) : pool_(pool) {}

  void enqueue(task t) {
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(std::move(t));
      if (running_) return;
      running_ = true;
    }
    asio::post(pool_, [this] { start_next(); });
  }

 private:
  // What became of the running task first: its `done` was called, or it
  // returned. One task runs at a time, and the next starts only after both,
  // so one phase serves them all.
  enum : int { running = 0, done_first = 1, returned_first = 2 };

  void start_next() {
    while (true) {
      task t;
      {
        std::lock_guard lock(mutex_);
        if (queue_.empty()) {
          running_ = false;
          return;
        }
        t = std::move(queue_.front());
        queue_.pop_front();
      }
      phase_.store(running);
      std::move(t)([this] {
        int expected = running;
        if (phase_.compare_exchange_strong(expected, done_first, std::memory_order_acq_rel)) {
          return;  // before the task returned: the loop below goes on
        }
        if (pool_.get_executor().running_in_this_thread()) {
          start_next();  // a worker, outside the task: no recursion
        } else {
          asio::post(pool_, [this] { start_next(); });
        }
      });
      int expected = running;
      if (phase_.compare_exchange_strong(expected, returned_first, std::memory_order_acq_rel)) {
        return;  // `done` comes later and starts the next task
      }
    }
  }

  asio::thread_pool& pool_;
  std::mutex mutex_;
  std::deque<task> queue_;
  bool running_ = false;
  std::atomic<int> phase_{running};
};

host_backend::host_backend(host_backend_options options, asio::thread_pool& pool)
    : options_(std::move(options)),
      pool_(pool),
      cache_(
          std::make_shared<host_block_cache>(options_.cache_min_bytes, options_.cache_max_bytes)) {
  const int count = options_.host_devices * options_.streams_per_device;
  for (int i = 0; i < count; ++i) streams_.push_back(std::make_unique<host_stream>(pool_));
}

host_backend::~host_backend() = default;

std::vector<served_devices> host_backend::served() const {
  return host_backend_devices(options_.host_devices);
}

int host_backend::stream_count(device) const noexcept {
  return options_.streams_per_device;
}

host_stream& host_backend::stream(stream_ref s) {
  // Pinned host memory is the host's: its work runs on cpu:0's streams.
  const int ordinal = s.device.kind == device_kind::cpu ? s.device.ordinal : 0;
  return *streams_[static_cast<std::size_t>(ordinal * options_.streams_per_device +
                                            s.index % options_.streams_per_device)];
}

absl::StatusOr<device_buffer> host_backend::allocate(device d, std::uint64_t bytes,
                                                     std::size_t alignment, stream_ref) {
  if (bytes == 0) return device_buffer(d, nullptr, 0, nullptr);
  alignment = std::max<std::size_t>(alignment, 64);  // a cache line at least
  std::uint64_t capacity = 0;
  void* data = cache_->acquire(bytes, alignment, capacity);
  if (data == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", bytes, " bytes on ", d.name(), ": out of host memory"));
  }
  return device_buffer(d, data, bytes,
                       [cache = cache_, capacity, alignment](void* p, std::uint64_t) {
                         cache->release(p, capacity, alignment);
                       });
}

marker_ptr host_backend::enqueue_copy(stream_ref s, copy_job job) {
  stream(s).enqueue([this, job = std::move(job)](host_stream::done_fn done) mutable {
    run_copy(job, std::move(done));
  });
  return record(s);
}

void host_backend::run_copy(copy_job& job, absl::AnyInvocable<void() &&> done) {
  const std::shared_ptr<copy_control>& control = job.control;
  if (control && control->cancel_requested.load(std::memory_order_acquire)) {
    control->aborted.store(true, std::memory_order_release);
    return std::move(done)();
  }
  auto copy = std::make_shared<const strided_copy>(job.layout);
  const std::int64_t units = copy->units();
  std::int64_t parts = 1;
  if (copy->bytes() >= options_.parallel_copy_bytes && options_.worker_threads > 1) {
    const std::uint64_t part_bytes = std::max<std::uint64_t>(options_.parallel_copy_bytes / 2, 1);
    const auto by_size = static_cast<std::int64_t>(
        std::min<std::uint64_t>(copy->bytes() / part_bytes, options_.worker_threads));
    parts = std::min<std::int64_t>(units, by_size);
  }
  if (parts <= 1) {
    run_units(*copy, job, 0, units);
    return std::move(done)();
  }

  // Split the units among `parts` workers; the last one to finish calls done.
  struct shared_state {
    std::atomic<std::int64_t> remaining;
    absl::AnyInvocable<void() &&> done;
  };
  auto state = std::make_shared<shared_state>();
  state->remaining = parts;
  state->done = std::move(done);
  auto run_part = [this, copy, job, state, units, parts](std::int64_t p) {
    run_units(*copy, job, units * p / parts, units * (p + 1) / parts);
    if (state->remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::move(state->done)();
    }
  };
  // The other parts go to other workers; this worker takes the first.
  for (std::int64_t p = 1; p < parts; ++p) {
    asio::post(pool_, [run_part, p] { run_part(p); });
  }
  run_part(0);
}

void host_backend::run_units(const strided_copy& copy, const copy_job& job, std::int64_t begin,
                             std::int64_t end) const {
  // Check for cancellation about every 256 KiB.
  const std::uint64_t unit = std::max<std::uint64_t>(copy.unit_bytes(), 1);
  const std::int64_t step =
      static_cast<std::int64_t>(std::max<std::uint64_t>(1, (256 << 10) / unit));
  const std::shared_ptr<copy_control>& control = job.control;
  for (std::int64_t u = begin; u < end; u += step) {
    if (control && control->cancel_requested.load(std::memory_order_relaxed)) {
      control->aborted.store(true, std::memory_order_release);
      return;
    }
    copy.run(job.source, job.destination, u, std::min(end, u + step));
    if (options_.copy_unit_observer) options_.copy_unit_observer();
  }
}

marker_ptr host_backend::record(stream_ref s) {
  auto marker = std::make_shared<completion_marker>();
  stream(s).enqueue([marker](host_stream::done_fn done) {
    marker->complete(absl::OkStatus());
    std::move(done)();
  });
  return marker;
}

absl::Status host_backend::wait(stream_ref s, marker_ptr m) {
  stream(s).enqueue([m = std::move(m)](host_stream::done_fn done) mutable {
    m->on_complete([done = std::move(done)](absl::Status) mutable { std::move(done)(); });
  });
  return absl::OkStatus();
}

marker_ptr host_backend::record_producer(device, std::int64_t) {
  // Host memory has no streams: nothing to follow.
  auto marker = std::make_shared<completion_marker>();
  marker->complete(absl::OkStatus());
  return marker;
}

absl::Status host_backend::order_consumer(device d, std::int64_t, const marker_ptr&) {
  return absl::UnimplementedError(
      absl::StrCat(d.name(), " has no streams for a consumer to wait on"));
}

absl::StatusOr<std::optional<device>> host_backend::device_of(const void*) const {
  // Virtual host devices share one address space: a pointer does not say.
  return std::nullopt;
}

}  // namespace dlasync::detail
