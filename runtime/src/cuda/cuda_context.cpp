#include "runtime/src/cuda/cuda_context.hpp"

#include <algorithm>
#include <atomic>
#include <iterator>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "dlasync/dlpack_stream.hpp"
#include "runtime/src/cuda/device_guard.hpp"
#include "runtime/src/planted.hpp"
#include "runtime/src/status_macros.hpp"

namespace dlasync::detail {
namespace {

// Attempts at recording a marker for a drain.
constexpr int drain_record_attempts = 3;

}  // namespace

cuda_context::cuda_context(std::shared_ptr<cuda::api> api, cuda_options options)
    : api_(std::move(api)), options_(std::move(options)) {}

absl::StatusOr<std::shared_ptr<cuda_context>> cuda_context::create(
    std::shared_ptr<cuda::api> api, const cuda_options& options, const std::vector<bool>& served) {
  const int devices = static_cast<int>(served.size());
  const auto first_served = std::find(served.begin(), served.end(), true);
  const int home = first_served == served.end()
                       ? 0
                       : static_cast<int>(std::distance(served.begin(), first_served));
  // The last reference may drop inside a reactor callback (a pipeline that
  // outlives the runtime by a moment): then the context, which joins the
  // reactor thread, is destroyed on a thread of its own.
  std::shared_ptr<cuda_context> context(new cuda_context(std::move(api), options),
                                        [](cuda_context* c) {
                                          if (c->reactor_ && c->on_reactor_thread()) {
                                            std::thread([c] { delete c; }).detach();
                                          } else {
                                            delete c;
                                          }
                                        });
  cuda::api& a = *context->api_;
  absl::StatusOr<stream_pool> streams =
      stream_pool::create(a, served, options.streams_per_device, options.staging_streams);
  if (!streams.ok()) return streams.status();
  context->streams_.emplace(*std::move(streams));
  context->events_ = std::make_unique<event_pool>(a, devices);
  context->chunks_ = std::make_unique<chunk_pool>(
      a, options.staging_chunk_bytes, options.staging_chunks, home, options.chunks_in_use);
  context->reactor_ = std::make_unique<reactor>(a);
  return context;
}

cuda_context::~cuda_context() {
  // The reactor first: no callback may run while the rest goes.
  reactor_.reset();
  streams_.reset();
  events_.reset();
  chunks_.reset();
  for (const auto& [device, p] : unfreed_memory_) {
    absl::StatusOr<device_guard> on = device_guard::enter(*api_, device);
    if (on.ok()) (void)api_->free_device(p);
  }
}

marker_ptr cuda_context::record(int device, cuda::stream_t s, cuda::api::site where) {
  absl::StatusOr<cuda::event_t> e = events_->take(device);
  if (!e.ok()) return done_marker(e.status());
  cuda::error err = cuda::error::success;
  {
    absl::StatusOr<device_guard> on = device_guard::enter(*api_, device);
    if (!on.ok()) {
      events_->give(device, *e);
      return done_marker(on.status());
    }
    err = api_->event_record(*e, s, where);
  }
  if (err != cuda::error::success) {
    events_->give(device, *e);
    return done_marker(cuda::to_status(err, "cudaEventRecord", device));
  }
  auto marker = std::make_shared<completion_marker>();
  {
    std::lock_guard lock(live_mutex_);
    live_[marker.get()] = {device, *e};
  }
  // The reactor only hands off: the marker's callbacks (a source handed to
  // the releaser, the next staging piece, delivery) run on the workers, with
  // the context held so that it outlives them and the event goes back after.
  reactor_->watch(device, *e,
                  [self = weak_from_this(), marker, device, event = *e](const absl::Status& st) {
                    std::shared_ptr<cuda_context> context = self.lock();
                    if (!context) return;  // torn down: nothing waits any more
                    auto complete = [context, marker, device, event, st]() {
                      {
                        std::lock_guard lock(context->live_mutex_);
                        context->live_.erase(marker.get());
                      }
                      marker->complete(st);
                      // Only now: until its marker completed, a stream wait may still take
                      // this event for the marker's (wait_for).
                      context->events_->give(device, event);
                    };
                    if (context->options_.completions) {
                      context->options_.completions->run(std::move(complete));
                    } else {
                      complete();
                    }
                  });
  return marker;
}

bool cuda_context::wait_for(int device, cuda::stream_t s, const completion_marker* m,
                            absl::Status& status, cuda::api::site where) {
  std::lock_guard lock(live_mutex_);  // the event is not recycled meanwhile
  auto it = live_.find(m);
  if (it == live_.end()) return false;
  absl::StatusOr<device_guard> on = device_guard::enter(*api_, device);
  if (!on.ok()) {
    status = on.status();
    return true;
  }
  if (const cuda::error err = api_->stream_wait_event(s, it->second.event, where);
      err != cuda::error::success) {
    status = cuda::to_status(err, "cudaStreamWaitEvent", device);
  }
  return true;
}

absl::Status cuda_context::order_after(int waiter_device, cuda::stream_t waiter,
                                       int signaller_device, cuda::stream_t signaller,
                                       cuda::api::site where) {
  const int device =
      planted_mistake(planted::event_of_waiter_device) ? waiter_device : signaller_device;
  DLASYNC_ASSIGN_OR_RETURN(cuda::event_t e, events_->take(device));
  absl::Status status = [&]() -> absl::Status {
    // Each call with its stream's device current: the special handles (1,
    // 2) name streams of the current device.
    DLASYNC_ASSIGN_OR_RETURN(device_guard on, device_guard::enter(*api_, signaller_device));
    DLASYNC_CUDA_RETURN_IF_ERROR("cudaEventRecord", signaller_device,
                                 api_->event_record(e, signaller, where));
    std::optional<device_guard> there;
    if (waiter_device != signaller_device) {
      DLASYNC_ASSIGN_OR_RETURN(device_guard entered, device_guard::enter(*api_, waiter_device));
      there.emplace(std::move(entered));
    }
    DLASYNC_CUDA_RETURN_IF_ERROR("cudaStreamWaitEvent", waiter_device,
                                 api_->stream_wait_event(waiter, e, where));
    return absl::OkStatus();
  }();
  // A wait captures the event as recorded: the event can be reused now.
  events_->give(device, e);
  return status;
}

void cuda_context::drain(const std::vector<device_stream>& streams, std::function<void()> done) {
  if (streams.empty()) return done();
  struct state {
    std::atomic<std::size_t> left;
    std::function<void()> done;
  };
  auto shared = std::make_shared<state>();
  shared->left.store(streams.size());
  shared->done = std::move(done);
  for (const device_stream& entry : streams) {
    marker_ptr m;
    for (int attempt = 0; attempt < drain_record_attempts; ++attempt) {
      m = record(entry.first, entry.second);
      if (failed_at_once(m).ok()) break;
    }
    m->on_complete([shared](const absl::Status&) {
      if (shared->left.fetch_sub(1) == 1) shared->done();
    });
  }
}

absl::Status cuda_context::release_memory(int device, void* p, cuda::stream_t s,
                                          cuda::api::site where) {
  absl::Status status;
  {
    absl::StatusOr<device_guard> on = device_guard::enter(*api_, device);
    if (!on.ok()) {
      status = on.status();
    } else if (const cuda::error e = api_->free_async(p, s, where); e != cuda::error::success) {
      status = cuda::to_status(e, "cudaFreeAsync", device);
    }
  }
  if (!status.ok()) {
    std::lock_guard lock(unfreed_mutex_);
    unfreed_memory_.emplace_back(device, p);
  }
  return status;
}

marker_ptr cuda_context::record_producer(int gpu, std::int64_t producer_stream) {
  if (producer_stream == stream_no_sync) return done_marker(absl::OkStatus());
  const cuda::stream_t s = cuda::stream_from_dlpack(producer_stream);
  int device = gpu;
  if (producer_stream != stream_legacy_default && producer_stream != stream_per_thread_default) {
    // A stream of another GPU than the tensor's is recorded with an event
    // of its own device. A handle names its device whatever is current.
    int owner = -1;
    if (api_->stream_get_device(s, &owner) == cuda::error::success && owner >= 0 &&
        owner < device_count()) {
      device = owner;
    }
  }
  return record(device, s);
}

absl::Status cuda_context::order_consumer(device d, std::int64_t consumer_stream,
                                          const marker_ptr& m) {
  if (m->done()) return absl::OkStatus();
  absl::Status status;
  if (wait_for(d.ordinal, cuda::stream_from_dlpack(consumer_stream), m.get(), status)) {
    return status;
  }
  if (m->done()) return absl::OkStatus();
  return absl::UnimplementedError(
      "this transfer finishes on the host (a staging pipeline): the import resumes when the "
      "data is ready instead");
}

absl::StatusOr<std::optional<device>> cuda_context::device_of(const void* pointer) {
  cuda::pointer_attributes a;
  if (const cuda::error e = api_->pointer_get_attributes(&a, pointer); e != cuda::error::success) {
    return cuda::to_status(e, "cudaPointerGetAttributes", -1);
  }
  switch (a.type) {
    case cuda::memory_type::device: return std::optional(device{device_kind::cuda, a.device});
    case cuda::memory_type::managed:
      return std::optional(device{device_kind::cuda_managed, a.device});
    case cuda::memory_type::host: return std::optional(device{device_kind::cuda_host, 0});
    default: return std::optional<device>();
  }
}

}  // namespace dlasync::detail
