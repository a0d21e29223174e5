// dlasync/device_buffer.hpp
//
// `dlasync::device_buffer` owns one allocation on one device and frees it,
// through the function its backend gave, when destroyed. Move-only.
//
// Thread safety: distinct objects are safe; a shared object is unsafe.
#pragma once

#include <cstdint>
#include <utility>

#include "absl/functional/any_invocable.h"
#include "dlasync/device.hpp"

namespace dlasync {

class device_buffer {
 public:
  using release_fn = absl::AnyInvocable<void(void* data, std::uint64_t bytes) &&>;

  device_buffer() noexcept = default;
  device_buffer(dlasync::device d, void* data, std::uint64_t bytes, release_fn release) noexcept
      : device_(d), data_(data), bytes_(bytes), release_(std::move(release)) {}
  device_buffer(device_buffer&& other) noexcept
      : device_(other.device_),
        data_(std::exchange(other.data_, nullptr)),
        bytes_(std::exchange(other.bytes_, 0)),
        release_(std::move(other.release_)) {}
  device_buffer& operator=(device_buffer&& other) noexcept {
    if (this != &other) {
      reset();
      device_ = other.device_;
      data_ = std::exchange(other.data_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
      release_ = std::move(other.release_);
    }
    return *this;
  }
  ~device_buffer() { reset(); }

  dlasync::device device() const noexcept { return device_; }
  void* data() const noexcept { return data_; }
  std::uint64_t bytes() const noexcept { return bytes_; }

  void reset() noexcept {
    if (release_) std::move(release_)(std::exchange(data_, nullptr), std::exchange(bytes_, 0));
    release_ = nullptr;
  }

 private:
  dlasync::device device_;
  void* data_ = nullptr;
  std::uint64_t bytes_ = 0;
  release_fn release_;
};

}  // namespace dlasync
