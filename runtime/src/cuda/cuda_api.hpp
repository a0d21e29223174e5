// The CUDA seam (internal): every CUDA runtime call dlasync makes goes
// through `dlasync::cuda::api`. Two implementations stand behind it:
//   - the real CUDA runtime (cudart), in builds with DLASYNC_WITH_CUDA
//     (real_cuda.cpp);
//   - a simulated CUDA runtime (runtime/sim/) for machines without a GPU,
//     always reported as simulated.
// `make_api` picks one from a mode string: "off", "real", "sim:N" (N
// simulated GPUs) or "auto" (real when a device is present, else off). The
// environment variable DLASYNC_CUDA gives the mode when the runtime options
// leave it empty.
//
// Calls mirror cudart's, with the same error numbers, so the real
// implementation is a thin forwarding layer. Handles are opaque pointers;
// DLPack's stream values 1 (legacy default) and 2 (per-thread default) are
// valid stream handles, as in cudart. Kernels are objects (`device_kernel`)
// that the real runtime launches on the GPU and the simulated one runs on
// the host in stream order.
//
// The calls that put work on a stream, or touch memory the device may use,
// take the library's call site (defaulted): the simulation names it in its
// reports.
//
// Thread safety: implementations are safe to call from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dlasync/runtime.hpp"

namespace dlasync::cuda {

using stream_t = void*;
using event_t = void*;
using context_t = void*;

// The stream handle of a DLPack stream value (1, 2, or a cudaStream_t as an
// integer): DLPack passes streams as integers.
inline stream_t stream_from_dlpack(std::int64_t value) noexcept {
  // NOLINTNEXTLINE(performance-no-int-to-ptr): DLPack's encoding
  return reinterpret_cast<stream_t>(value);
}

// Where the library made a call, for the simulation's reports: as a
// defaulted parameter, `call_site::current()` is the caller's file and line
// (compiler builtins that g++ and clang 14 both have).
struct call_site {
  const char* file = "";
  unsigned line = 0;

  static constexpr call_site current(const char* file = __builtin_FILE(),
                                     unsigned line = __builtin_LINE()) noexcept {
    return {file, line};
  }
};

// cudaError_t values dlasync distinguishes; others pass through as numbers.
enum class error : int {
  success = 0,
  invalid_value = 1,
  memory_allocation = 2,
  initialization_error = 3,
  insufficient_driver = 35,
  no_device = 100,
  invalid_device = 101,
  invalid_resource_handle = 400,
  not_ready = 600,
  illegal_address = 700,
  peer_access_already_enabled = 704,
  peer_access_not_enabled = 705,
  misaligned_address = 716,
  launch_failure = 719,
  peer_access_unsupported = 217,
  not_supported = 801,
  unknown = 999,
};

// "cudaErrorMemoryAllocation"; the number for codes not listed above.
std::string error_name(error e);

enum class memcpy_kind : int {
  host_to_host = 0,
  host_to_device = 1,
  device_to_host = 2,
  device_to_device = 3,
  any = 4,  // cudaMemcpyDefault: inferred from the pointers (unified addressing)
};

enum class memory_type : int { unregistered = 0, host = 1, device = 2, managed = 3 };

struct pointer_attributes {
  memory_type type = memory_type::unregistered;
  int device = -1;
};

// How a stream orders itself against the device's legacy default stream
// (cudaStreamCreateWithFlags): a blocking stream waits for it and it waits
// for the blocking streams; a non-blocking stream takes no part.
enum class stream_flags : unsigned { blocking = 0, non_blocking = 1 };

// The copy on whose behalf the calling thread enqueues device work (0:
// none), set by `owner_scope`. The simulation tags the work with it, so
// that a DLPack deleter is checked against the work of its own import only:
// other imports may read the same memory, and their tensors hold it.
inline thread_local std::uint64_t work_owner = 0;

class owner_scope {
 public:
  explicit owner_scope(std::uint64_t owner) noexcept : saved_(work_owner) { work_owner = owner; }
  owner_scope(const owner_scope&) = delete;
  owner_scope& operator=(const owner_scope&) = delete;
  ~owner_scope() { work_owner = saved_; }

 private:
  std::uint64_t saved_;
};

// What the host does to memory that device work may also touch, for a
// runtime that checks stream order (the simulation's race checker):
// read it, write it, or give it up (a DLPack deleter, a staging chunk going
// back to its pool, a buffer being freed).
enum class host_use { read, write, release };

// A range of memory a kernel reads.
struct memory_range {
  const void* begin = nullptr;
  std::uint64_t bytes = 0;
};

struct device_properties {
  std::string name;
  std::uint64_t total_memory = 0;
  int async_engine_count = 0;
  bool concurrent_managed_access = false;
  int major = 0;
  int minor = 0;
};

// A kernel of dlasync's, launched through the seam: the real runtime calls
// `launch`, which launches the nvcc-built kernel with its parameters
// copied; the simulated runtime keeps the object and calls `simulate` on
// the stream's thread, in stream order. The kernel declares what it reads
// and writes, so that the simulation can check where that memory lies and
// the race checker can order it.
class device_kernel {
 public:
  virtual ~device_kernel() = default;
  // The kernel's name in errors and in the simulation's fault injection.
  virtual const char* name() const noexcept = 0;
  // The memory the kernel writes, and how many bytes: the simulation checks
  // it lies on the stream's device and charges the bytes to its timeline.
  virtual void* output() const noexcept = 0;
  virtual std::uint64_t output_bytes() const noexcept = 0;
  // The memory the kernel reads (for a gather: the source's extent).
  virtual std::vector<memory_range> inputs() const = 0;
  // Real GPUs: launches the kernel on `stream` of the current device and
  // returns the launch's own status, never an earlier call's.
  virtual error launch(stream_t stream) const = 0;
  // Simulated GPUs: the kernel's work, done on the host, with the loads and
  // stores the GPU makes. A fault the GPU would raise (misaligned_address
  // for a word not aligned to its size) is returned; the simulation then
  // fails the context with it, as a GPU does.
  virtual error simulate() const = 0;
};

class api {
 public:
  using site = call_site;

  virtual ~api() = default;

  // True for the simulated runtime.
  virtual bool simulated() const noexcept = 0;

  virtual error get_device_count(int* count) = 0;
  // The calling thread's current context (cuCtxGetCurrent), null when it
  // has none, and making it current again (cuCtxSetCurrent): dlasync leaves
  // a thread's CUDA state as it found it without cudaSetDevice, which
  // would open a context on a device the process may never use.
  // not_supported where the driver offers no entry point.
  virtual error get_current_context(context_t* context) = 0;
  virtual error set_current_context(context_t context) = 0;
  // Makes `device` current on the calling thread (and, as cudart 12 does,
  // opens its context).
  virtual error set_device(int device) = 0;
  virtual error get_device(int* device) = 0;
  virtual error get_device_properties(device_properties* properties, int device) = 0;
  virtual error device_can_access_peer(int* can, int device, int peer) = 0;
  // Enables access from the current device to `peer`'s memory.
  virtual error device_enable_peer_access(int peer) = 0;

  // A stream on the current device (cudaStreamCreateWithFlags).
  virtual error stream_create(stream_t* stream, stream_flags flags) = 0;
  // The device `stream` belongs to (cudaStreamGetDevice); the special
  // handles 1 and 2 name the current device's.
  virtual error stream_get_device(stream_t stream, int* device) = 0;
  virtual error stream_destroy(stream_t stream) = 0;
  // An event without timing, on the current device.
  virtual error event_create(event_t* event) = 0;
  virtual error event_destroy(event_t event) = 0;
  // Fails with invalid_resource_handle when the event and the stream belong
  // to different devices.
  virtual error event_record(event_t event, stream_t stream, site where = site::current()) = 0;
  // success when complete, not_ready when not yet, else the stream's error.
  virtual error event_query(event_t event) = 0;
  // The stream and the event may belong to different devices.
  virtual error stream_wait_event(stream_t stream, event_t event, site where = site::current()) = 0;

  // Device memory of the current device, usable on any stream once the
  // call returns (cudaMalloc); freed with free_device.
  virtual error malloc_device(void** pointer, std::size_t bytes) = 0;
  // Stream-ordered device memory from the default pool of `stream`'s
  // device (cudaMallocAsync), usable by work ordered after this point of
  // `stream`. Other devices reach it only once mem_pool_set_access granted
  // it: the pool does not follow peer access.
  virtual error malloc_async(void** pointer, std::size_t bytes, stream_t stream,
                             site where = site::current()) = 0;
  // Lets `peer` read and write the memory of `device`'s default pool
  // (cudaDeviceGetDefaultMemPool + cudaMemPoolSetAccess).
  virtual error mem_pool_set_access(int device, int peer) = 0;
  // Frees device memory in stream order: work ordered before this point of
  // `stream` may still use it, work after it must not.
  virtual error free_async(void* pointer, stream_t stream, site where = site::current()) = 0;
  // Page-locked host memory.
  virtual error malloc_host(void** pointer, std::size_t bytes) = 0;
  virtual error free_host(void* pointer) = 0;
  // Managed (unified) memory of the current device, readable by the host
  // and the GPUs (cudaMallocManaged).
  virtual error malloc_managed(void** pointer, std::size_t bytes) = 0;
  // Frees device or managed memory, once the device is done with it
  // (cudaFree).
  virtual error free_device(void* pointer) = 0;

  // Asynchronous for page-locked or device memory on both sides; with
  // pageable host memory the caller is held until the copy is staged, as the
  // driver does. `kind` must agree with where the pointers lie.
  virtual error memcpy_async(void* dst, const void* src, std::size_t bytes, memcpy_kind kind,
                             stream_t stream, site where = site::current()) = 0;
  virtual error pointer_get_attributes(pointer_attributes* attributes, const void* pointer) = 0;

  // Runs `fn` on a thread of the runtime once the work enqueued on `stream`
  // before it has run; later work waits for it (cudaLaunchHostFunc).
  virtual error launch_host_func(stream_t stream, std::function<void()> fn,
                                 site where = site::current()) = 0;

  // Launches `kernel` on `stream`, which must belong to the current device
  // (invalid_resource_handle otherwise). Returns the launch's own status.
  virtual error launch_kernel(std::shared_ptr<const device_kernel> kernel, stream_t stream,
                              site where = site::current()) = 0;

  // The calling thread's last error, which failing calls set; the first
  // returns and clears it (cudaGetLastError), the second leaves it. A
  // failed context's error is never cleared.
  virtual error get_last_error() = 0;
  virtual error peek_at_last_error() = 0;

  // Says that the host is about to `use` [pointer, pointer + bytes), memory
  // that device work may also touch; `what` names the use in reports. The
  // simulation checks that no device work the host has not seen complete
  // still touches it (only the work of copy `owner`, when not 0); the real
  // runtime does nothing.
  virtual void host_access(const void* pointer, std::uint64_t bytes, host_use use, const char* what,
                           std::uint64_t owner = 0, site where = site::current()) {
    (void)pointer;
    (void)bytes;
    (void)use;
    (void)what;
    (void)owner;
    (void)where;
  }
};

// Builds the API for `mode` ("off", "real", "auto", "sim", "sim:N"), with
// `simulation` describing simulated GPUs; nullptr for "off", or for "auto"
// without a usable device. InvalidArgument for a malformed mode, Unavailable
// for "real" without CUDA in the build or without a device.
absl::StatusOr<std::unique_ptr<api>> make_api(const std::string& mode,
                                              const simulated_gpu_options& simulation);

// A Status for a failed call: "cudaMallocAsync failed on cuda:1:
// cudaErrorMemoryAllocation (2)". ResourceExhausted for memory errors,
// Unavailable for missing drivers or devices, Internal otherwise.
absl::Status to_status(error e, const char* call, int device);

}  // namespace dlasync::cuda

// Returns the Status for a failed CUDA call from the enclosing function.
#define DLASYNC_CUDA_RETURN_IF_ERROR(call_name, device, expr)                    \
  do {                                                                           \
    if (const ::dlasync::cuda::error dlasync_cuda_error_ = (expr);               \
        dlasync_cuda_error_ != ::dlasync::cuda::error::success) [[unlikely]] {   \
      return ::dlasync::cuda::to_status(dlasync_cuda_error_, call_name, device); \
    }                                                                            \
  } while (false)
