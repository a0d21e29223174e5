#include "cuda_backend.hpp"

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "asio/post.hpp"

namespace dlasync::detail {
namespace {

using cuda::error;

marker_ptr done_marker(absl::Status status) {
  auto m = std::make_shared<completion_marker>();
  m->complete(std::move(status));
  return m;
}

// The error of a marker that failed as it was made (nothing was recorded),
// else OK.
absl::Status failed_at_once(const marker_ptr& m) {
  absl::Status status;
  if (m->done()) m->on_complete([&status](absl::Status s) { status = std::move(s); });
  return status;
}

// Calls of cudaEventQuery that must fail in a row before the reactor takes
// an error for a failed context rather than a passing fault.
constexpr int persistent_query_failures = 3;
// Attempts at recording a marker for a drain.
constexpr int drain_record_attempts = 3;

bool is_compact(const strided_layout& l) {
  std::int64_t expected = 1;
  for (std::size_t i = l.shape.size(); i-- > 0;) {
    if (l.shape[i] != 1 && l.strides[i] != expected) return false;
    expected *= l.shape[i];
  }
  return true;
}

}  // namespace

// Everything the backend and the buffers it hands out share: buffers may
// outlive the runtime, so they keep this alive until they are freed.
class cuda_context {
 public:
  cuda_context(std::shared_ptr<cuda::api> api, cuda_backend_options options, int devices)
      : api_(std::move(api)), options_(options), devices_(static_cast<std::size_t>(devices)) {}

  ~cuda_context() {
    {
      std::lock_guard lock(reactor_mutex_);
      stop_ = true;
    }
    reactor_wake_.notify_all();
    if (reactor_.joinable()) reactor_.join();
    for (std::size_t d = 0; d < devices_.size(); ++d) {
      api_->set_device(static_cast<int>(d));
      for (cuda::stream_t s : devices_[d].streams) api_->stream_destroy(s);
      for (cuda::stream_t s : devices_[d].staging) api_->stream_destroy(s);
      for (cuda::event_t e : devices_[d].free_events) api_->event_destroy(e);
    }
    for (void* chunk : chunks_) api_->free_host(chunk);
    for (void* chunk : unfreed_chunks_) api_->free_host(chunk);
    for (const auto& [device, p] : unfreed_memory_) {
      api_->set_device(device);
      api_->free_device(p);
    }
  }

  absl::Status start() {
    for (std::size_t d = 0; d < devices_.size(); ++d) {
      const int dev = static_cast<int>(d);
      DLASYNC_CUDA_RETURN_IF_ERROR("cudaSetDevice", dev, api_->set_device(dev));
      for (int i = 0; i < options_.streams_per_device; ++i) {
        cuda::stream_t s = nullptr;
        DLASYNC_CUDA_RETURN_IF_ERROR("cudaStreamCreateWithFlags", dev, api_->stream_create(&s));
        devices_[d].streams.push_back(s);
      }
      for (int i = 0; i < options_.staging_streams; ++i) {
        cuda::stream_t s = nullptr;
        DLASYNC_CUDA_RETURN_IF_ERROR("cudaStreamCreateWithFlags", dev, api_->stream_create(&s));
        devices_[d].staging.push_back(s);
      }
    }
    reactor_ = std::thread([this] { poll(); });
    return absl::OkStatus();
  }

  cuda::api& api() { return *api_; }
  bool on_reactor_thread() const { return std::this_thread::get_id() == reactor_.get_id(); }
  const cuda_backend_options& options() const { return options_; }
  int device_count() const { return static_cast<int>(devices_.size()); }
  cuda::stream_t stream(int device, int index) {
    const auto& streams = devices_[static_cast<std::size_t>(device)].streams;
    return streams[static_cast<std::size_t>(index) % streams.size()];
  }
  const std::vector<cuda::stream_t>& staging(int device) {
    return devices_[static_cast<std::size_t>(device)].staging;
  }

  // Runs `fn` with `device` current on this thread (the current device is
  // per thread), then restores the previous one. When the device cannot be
  // made current, `fn` does not run: the failure comes back in fn's result
  // type (an error, a Status, a marker).
  template <typename F>
  auto on_device(int device, F&& fn) {
    using result_type = decltype(fn());
    int previous = 0;
    api_->get_device(&previous);
    if (const error e = api_->set_device(device); e != error::success) {
      if constexpr (std::is_same_v<result_type, error>) {
        return e;
      } else if constexpr (std::is_same_v<result_type, absl::Status>) {
        return cuda::to_status(e, "cudaSetDevice", device);
      } else if constexpr (std::is_same_v<result_type, marker_ptr>) {
        return done_marker(cuda::to_status(e, "cudaSetDevice", device));
      }
    }
    auto result = fn();
    api_->set_device(previous);
    return result;
  }

  // Frees stream-ordered device memory on `s`. Memory whose free fails (a
  // failed call or context) is freed again at teardown instead of lost.
  error release_memory(int device, void* p, cuda::stream_t s) {
    const error e = on_device(device, [&] { return api_->free_async(p, s); });
    if (e != error::success) {
      std::lock_guard lock(chunks_mutex_);
      unfreed_memory_.emplace_back(device, p);
    }
    return e;
  }

  absl::StatusOr<cuda::event_t> take_event(int device) {
    {
      std::lock_guard lock(events_mutex_);
      auto& free = devices_[static_cast<std::size_t>(device)].free_events;
      if (!free.empty()) {
        cuda::event_t e = free.back();
        free.pop_back();
        return e;
      }
    }
    cuda::event_t e = nullptr;
    const error err = on_device(device, [&] { return api_->event_create(&e); });
    if (err != error::success) return cuda::to_status(err, "cudaEventCreateWithFlags", device);
    return e;
  }

  void give_event(int device, cuda::event_t e) {
    std::lock_guard lock(events_mutex_);
    devices_[static_cast<std::size_t>(device)].free_events.push_back(e);
  }

  // A marker for everything enqueued on `s` (of `device`) so far.
  marker_ptr record(int device, cuda::stream_t s) {
    absl::StatusOr<cuda::event_t> e = take_event(device);
    if (!e.ok()) return done_marker(e.status());
    const error err = on_device(device, [&] { return api_->event_record(*e, s); });
    if (err != error::success) {
      give_event(device, *e);
      return done_marker(cuda::to_status(err, "cudaEventRecord", device));
    }
    auto marker = std::make_shared<completion_marker>();
    {
      std::lock_guard lock(live_mutex_);
      live_[marker.get()] = {device, *e};
    }
    watch(device, *e, [this, marker](absl::Status st) {
      {
        std::lock_guard lock(live_mutex_);
        live_.erase(marker.get());
      }
      marker->complete(std::move(st));
    });
    return marker;
  }

  // Calls `done` once everything enqueued so far on `streams` has run, or
  // never will run (a failed context). Error paths call it before they
  // release memory, staging chunks or the source: work enqueued before the
  // error may still read or write them. A marker that cannot be recorded is
  // retried; when recording keeps failing the context is taken for failed.
  void drain(std::vector<std::pair<int, cuda::stream_t>> streams, std::function<void()> done) {
    if (streams.empty()) return done();
    struct state {
      std::atomic<std::size_t> left;
      std::function<void()> done;
    };
    auto shared = std::make_shared<state>();
    shared->left.store(streams.size());
    shared->done = std::move(done);
    for (const auto& entry : streams) {
      // Named copies, not a structured binding: the lambda below captures
      // them (clang before 16 cannot capture bindings).
      const int device = entry.first;
      const cuda::stream_t s = entry.second;
      marker_ptr m;
      for (int attempt = 0; attempt < drain_record_attempts; ++attempt) {
        m = on_device(device, [&] { return record(device, s); });
        if (failed_at_once(m).ok()) break;
      }
      m->on_complete([shared](absl::Status) {
        if (shared->left.fetch_sub(1) == 1) shared->done();
      });
    }
  }

  // Makes `s` wait on the device for `m`, a marker of this context still
  // pending. Returns false when `m` is not one (or no longer pending).
  bool wait_for(int device, cuda::stream_t s, const completion_marker* m, absl::Status& status) {
    std::lock_guard lock(live_mutex_);  // the event is not recycled meanwhile
    auto it = live_.find(m);
    if (it == live_.end()) return false;
    const error err =
        on_device(device, [&] { return api_->stream_wait_event(s, it->second.event); });
    if (err != error::success) status = cuda::to_status(err, "cudaStreamWaitEvent", device);
    return true;
  }

  // Makes `waiter` hold until `signaller` reaches this point; no host wait.
  absl::Status order_after(int device, cuda::stream_t waiter, cuda::stream_t signaller) {
    absl::StatusOr<cuda::event_t> e = take_event(device);
    if (!e.ok()) return e.status();
    const auto [rec, wait] = on_device(device, [&] {
      const error r = api_->event_record(*e, signaller);
      return std::pair{r, r == error::success ? api_->stream_wait_event(waiter, *e) : r};
    });
    // A wait captures the event as recorded: the event can be reused now.
    give_event(device, *e);
    if (rec != error::success) return cuda::to_status(rec, "cudaEventRecord", device);
    if (wait != error::success) return cuda::to_status(wait, "cudaStreamWaitEvent", device);
    return absl::OkStatus();
  }

  // Returns once the reactor has finished the round of callbacks it was in
  // at the time of the call (at once when it was between rounds).
  void quiesce() {
    if (on_reactor_thread()) return;
    std::unique_lock lock(reactor_mutex_);
    const std::uint64_t target = rounds_started_;
    round_done_.wait(lock, [&] { return rounds_finished_ >= target || stop_; });
  }

  // Calls `done(status)` on the reactor thread when `e` completes, then
  // returns `e` to the pool.
  void watch(int device, cuda::event_t e, std::function<void(absl::Status)> done) {
    {
      std::lock_guard lock(reactor_mutex_);
      watched_.push_back({device, e, std::move(done)});
    }
    reactor_wake_.notify_one();
  }

  // Pinned staging chunks: handed out in arrival order, allocated on first
  // use, never more than options_.staging_chunks.
  void take_chunk(std::function<void(absl::StatusOr<void*>)> granted) {
    absl::Status failure;
    void* chunk = nullptr;
    {
      std::lock_guard lock(chunks_mutex_);
      if (chunks_.empty()) {
        // Pinned on first use; a failure leaves the pool empty for a retry.
        for (int i = 0; i < options_.staging_chunks && failure.ok(); ++i) {
          void* p = nullptr;
          if (error err = api_->malloc_host(&p, options_.staging_chunk_bytes);
              err != error::success) {
            failure = cuda::to_status(err, "cudaMallocHost", -1);
          } else {
            chunks_.push_back(p);
          }
        }
        if (!failure.ok()) {
          // A chunk whose free fails too (a failed context) is freed again
          // at teardown rather than lost.
          for (void* p : chunks_) {
            if (api_->free_host(p) != error::success) unfreed_chunks_.push_back(p);
          }
          chunks_.clear();
        } else {
          free_chunks_ = chunks_;
        }
      }
      if (failure.ok()) {
        if (free_chunks_.empty()) {
          chunk_waiters_.push_back(std::move(granted));
          return;
        }
        chunk = free_chunks_.back();
        free_chunks_.pop_back();
        note_chunks_in_flight();
      }
    }
    if (!failure.ok()) return granted(failure);
    granted(chunk);
  }

  void give_chunk(void* chunk) {
    std::function<void(absl::StatusOr<void*>)> next;
    {
      std::lock_guard lock(chunks_mutex_);
      if (chunk_waiters_.empty()) {
        free_chunks_.push_back(chunk);
        return;
      }
      next = std::move(chunk_waiters_.front());
      chunk_waiters_.pop_front();
    }
    next(chunk);
  }

  cuda_backend_stats stats() const {
    std::lock_guard lock(stats_mutex_);
    return stats_;
  }
  void count_copy(bool pipelined) {
    std::lock_guard lock(stats_mutex_);
    (pipelined ? stats_.pipelined_copies : stats_.direct_copies) += 1;
  }
  void gathers(int delta) {
    std::lock_guard lock(stats_mutex_);
    gathers_ += delta;
    stats_.peak_concurrent_gathers = std::max(stats_.peak_concurrent_gathers, gathers_);
  }

 private:
  struct watched {
    int device;
    cuda::event_t event;
    std::function<void(absl::Status)> done;
    error first_error = error::success;  // a failed query, kept for the end
    int failures = 0;                    // failed queries in a row
  };
  struct live_event {
    int device;
    cuda::event_t event;
  };
  struct device_state {
    std::vector<cuda::stream_t> streams;
    std::vector<cuda::stream_t> staging;
    std::vector<cuda::event_t> free_events;
  };

  void note_chunks_in_flight() {
    const int in_flight = static_cast<int>(chunks_.size() - free_chunks_.size());
    std::lock_guard lock(stats_mutex_);
    stats_.peak_chunks_in_flight = std::max(stats_.peak_chunks_in_flight, in_flight);
  }

  // The reactor: queries the watched events; spins briefly while work is
  // pending, then naps; sleeps when nothing is watched.
  void poll() {
    int idle_rounds = 0;
    while (true) {
      std::vector<watched> batch;
      {
        std::unique_lock lock(reactor_mutex_);
        reactor_wake_.wait(lock, [this] { return stop_ || !watched_.empty(); });
        if (stop_) return;  // only after every import has finished
        batch.swap(watched_);
        ++rounds_started_;
      }
      std::vector<watched> pending;
      bool progressed = false;
      for (watched& w : batch) {
        const error err = api_->event_query(w.event);
        if (err == error::not_ready) {
          w.failures = 0;
          pending.push_back(std::move(w));
          continue;
        }
        if (err != error::success) {
          // A failed query does not say the work is done: ask again, and
          // report the error once the event completes. Only an error that
          // persists (a failed context, whose work never runs) ends the
          // watch at once.
          if (w.first_error == error::success) w.first_error = err;
          if (++w.failures < persistent_query_failures) {
            pending.push_back(std::move(w));
            continue;
          }
        }
        progressed = true;
        give_event(w.device, w.event);
        w.done(
            w.first_error == error::success
                ? absl::OkStatus()
                : cuda::to_status(w.first_error, "a stream operation (cudaEventQuery)", w.device));
      }
      {
        std::lock_guard lock(reactor_mutex_);
        watched_.insert(watched_.begin(), std::make_move_iterator(pending.begin()),
                        std::make_move_iterator(pending.end()));
        ++rounds_finished_;
      }
      round_done_.notify_all();
      if (progressed) {
        idle_rounds = 0;
      } else if (++idle_rounds > 64) {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      } else {
        std::this_thread::yield();
      }
    }
  }

  std::shared_ptr<cuda::api> api_;
  cuda_backend_options options_;
  std::vector<device_state> devices_;
  std::mutex events_mutex_;

  std::mutex live_mutex_;
  std::unordered_map<const completion_marker*, live_event> live_;

  std::mutex reactor_mutex_;
  std::condition_variable reactor_wake_;
  std::vector<watched> watched_;
  bool stop_ = false;
  // Rounds of polling and callbacks, for quiesce().
  std::uint64_t rounds_started_ = 0;
  std::uint64_t rounds_finished_ = 0;
  std::condition_variable round_done_;
  std::thread reactor_;

  std::mutex chunks_mutex_;
  std::vector<void*> chunks_;
  std::vector<void*> free_chunks_;
  std::vector<void*> unfreed_chunks_;
  std::vector<std::pair<int, void*>> unfreed_memory_;
  std::deque<std::function<void(absl::StatusOr<void*>)>> chunk_waiters_;

  mutable std::mutex stats_mutex_;
  cuda_backend_stats stats_;
  int gathers_ = 0;
};

namespace {

// A chunked transfer between pageable (or strided) host memory and compact
// device memory through pinned staging chunks. To the device: workers gather
// each chunk into pinned memory, then it travels on one of the staging
// streams while the next chunks are gathered. From the device: chunks
// travel into pinned memory, then workers copy them out. Chunks return to
// the pool when their transfer's event completes.
class pipeline : public std::enable_shared_from_this<pipeline> {
 public:
  pipeline(cuda_context& ctx, asio::thread_pool& pool, std::shared_ptr<cuda_context> keep,
           int device, bool to_device, const copy_job& job, const void* device_source)
      : ctx_(ctx),
        pool_(pool),
        keep_(std::move(keep)),
        device_(device),
        to_device_(to_device),
        control_(job.control),
        piece_(piece_bytes(job.layout, ctx.options().staging_chunk_bytes)),
        copy_(job.layout, piece_),
        host_src_(job.source),
        device_src_(static_cast<const char*>(device_source)),
        dst_(static_cast<char*>(job.destination)),
        streams_(ctx.staging(device)),
        done_(std::make_shared<completion_marker>()) {
    // Pieces of whole units up to the piece size (a unit larger than a
    // chunk would not fit: copies here are compact or cut finely enough).
    const std::uint64_t limit = piece_;
    if (to_device_) {
      std::int64_t begin = 0;
      const std::int64_t units = copy_.units();
      while (begin < units) {
        std::int64_t end = begin + 1;
        while (end < units && copy_.dst_offset(end + 1) - copy_.dst_offset(begin) <= limit) ++end;
        ranges_.push_back({begin, end});
        begin = end;
      }
    } else {
      for (std::uint64_t at = 0; at < copy_.bytes(); at += limit) {
        ranges_.push_back({static_cast<std::int64_t>(at),
                           static_cast<std::int64_t>(std::min(at + limit, copy_.bytes()))});
      }
    }
  }

  // What one chunk carries: a whole chunk, but a transfer of less than
  // min_pieces chunks is cut into min_pieces pieces (of 256 KiB at least),
  // so that gathering, the link and the copy out overlap for it too: with
  // one piece they would take turns.
  // Gathers up to this size run on the thread that got the chunk (the
  // importing thread, or the reactor handing a chunk back).
  static constexpr std::uint64_t inline_gather_bytes = 64 << 10;

  static std::uint64_t piece_bytes(const strided_layout& layout, std::uint64_t chunk) {
    constexpr std::uint64_t min_pieces = 8;
    std::uint64_t bytes = layout.element_size;
    for (std::int64_t e : layout.shape) bytes *= static_cast<std::uint64_t>(e);
    return std::clamp<std::uint64_t>(bytes / min_pieces, std::min<std::uint64_t>(256 << 10, chunk),
                                     chunk);
  }

  marker_ptr done() const { return done_; }
  bool fits() const {
    if (!to_device_) return true;
    for (const auto& [begin, end] : ranges_) {
      if (bytes_of(begin, end) > ctx_.options().staging_chunk_bytes) return false;
    }
    return true;
  }

  // `after`: the stream whose work (allocation, producer wait, gather) the
  // transfers must follow; when done, it follows the transfers.
  void start(cuda::stream_t after) {
    after_ = after;
    // A transfer of one piece has nothing to overlap: it travels on the
    // import's own stream, which spares ordering the staging streams after
    // it and it after them (an event and a wait each way, per stream).
    if (ranges_.size() == 1) streams_.assign(1, after);
    for (cuda::stream_t s : streams_) {
      if (s == after) continue;
      if (absl::Status st = ctx_.order_after(device_, s, after); !st.ok()) fail(st);
    }
    remaining_ = ranges_.size();
    if (ranges_.empty()) return finish();
    const std::size_t first = std::min<std::size_t>(
        ranges_.size(), static_cast<std::size_t>(ctx_.options().staging_chunks));
    for (std::size_t i = 0; i < first; ++i) request();
  }

 private:
  std::uint64_t bytes_of(std::int64_t begin, std::int64_t end) const {
    return to_device_ ? copy_.dst_offset(end) - copy_.dst_offset(begin)
                      : static_cast<std::uint64_t>(end - begin);
  }

  void request() {
    if (failed()) {
      // Gives up on every range not yet taken. No chunk is needed for that;
      // waiting for one could wait for chunks that failed transfers hold
      // until their streams drain.
      while (next_.fetch_add(1) < ranges_.size()) finish_one();
      return;
    }
    ctx_.take_chunk([self = shared_from_this()](absl::StatusOr<void*> chunk) {
      self->on_chunk(std::move(chunk));
    });
  }

  bool failed() {
    std::lock_guard lock(mutex_);
    return !status_.ok();
  }

  bool stopped() {
    if (control_ && control_->cancel_requested.load(std::memory_order_acquire)) {
      control_->aborted.store(true, std::memory_order_release);
      return true;
    }
    std::lock_guard lock(mutex_);
    return !status_.ok();
  }

  void on_chunk(absl::StatusOr<void*> chunk) {
    const std::size_t k = next_.fetch_add(1);
    if (k >= ranges_.size()) {
      if (chunk.ok()) ctx_.give_chunk(*chunk);
      return;
    }
    if (!chunk.ok()) fail(chunk.status());
    if (!chunk.ok() || stopped()) {
      if (chunk.ok()) ctx_.give_chunk(*chunk);
      request();
      return finish_one();
    }
    if (to_device_) {
      // A small gather costs less than the hop to a worker and back.
      const auto [begin, end] = ranges_[k];
      if (bytes_of(begin, end) <= inline_gather_bytes) return gather_and_send(k, *chunk);
      asio::post(pool_,
                 [self = shared_from_this(), k, c = *chunk] { self->gather_and_send(k, c); });
    } else {
      receive(k, *chunk);
    }
  }

  void gather_and_send(std::size_t k, void* chunk) {
    // Named copies, not a structured binding: lambdas capture them (C++20
    // allows capturing bindings, clang before 16 does not).
    const std::int64_t begin = ranges_[k].first;
    const std::int64_t end = ranges_[k].second;
    ctx_.gathers(1);
    copy_.run(host_src_, chunk, begin, end, copy_.dst_offset(begin));
    ctx_.gathers(-1);
    const std::uint64_t offset = copy_.dst_offset(begin);
    cuda::stream_t s = streams_[k % streams_.size()];
    const error err = ctx_.on_device(device_, [&] {
      return ctx_.api().memcpy_async(dst_ + offset, chunk, bytes_of(begin, end),
                                     cuda::memcpy_kind::host_to_device, s);
    });
    if (err != error::success)
      return chunk_failed(chunk, cuda::to_status(err, "cudaMemcpyAsync", device_));
    ctx_.record(device_, s)->on_complete([self = shared_from_this(), chunk, s](absl::Status st) {
      if (!st.ok()) {
        self->fail(st);
        self->return_after(s, chunk);
      } else {
        self->ctx_.give_chunk(chunk);
      }
      self->request();
      self->finish_one();  // last: it may complete the import
    });
  }

  void receive(std::size_t k, void* chunk) {
    // Named copies, not a structured binding: lambdas capture them (C++20
    // allows capturing bindings, clang before 16 does not).
    const std::int64_t begin = ranges_[k].first;
    const std::int64_t end = ranges_[k].second;
    cuda::stream_t s = streams_[k % streams_.size()];
    const error err = ctx_.on_device(device_, [&] {
      return ctx_.api().memcpy_async(chunk, device_src_ + begin, bytes_of(begin, end),
                                     cuda::memcpy_kind::device_to_host, s);
    });
    if (err != error::success)
      return chunk_failed(chunk, cuda::to_status(err, "cudaMemcpyAsync", device_));
    ctx_.record(device_, s)->on_complete([self = shared_from_this(), k, chunk, s](absl::Status st) {
      if (!st.ok()) {
        self->fail(st);
        self->return_after(s, chunk);
        self->request();
        return self->finish_one();
      }
      asio::post(self->pool_, [self, k, chunk] {
        const auto [begin, end] = self->ranges_[k];
        std::memcpy(self->dst_ + begin, chunk, static_cast<std::size_t>(end - begin));
        self->ctx_.give_chunk(chunk);
        self->request();
        self->finish_one();
      });
    });
  }

  // A chunk whose transfer could not be tracked goes back to the pool once
  // its stream has run what it holds: the copy may still be queued there.
  void return_after(cuda::stream_t s, void* chunk) {
    ctx_.drain({{device_, s}},
               [self = shared_from_this(), chunk] { self->ctx_.give_chunk(chunk); });
  }

  void chunk_failed(void* chunk, absl::Status st) {
    fail(std::move(st));
    ctx_.give_chunk(chunk);
    request();
    finish_one();
  }

  void fail(absl::Status st) {
    std::lock_guard lock(mutex_);
    if (status_.ok()) status_ = std::move(st);
  }

  void finish_one() {
    if (remaining_.fetch_sub(1) == 1) finish();
  }

  void finish() {
    // Later work on the import's stream (frees, consumers) follows the
    // transfers.
    for (cuda::stream_t s : streams_) {
      if (s == after_) continue;
      if (absl::Status st = ctx_.order_after(device_, after_, s); !st.ok()) fail(st);
    }
    absl::Status st;
    {
      std::lock_guard lock(mutex_);
      st = status_;
    }
    const bool cancelled = control_ && control_->aborted.load(std::memory_order_acquire);
    if (st.ok() && !cancelled) return done_->complete(std::move(st));
    // After an error or a cancellation, work enqueued before it (a gather
    // kernel reading the source, copies) may still run: the import releases
    // the destination, the source and temporary buffers only once the
    // streams have run them.
    std::vector<std::pair<int, cuda::stream_t>> used{{device_, after_}};
    for (cuda::stream_t s : streams_) {
      if (s != after_) used.emplace_back(device_, s);
    }
    ctx_.drain(std::move(used),
               [self = shared_from_this(), st = std::move(st)] { self->done_->complete(st); });
  }

  cuda_context& ctx_;
  asio::thread_pool& pool_;
  std::shared_ptr<cuda_context> keep_;
  const int device_;
  const bool to_device_;
  std::shared_ptr<copy_control> control_;
  const std::uint64_t piece_;  // bytes a chunk carries, at most
  strided_copy copy_;
  const void* host_src_;
  const char* device_src_;
  char* dst_;
  std::vector<cuda::stream_t> streams_;
  std::vector<std::pair<std::int64_t, std::int64_t>> ranges_;
  cuda::stream_t after_ = nullptr;
  std::atomic<std::size_t> next_{0};
  std::atomic<std::size_t> remaining_{0};
  std::mutex mutex_;
  absl::Status status_;
  marker_ptr done_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<cuda_backend>> cuda_backend::create(std::shared_ptr<cuda::api> api,
                                                                   cuda_backend_options options,
                                                                   asio::thread_pool& pool) {
  int count = 0;
  DLASYNC_CUDA_RETURN_IF_ERROR("cudaGetDeviceCount", -1, api->get_device_count(&count));
  for (int d = 0; d < count; ++d) {
    for (int peer = 0; peer < count; ++peer) {
      int can = 0;
      if (peer != d && api->device_can_access_peer(&can, d, peer) == error::success && can) {
        api->set_device(d);
        api->device_enable_peer_access(peer);  // best effort: copies work without it
      }
    }
  }
  // The last reference may drop inside a reactor callback (a pipeline that
  // outlives the runtime by a moment): then the context, which joins the
  // reactor thread, is destroyed on a thread of its own.
  std::shared_ptr<cuda_context> context(new cuda_context(std::move(api), options, count),
                                        [](cuda_context* c) {
                                          if (c->on_reactor_thread()) {
                                            std::thread([c] { delete c; }).detach();
                                          } else {
                                            delete c;
                                          }
                                        });
  if (absl::Status s = context->start(); !s.ok()) return s;
  return std::unique_ptr<cuda_backend>(new cuda_backend(std::move(context), pool));
}

cuda_backend::cuda_backend(std::shared_ptr<cuda_context> context, asio::thread_pool& pool)
    : context_(std::move(context)), pool_(pool) {}

cuda_backend::~cuda_backend() = default;

const char* cuda_backend::name() const noexcept {
  return context_->api().simulated() ? "cuda (simulated)" : "cuda";
}

std::vector<served_devices> cuda_backend::served() const {
  // Managed memory is read in place (views on its GPU) or copied from; the
  // backend never places copies there.
  return {{name(), device_kind::cuda, context_->device_count(), true},
          {name(), device_kind::cuda_managed, context_->device_count(), false}};
}

int cuda_backend::stream_count(device) const noexcept {
  return context_->options().streams_per_device;
}

int cuda_backend::device_count() const noexcept {
  return context_->device_count();
}
cuda::api& cuda_backend::api() noexcept {
  return context_->api();
}
cuda_backend_stats cuda_backend::stats() const {
  return context_->stats();
}

absl::StatusOr<device_buffer> cuda_backend::allocate(device d, std::uint64_t bytes,
                                                     std::size_t alignment, stream_ref s) {
  if (bytes == 0) return device_buffer(d, nullptr, 0, nullptr);
  cuda::stream_t stream = context_->stream(d.ordinal, s.index);
  // Pools hand out 256-byte aligned blocks; more is asked of by padding.
  const std::uint64_t pad = alignment > 256 ? alignment : 0;
  void* base = nullptr;
  const error err = context_->on_device(
      d.ordinal, [&] { return context_->api().malloc_async(&base, bytes + pad, stream); });
  if (err != error::success) return cuda::to_status(err, "cudaMallocAsync", d.ordinal);
  auto address = reinterpret_cast<std::uintptr_t>(base);
  if (pad != 0) address = (address + alignment - 1) / alignment * alignment;
  return device_buffer(
      d, reinterpret_cast<void*>(address), bytes,
      [context = context_, base, stream, ordinal = d.ordinal](void*, std::uint64_t) {
        context->release_memory(ordinal, base, stream);
      });
}

marker_ptr cuda_backend::enqueue_copy(stream_ref s, copy_job job) {
  const int device = s.device.ordinal;
  cuda::stream_t stream = context_->stream(device, s.index);
  cuda::api& api = context_->api();
  const bool source_on_device = job.source_device.kind == device_kind::cuda ||
                                job.source_device.kind == device_kind::cuda_managed;
  const bool target_on_device = job.target_device.kind == device_kind::cuda;
  const int source_device = job.source_device.ordinal;

  // Reads of the source follow the producer's stream, on the device: the
  // stream of the source's GPU, or for pinned host memory one of the GPU
  // that copies.
  if (job.producer_stream != no_producer_stream) {
    const auto producer = reinterpret_cast<cuda::stream_t>(job.producer_stream);
    const int producer_device = source_on_device ? source_device : device;
    if (absl::Status st = context_->order_after(producer_device, stream, producer); !st.ok()) {
      return done_marker(st);
    }
  }

  const std::uint64_t bytes = strided_copy(job.layout).bytes();
  if (bytes == 0) return record(s);
  const bool compact = is_compact(job.layout);

  // Device-side copies and compact pinned uploads: one operation.
  cuda::pointer_attributes source_attributes;
  api.pointer_get_attributes(&source_attributes, job.source);
  const bool pinned_source = source_attributes.type == cuda::memory_type::host;
  if (target_on_device && (source_on_device || (pinned_source && compact))) {
    context_->count_copy(false);
    absl::Status status = context_->on_device(device, [&]() -> absl::Status {
      if (compact) {
        DLASYNC_CUDA_RETURN_IF_ERROR(
            "cudaMemcpyAsync", device,
            api.memcpy_async(job.destination, job.source, bytes, cuda::memcpy_kind::any, stream));
        return absl::OkStatus();
      }
      if (source_device == device) {
        DLASYNC_CUDA_RETURN_IF_ERROR(
            "dlasync gather kernel", device,
            api.launch_gather(job.destination, job.source, job.layout, stream));
        return absl::OkStatus();
      }
      // Strided on another device: compact it there, then copy across.
      cuda::stream_t there = context_->stream(source_device, s.index);
      void* temp = nullptr;
      absl::Status st = context_->on_device(source_device, [&]() -> absl::Status {
        DLASYNC_CUDA_RETURN_IF_ERROR("cudaMallocAsync", source_device,
                                     api.malloc_async(&temp, bytes, there));
        if (absl::Status o = context_->order_after(source_device, there, stream); !o.ok()) {
          return o;
        }
        DLASYNC_CUDA_RETURN_IF_ERROR("dlasync gather kernel", source_device,
                                     api.launch_gather(temp, job.source, job.layout, there));
        return context_->order_after(source_device, stream, there);
      });
      if (st.ok()) {
        const error copied =
            api.memcpy_async(job.destination, temp, bytes, cuda::memcpy_kind::any, stream);
        if (copied != error::success) st = cuda::to_status(copied, "cudaMemcpyAsync", device);
      }
      if (!st.ok()) {
        // Whatever was enqueued on `there` is ordered before the free.
        if (temp != nullptr) context_->release_memory(source_device, temp, there);
        return st;
      }
      return context_->on_device(source_device, [&]() -> absl::Status {
        if (absl::Status o = context_->order_after(source_device, there, stream); !o.ok()) return o;
        DLASYNC_CUDA_RETURN_IF_ERROR("cudaFreeAsync", source_device,
                                     context_->release_memory(source_device, temp, there));
        return absl::OkStatus();
      });
    });
    marker_ptr copied = status.ok() ? record(s) : nullptr;
    if (copied != nullptr) status = failed_at_once(copied);
    if (status.ok()) return copied;
    // Part of the work may be enqueued (a gather reading the source on its
    // GPU): the failure is reported once the streams have run it, so that
    // the import releases the source and the destination only then.
    std::vector<std::pair<int, cuda::stream_t>> used{{device, stream}};
    if (source_on_device && source_device != device) {
      used.emplace_back(source_device, context_->stream(source_device, s.index));
    }
    auto failed = std::make_shared<completion_marker>();
    // The callback holds the context: its reactor must outlive the drain.
    context_->drain(std::move(used),
                    [failed, status, context = context_] { failed->complete(status); });
    return failed;
  }

  context_->count_copy(true);
  if (target_on_device) {
    // Host to device through pinned staging chunks.
    auto p = std::make_shared<pipeline>(*context_, pool_, context_, device, true, job, nullptr);
    if (!p->fits()) {
      return done_marker(absl::UnimplementedError(
          "a single row of this strided source is larger than a staging chunk; raise "
          "runtime_options::staging_chunk_bytes or make the source contiguous first"));
    }
    context_->on_device(device, [&] {
      p->start(stream);
      return 0;
    });
    return p->done();
  }

  // Device to host: compact on the device first when strided, then stream
  // the compact bytes out through staging chunks.
  const void* compact_source = job.source;
  void* temp = nullptr;
  if (!compact) {
    absl::Status st = context_->on_device(device, [&]() -> absl::Status {
      DLASYNC_CUDA_RETURN_IF_ERROR("cudaMallocAsync", device,
                                   api.malloc_async(&temp, bytes, stream));
      DLASYNC_CUDA_RETURN_IF_ERROR("dlasync gather kernel", device,
                                   api.launch_gather(temp, job.source, job.layout, stream));
      return absl::OkStatus();
    });
    if (!st.ok()) {
      if (temp != nullptr) context_->release_memory(device, temp, stream);
      return done_marker(st);
    }
    compact_source = temp;
  }
  copy_job out = job;
  out.layout = strided_layout{1, {static_cast<std::int64_t>(bytes)}, {1}};
  auto p =
      std::make_shared<pipeline>(*context_, pool_, context_, device, false, out, compact_source);
  context_->on_device(device, [&] {
    p->start(stream);
    return 0;
  });
  if (temp == nullptr) return p->done();
  auto freed = std::make_shared<completion_marker>();
  p->done()->on_complete([context = context_, temp, stream, device, freed](absl::Status st) {
    context->release_memory(device, temp, stream);
    freed->complete(std::move(st));
  });
  return freed;
}

marker_ptr cuda_backend::record(stream_ref s) {
  const int device = s.device.ordinal;
  cuda::stream_t stream = context_->stream(device, s.index);
  return context_->on_device(device, [&] { return context_->record(device, stream); });
}

absl::Status cuda_backend::wait(stream_ref s, marker_ptr m) {
  if (m->done()) return absl::OkStatus();
  absl::Status status;
  if (context_->wait_for(s.device.ordinal, context_->stream(s.device.ordinal, s.index), m.get(),
                         status)) {
    return status;
  }
  if (m->done()) return absl::OkStatus();
  // A device stream cannot wait on a host condition without blocking it.
  return absl::UnimplementedError(
      absl::StrCat("stream ", s.index, " of ", s.device.name(),
                   " cannot wait on the device for a marker of another backend; wait on the host"));
}

absl::StatusOr<std::optional<device>> cuda_backend::device_of(const void* pointer) const {
  cuda::pointer_attributes a;
  if (const error e = context_->api().pointer_get_attributes(&a, pointer); e != error::success) {
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

absl::Status cuda_backend::order_consumer(device d, std::int64_t consumer_stream,
                                          const marker_ptr& m) {
  if (m->done()) return absl::OkStatus();
  const auto consumer = reinterpret_cast<cuda::stream_t>(consumer_stream);
  absl::Status status;
  if (context_->wait_for(d.ordinal, consumer, m.get(), status)) return status;
  if (m->done()) return absl::OkStatus();
  return absl::UnimplementedError(
      "this transfer finishes on the host (a staging pipeline): the import resumes when the "
      "data is ready instead");
}

void cuda_backend::quiesce() {
  context_->quiesce();
}

marker_ptr cuda_backend::record_producer(device d, std::int64_t producer_stream) {
  if (producer_stream == no_producer_stream) return done_marker(absl::OkStatus());
  const auto producer = reinterpret_cast<cuda::stream_t>(producer_stream);
  return context_->on_device(d.ordinal, [&] { return context_->record(d.ordinal, producer); });
}

}  // namespace dlasync::detail
