#include "transfer/src/copy/staging_pipeline.hpp"

#include <algorithm>
#include <cstring>

#include "runtime/src/cuda/device_guard.hpp"
#include "runtime/src/planted.hpp"

namespace dlasync::detail {
namespace {

// Gathers up to this size run on the thread that got the chunk (the
// importing thread, or the reactor handing a chunk back): they cost less
// than the hop to a worker and back.
constexpr std::uint64_t inline_gather_bytes = 64 << 10;

// Enqueues one chunk's copy on `s` of `device`.
absl::Status enqueue_copy(cuda::api& api, int device, void* dst, const void* src,
                          std::uint64_t bytes, cuda::memcpy_kind kind, cuda::stream_t s,
                          cuda::api::site where = cuda::api::site::current()) {
  absl::StatusOr<device_guard> on = device_guard::enter(api, device);
  if (!on.ok()) return on.status();
  if (const cuda::error err = api.memcpy_async(dst, src, bytes, kind, s, where);
      err != cuda::error::success) {
    return cuda::to_status(err, "cudaMemcpyAsync", device);
  }
  return absl::OkStatus();
}

}  // namespace

std::shared_ptr<staging_pipeline> staging_pipeline::upload(std::shared_ptr<cuda_context> context,
                                                           work_pool& pool, int device,
                                                           const copy_request& request) {
  return std::shared_ptr<staging_pipeline>(
      new staging_pipeline(std::move(context), pool, device, true, request, nullptr));
}

std::shared_ptr<staging_pipeline> staging_pipeline::download(std::shared_ptr<cuda_context> context,
                                                             work_pool& pool, int device,
                                                             const copy_request& request,
                                                             const void* device_source) {
  return std::shared_ptr<staging_pipeline>(
      new staging_pipeline(std::move(context), pool, device, false, request, device_source));
}

staging_pipeline::staging_pipeline(std::shared_ptr<cuda_context> context, work_pool& pool,
                                   int device, bool to_device, const copy_request& request,
                                   const void* device_source)
    : context_(std::move(context)),
      ctx_(*context_),
      pool_(pool),
      device_(device),
      to_device_(to_device),
      control_(request.control),
      piece_(staging_piece_bytes(request.bytes, ctx_.chunks().chunk_bytes())),
      copy_(request.layout, piece_),
      host_src_(request.from),
      device_src_(static_cast<const char*>(device_source)),
      dst_(static_cast<char*>(request.to)),
      streams_(ctx_.staging(device)),
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
      ranges_.emplace_back(begin, end);
      begin = end;
    }
  } else {
    for (std::uint64_t at = 0; at < copy_.bytes(); at += limit) {
      ranges_.emplace_back(static_cast<std::int64_t>(at),
                           static_cast<std::int64_t>(std::min(at + limit, copy_.bytes())));
    }
  }
}

void staging_pipeline::start(cuda::stream_t after) {
  after_ = after;
  if (ranges_.size() == 1) streams_.assign(1, after);
  for (cuda::stream_t s : streams_) {
    if (s == after || planted_mistake(planted::skip_staging_start_wait)) continue;
    if (absl::Status st = ctx_.order_after(device_, s, device_, after); !st.ok()) fail(st);
  }
  remaining_ = ranges_.size();
  if (ranges_.empty()) return finish();
  const std::size_t first =
      std::min<std::size_t>(ranges_.size(), static_cast<std::size_t>(ctx_.chunks().chunk_count()));
  for (std::size_t i = 0; i < first; ++i) request_chunk();
}

std::uint64_t staging_pipeline::bytes_of(std::int64_t begin, std::int64_t end) const {
  return to_device_ ? copy_.dst_offset(end) - copy_.dst_offset(begin)
                    : static_cast<std::uint64_t>(end - begin);
}

void staging_pipeline::request_chunk() {
  if (failed()) {
    // Gives up on every range not yet taken. No chunk is needed for that;
    // waiting for one could wait for chunks that failed transfers hold
    // until their streams drain.
    while (next_.fetch_add(1) < ranges_.size()) finish_one();
    return;
  }
  ctx_.chunks().take([self = shared_from_this()](absl::StatusOr<void*> chunk) {
    self->on_chunk(std::move(chunk));
  });
}

bool staging_pipeline::failed() {
  std::lock_guard lock(mutex_);
  return !status_.ok();
}

bool staging_pipeline::stopped() {
  if (control_ && control_->cancel_requested.load(std::memory_order_acquire)) {
    control_->aborted.store(true, std::memory_order_release);
    return true;
  }
  std::lock_guard lock(mutex_);
  return !status_.ok();
}

void staging_pipeline::on_chunk(absl::StatusOr<void*> chunk) {
  const cuda::owner_scope tagged(owner());
  const std::size_t k = next_.fetch_add(1);
  if (k >= ranges_.size()) {
    if (chunk.ok()) ctx_.chunks().give(*chunk);
    return;
  }
  if (!chunk.ok()) fail(chunk.status());
  if (!chunk.ok() || stopped()) {
    if (chunk.ok()) ctx_.chunks().give(*chunk);
    request_chunk();
    return finish_one();
  }
  if (to_device_) {
    // A small gather costs less than the hop to a worker and back.
    const auto [begin, end] = ranges_[k];
    if (bytes_of(begin, end) <= inline_gather_bytes) return gather_and_send(k, *chunk);
    pool_.post([self = shared_from_this(), k, c = *chunk] { self->gather_and_send(k, c); });
  } else {
    receive(k, *chunk);
  }
}

void staging_pipeline::gather_and_send(std::size_t k, void* chunk) {
  const cuda::owner_scope tagged(owner());
  // Named copies, not a structured binding: lambdas capture them (C++20
  // allows capturing bindings, clang before 16 does not).
  const std::int64_t begin = ranges_[k].first;
  const std::int64_t end = ranges_[k].second;
  ctx_.api().host_access(chunk, bytes_of(begin, end), cuda::host_use::write,
                         "the host fills a staging chunk");
  copy_.run(host_src_, chunk, begin, end, copy_.dst_offset(begin));
  const std::uint64_t offset = copy_.dst_offset(begin);
  cuda::stream_t s = streams_[k % streams_.size()];
  if (absl::Status st = enqueue_copy(ctx_.api(), device_, dst_ + offset, chunk,
                                     bytes_of(begin, end), cuda::memcpy_kind::host_to_device, s);
      !st.ok()) {
    return chunk_failed(chunk, std::move(st));
  }
  const bool returned = planted_mistake(planted::early_chunk_return);
  if (returned) ctx_.chunks().give(chunk);
  ctx_.record(device_, s)
      ->on_complete([self = shared_from_this(), chunk, s, returned](const absl::Status& st) {
        if (!st.ok()) {
          self->fail(st);
          if (!returned) self->return_after(s, chunk);
        } else if (!returned) {
          self->ctx_.chunks().give(chunk);
        }
        self->request_chunk();
        self->finish_one();  // last: it may complete the import
      });
}

void staging_pipeline::receive(std::size_t k, void* chunk) {
  // Named copies, not a structured binding (see gather_and_send).
  const std::int64_t begin = ranges_[k].first;
  const std::int64_t end = ranges_[k].second;
  cuda::stream_t s = streams_[k % streams_.size()];
  if (absl::Status st = enqueue_copy(ctx_.api(), device_, chunk, device_src_ + begin,
                                     bytes_of(begin, end), cuda::memcpy_kind::device_to_host, s);
      !st.ok()) {
    return chunk_failed(chunk, std::move(st));
  }
  // Copies the chunk out to the destination, on a worker.
  auto copy_out = [self = shared_from_this(), k, chunk] {
    self->pool_.post([self, k, chunk] {
      const auto [begin, end] = self->ranges_[k];
      self->ctx_.api().host_access(chunk, static_cast<std::uint64_t>(end - begin),
                                   cuda::host_use::read, "the host copies a staging chunk out");
      std::memcpy(self->dst_ + begin, chunk, static_cast<std::size_t>(end - begin));
      self->ctx_.chunks().give(chunk);
      self->request_chunk();
      self->finish_one();
    });
  };
  if (planted_mistake(planted::early_chunk_read)) return copy_out();
  ctx_.record(device_, s)
      ->on_complete([self = shared_from_this(), chunk, s, copy_out](const absl::Status& st) {
        if (!st.ok()) {
          self->fail(st);
          self->return_after(s, chunk);
          self->request_chunk();
          return self->finish_one();
        }
        copy_out();
      });
}

// A chunk whose transfer could not be tracked goes back to the pool once
// its stream has run what it holds: the copy may still be queued there.
void staging_pipeline::return_after(cuda::stream_t s, void* chunk) {
  ctx_.drain({{device_, s}},
             [self = shared_from_this(), chunk] { self->ctx_.chunks().give(chunk); });
}

void staging_pipeline::chunk_failed(void* chunk, absl::Status st) {
  fail(std::move(st));
  ctx_.chunks().give(chunk);
  request_chunk();
  finish_one();
}

void staging_pipeline::fail(absl::Status st) {
  std::lock_guard lock(mutex_);
  if (status_.ok()) status_ = std::move(st);
}

void staging_pipeline::finish_one() {
  if (remaining_.fetch_sub(1) == 1) finish();
}

void staging_pipeline::finish() {
  const cuda::owner_scope tagged(owner());
  // Later work on the import's stream (frees, consumers) follows the
  // transfers.
  for (cuda::stream_t s : streams_) {
    if (s == after_) continue;
    if (absl::Status st = ctx_.order_after(device_, after_, device_, s); !st.ok()) fail(st);
  }
  absl::Status st;
  {
    std::lock_guard lock(mutex_);
    st = status_;
  }
  const bool cancelled = control_ && control_->aborted.load(std::memory_order_acquire);
  if ((st.ok() && !cancelled) || planted_mistake(planted::skip_failure_drain)) {
    return done_->complete(st);
  }
  // After an error or a cancellation, work enqueued before it (a gather
  // kernel reading the source, copies) may still run: the import releases
  // the destination, the source and temporary buffers only once the
  // streams have run them.
  std::vector<device_stream> used{{device_, after_}};
  for (cuda::stream_t s : streams_) {
    if (s != after_) used.emplace_back(device_, s);
  }
  ctx_.drain(used, [self = shared_from_this(), st = std::move(st)] { self->done_->complete(st); });
}

}  // namespace dlasync::detail
