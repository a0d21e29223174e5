// The CUDA backend (internal): the GPUs of the real CUDA runtime, or of the
// simulated one, as the runtime's backend. It serves `cuda` (device memory,
// which imports allocate stream-ordered) and `cuda_managed` (read in place
// or copied from, never allocated by imports), and it holds the CUDA
// context that GPU transfers (transfer/src/copy/) run on.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/src/backend.hpp"
#include "runtime/src/cuda/cuda_api.hpp"
#include "runtime/src/cuda/cuda_context.hpp"

namespace dlasync::detail {

class cuda_backend final : public backend {
 public:
  // Discovers the GPUs of `api` and serves those `owns` says this process
  // owns: only their contexts are opened, peer and pool access are granted
  // only between them (where the devices allow it), and only they get
  // streams. The caller's current device is left as it was.
  static absl::StatusOr<std::unique_ptr<cuda_backend>> create(std::shared_ptr<cuda::api> api,
                                                              const cuda_options& options,
                                                              const std::function<bool(int)>& owns);
  ~cuda_backend() override;

  const char* name() const noexcept override;
  std::vector<served_devices> served() const override;
  // Stream-ordered device memory on stream `s` of `d` (a cuda device), or
  // page-locked host memory when `d` is cuda_host (allocate_pinned).
  absl::StatusOr<device_buffer> allocate(device d, std::uint64_t bytes, std::size_t alignment,
                                         stream_slot s,
                                         const free_stream_cell& free_stream) override;
  // Page-locked host memory (cudaMallocHost) for a cuda_host target,
  // aligned to `alignment`; freed at once when the buffer goes (nothing
  // stream-ordered writes it).
  absl::StatusOr<device_buffer> allocate_pinned(device d, std::uint64_t bytes,
                                                std::size_t alignment);

  void quiesce() override { context_->quiesce(); }

  // Memory for the caller (runtime::allocate): device memory usable on any
  // stream (cudaMalloc) on a cuda device, page-locked host memory on
  // cuda_host.
  absl::StatusOr<device_buffer> allocate_unordered(device d, std::uint64_t bytes);

  cuda_context& context() noexcept { return *context_; }
  // The context, for work that must keep it alive (pipelines, drains).
  const std::shared_ptr<cuda_context>& shared_context() const noexcept { return context_; }
  int device_count() const noexcept { return context_->device_count(); }

 private:
  explicit cuda_backend(std::shared_ptr<cuda_context> context) : context_(std::move(context)) {}

  std::shared_ptr<cuda_context> context_;
};

}  // namespace dlasync::detail
