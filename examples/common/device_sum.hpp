// Example support: the computation the examples run on imported tensors.
//
// `device_sum` adds up the elements of a compact tensor wherever it lives:
//   - host memory: a loop on the calling thread;
//   - a real GPU: a CUDA kernel on one of this object's streams;
//   - a simulated GPU: a host function enqueued on that stream, so it runs
//     in stream order like a kernel would.
// The streams are dlasync::gpu_stream objects, waited for without blocking
// a thread (gpu_stream::async_wait).
// On a GPU the sum follows the import on the device: the import names the
// stream from `stream_for` as its consumer stream, resumes as soon as its
// copy is enqueued, and the sum is enqueued behind it with no host round
// trip. The coroutine resumes when the sum is done.
//
// Thread safety: all members are safe to call from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "asio/awaitable.hpp"
#include "dlasync/dlasync.hpp"

namespace dlasync::examples {

// True for the dtypes the examples sum: float32/64, int32/64, uint8.
bool summable(dtype t) noexcept;

// The sum of `count` elements of `type` at `data` (host memory), in double.
double host_sum(const void* data, dtype type, std::int64_t count) noexcept;

class device_sum {
 public:
  // `streams_per_gpu` consumer streams on each GPU of `rt`, taken in turn.
  static absl::StatusOr<std::unique_ptr<device_sum>> create(runtime& rt, int streams_per_gpu = 4);
  ~device_sum();

  // The stream (DLPack encoding) that an import onto `d` should name as its
  // consumer stream, and that `sum` must then be given; empty for host
  // devices.
  std::optional<std::int64_t> stream_for(device d);

  // The sum of the compact tensor `t`. For a GPU tensor, `stream` is the
  // one its import ordered (from `stream_for`); `t` must stay alive until
  // this resumes. InvalidArgument for a dtype that `summable` refuses or a
  // tensor that is not compact; a CUDA failure as its Status.
  asio::awaitable<absl::StatusOr<double>> sum(const tensor& t, std::optional<std::int64_t> stream);

 private:
  explicit device_sum(runtime& rt) : rt_(rt) {}
  absl::StatusOr<double*> take_slot();
  void return_slot(double* slot);

  // The stream of GPU `d` whose DLPack value is `value`, or nullptr.
  gpu_stream* find_stream(device d, std::int64_t value);

  runtime& rt_;
  std::vector<std::vector<gpu_stream>> streams_;  // per GPU ordinal
  std::mutex mutex_;
  std::vector<std::size_t> next_stream_;
  std::vector<device_buffer> slot_blocks_;  // page-locked blocks of result slots
  std::vector<double*> free_slots_;
};

}  // namespace dlasync::examples
