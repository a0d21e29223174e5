// dlasync/device.hpp
//
// A `dlasync::device` names one memory space that tensors live in: a kind
// (CPU, CUDA, pinned CUDA host memory, ...) and an ordinal within that kind.
// The kind's numbers are DLPack's device-type codes, so a device converts to
// and from `DLDevice` without a table (see dlasync/dlpack.hpp).
//
// Example:
//
//   dlasync::device gpu{dlasync::device_kind::cuda, 1};
//   std::cout << gpu;  // prints "cuda:1"
//
// Devices are plain values: cheap to copy, compare and hash.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

namespace dlasync {

// `device_kind` lists every device type DLPack defines, with DLPack's codes.
// Codes 5 and 6 are retired in DLPack and have no name here.
enum class device_kind : std::int32_t {
  cpu = 1,
  cuda = 2,
  cuda_host = 3,
  opencl = 4,
  vulkan = 7,
  metal = 8,
  vpi = 9,
  rocm = 10,
  rocm_host = 11,
  ext_dev = 12,
  cuda_managed = 13,
  oneapi = 14,
  webgpu = 15,
  hexagon = 16,
  maia = 17,
  trn = 18,
  tpu = 19,
  tpu_host = 20,
};

// Returns true when `code` is a device-type code that DLPack defines.
// (This and the two kind tests below are inline: every import asks them.)
constexpr bool is_known_device_kind(std::int32_t code) noexcept {
  return (code >= 1 && code <= 4) || (code >= 7 && code <= 20);
}

// The short lowercase name used in messages and device names ("cuda_host").
// Unknown codes give "unknown".
const char* device_kind_name(device_kind kind) noexcept;

// Returns true for the kinds whose memory the CPU of this process reads
// directly: CPU memory and pinned CUDA or ROCm host memory.
constexpr bool is_host_memory(device_kind kind) noexcept {
  return kind == device_kind::cpu || kind == device_kind::cuda_host ||
         kind == device_kind::rocm_host;
}

// Returns true for memory that lives on a CUDA GPU: device memory (`cuda`)
// and managed memory (`cuda_managed`, read in place on its GPU).
constexpr bool is_gpu_memory(device_kind kind) noexcept {
  return kind == device_kind::cuda || kind == device_kind::cuda_managed;
}

// `device` is a kind plus an ordinal within it. The ordinal is the
// `device_id` of DLPack: for CUDA the CUDA ordinal seen by this process, for
// the CPU the index of a (virtual) host device, 0 for the real one.
struct device {
  device_kind kind = device_kind::cpu;
  std::int32_t ordinal = 0;

  friend bool operator==(const device&, const device&) = default;

  // "cpu:0", "cuda:1", "cuda_host:0"; unknown kinds as "device_type_42:0".
  std::string name() const;

  template <typename H>
  friend H AbslHashValue(H h, const device& d) {
    return H::combine(std::move(h), static_cast<std::int32_t>(d.kind), d.ordinal);
  }
};

std::ostream& operator<<(std::ostream& os, const device& d);

// The host device every process has.
inline constexpr device host_device{device_kind::cpu, 0};

}  // namespace dlasync
