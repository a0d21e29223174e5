// The staging pipeline (internal): a chunked transfer between pageable (or
// strided) host memory and compact device memory through the runtime's
// pinned chunks. To the device, workers gather each chunk into pinned
// memory, then it travels on one of the staging streams while the next
// chunks are gathered. From the device, chunks travel into pinned memory,
// then workers copy them out. Chunks return to the pool when their
// transfer's event completes.
//
// A transfer of one piece has nothing to overlap: it travels on the
// import's own stream, which spares ordering the staging streams after it
// and it after them.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "runtime/src/completion_marker.hpp"
#include "runtime/src/cuda/cuda_context.hpp"
#include "runtime/src/work_pool.hpp"
#include "transfer/src/copy/transfer_path.hpp"
#include "transfer/src/kernels/strided_copy.hpp"

namespace dlasync::detail {

class staging_pipeline : public std::enable_shared_from_this<staging_pipeline> {
 public:
  // To the device: `request.from` (host, read as `request.layout`) into
  // `request.to` on `device`.
  static std::shared_ptr<staging_pipeline> upload(std::shared_ptr<cuda_context> context,
                                                  work_pool& pool, int device,
                                                  const copy_request& request);
  // From the device: the compact `request.bytes` at `device_source` on
  // `device` into `request.to` (host).
  static std::shared_ptr<staging_pipeline> download(std::shared_ptr<cuda_context> context,
                                                    work_pool& pool, int device,
                                                    const copy_request& request,
                                                    const void* device_source);

  // Completes with the transfer's status; after an error or a cancellation
  // only once the streams it used have drained.
  marker_ptr done() const { return done_; }

  // `after`: the stream whose work (allocation, producer wait, gather) the
  // transfers must follow; when done, it follows the transfers.
  void start(cuda::stream_t after);

 private:
  staging_pipeline(std::shared_ptr<cuda_context> context, work_pool& pool, int device,
                   bool to_device, const copy_request& request, const void* device_source);

  std::uint64_t bytes_of(std::int64_t begin, std::int64_t end) const;
  void request_chunk();
  bool failed();
  bool stopped();
  void on_chunk(absl::StatusOr<void*> chunk);
  void gather_and_send(std::size_t k, void* chunk);
  void receive(std::size_t k, void* chunk);
  void return_after(cuda::stream_t s, void* chunk);
  void chunk_failed(void* chunk, absl::Status st);
  void fail(absl::Status st);
  void finish_one();
  void finish();
  // The copy the pipeline's device work is tagged with.
  std::uint64_t owner() const noexcept { return control_ ? control_->owner : 0; }

  std::shared_ptr<cuda_context> context_;
  cuda_context& ctx_;
  work_pool& pool_;
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

}  // namespace dlasync::detail
