// The real CUDA runtime behind the seam: each call forwards to cudart.
#include <cuda_runtime_api.h>

#include <functional>
#include <memory>

#include "absl/strings/str_cat.h"
#include "runtime/src/cuda/real_cuda.hpp"

namespace dlasync::cuda {
namespace {

error as_error(cudaError_t e) {
  return static_cast<error>(static_cast<int>(e));
}

cudaStream_t as_stream(stream_t s) {
  return static_cast<cudaStream_t>(s);
}
cudaEvent_t as_event(event_t e) {
  return static_cast<cudaEvent_t>(e);
}

cudaMemcpyKind as_kind(memcpy_kind k) {
  switch (k) {
    case memcpy_kind::host_to_host: return cudaMemcpyHostToHost;
    case memcpy_kind::host_to_device: return cudaMemcpyHostToDevice;
    case memcpy_kind::device_to_host: return cudaMemcpyDeviceToHost;
    case memcpy_kind::device_to_device: return cudaMemcpyDeviceToDevice;
    case memcpy_kind::any: return cudaMemcpyDefault;
  }
  return cudaMemcpyDefault;
}

// Driver entry points, found through cudart at run time: linking the
// driver library would make the build need a driver to load.
struct driver_calls {
  int (*get_current)(void**) = nullptr;  // cuCtxGetCurrent
  int (*set_current)(void*) = nullptr;   // cuCtxSetCurrent

  driver_calls() {
    void* get = nullptr;
    void* set = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &get, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess ||
        cudaGetDriverEntryPointByVersion("cuCtxSetCurrent", &set, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      return;
    }
    get_current = reinterpret_cast<int (*)(void**)>(get);
    set_current = reinterpret_cast<int (*)(void*)>(set);
  }
};

class real_api final : public api {
 public:
  bool simulated() const noexcept override { return false; }

  error get_current_context(context_t* context) override {
    *context = nullptr;
    if (driver_.get_current == nullptr) return error::not_supported;
    return driver_.get_current(context) == 0 ? error::success : error::unknown;
  }
  error set_current_context(context_t context) override {
    if (driver_.set_current == nullptr) return error::not_supported;
    return driver_.set_current(context) == 0 ? error::success : error::unknown;
  }

  error get_device_count(int* count) override {
    *count = 0;
    return as_error(cudaGetDeviceCount(count));
  }
  error set_device(int device) override { return as_error(cudaSetDevice(device)); }
  error get_device(int* device) override { return as_error(cudaGetDevice(device)); }
  error get_device_properties(device_properties* p, int device) override {
    cudaDeviceProp prop{};
    if (cudaError_t e = cudaGetDeviceProperties(&prop, device); e != cudaSuccess) {
      return as_error(e);
    }
    p->name = prop.name;
    p->total_memory = prop.totalGlobalMem;
    p->async_engine_count = prop.asyncEngineCount;
    p->concurrent_managed_access = prop.concurrentManagedAccess != 0;
    p->major = prop.major;
    p->minor = prop.minor;
    return error::success;
  }
  error device_can_access_peer(int* can, int device, int peer) override {
    return as_error(cudaDeviceCanAccessPeer(can, device, peer));
  }
  error device_enable_peer_access(int peer) override {
    const cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);
    if (e == cudaErrorPeerAccessAlreadyEnabled) {
      (void)cudaGetLastError();  // not an error for us; clear it
      return error::success;
    }
    return as_error(e);
  }
  error stream_create(stream_t* s, stream_flags flags) override {
    cudaStream_t out = nullptr;
    const cudaError_t e = cudaStreamCreateWithFlags(
        &out, flags == stream_flags::non_blocking ? cudaStreamNonBlocking : cudaStreamDefault);
    *s = out;
    return as_error(e);
  }
  error stream_get_device(stream_t s, int* device) override {
#if CUDART_VERSION >= 12080
    return as_error(cudaStreamGetDevice(as_stream(s), device));
#else
    (void)s;
    (void)device;
    return as_error(cudaErrorNotSupported);
#endif
  }
  error stream_destroy(stream_t s) override {
    return as_error(cudaStreamDestroy(as_stream(s)));
  }
  error event_create(event_t* ev) override {
    cudaEvent_t out = nullptr;
    const cudaError_t e = cudaEventCreateWithFlags(&out, cudaEventDisableTiming);
    *ev = out;
    return as_error(e);
  }
  error event_destroy(event_t ev) override {
    return as_error(cudaEventDestroy(as_event(ev)));
  }
  error event_record(event_t ev, stream_t s, site) override {
    return as_error(cudaEventRecord(as_event(ev), as_stream(s)));
  }
  error event_query(event_t ev) override {
    return as_error(cudaEventQuery(as_event(ev)));
  }
  error stream_wait_event(stream_t s, event_t ev, site) override {
    return as_error(cudaStreamWaitEvent(as_stream(s), as_event(ev), 0));
  }
  error malloc_device(void** p, std::size_t bytes) override {
    return as_error(cudaMalloc(p, bytes));
  }
  error malloc_async(void** p, std::size_t bytes, stream_t s, site) override {
    return as_error(cudaMallocAsync(p, bytes, as_stream(s)));
  }
  error mem_pool_set_access(int device, int peer) override {
    cudaMemPool_t pool = nullptr;
    if (cudaError_t e = cudaDeviceGetDefaultMemPool(&pool, device); e != cudaSuccess) {
      return as_error(e);
    }
    cudaMemAccessDesc access{};
    access.location.type = cudaMemLocationTypeDevice;
    access.location.id = peer;
    access.flags = cudaMemAccessFlagsProtReadWrite;
    return as_error(cudaMemPoolSetAccess(pool, &access, 1));
  }
  error free_async(void* p, stream_t s, site) override {
    return as_error(cudaFreeAsync(p, as_stream(s)));
  }
  error malloc_host(void** p, std::size_t bytes) override {
    return as_error(cudaMallocHost(p, bytes));
  }
  error free_host(void* p) override {
    return as_error(cudaFreeHost(p));
  }
  error malloc_managed(void** p, std::size_t bytes) override {
    return as_error(cudaMallocManaged(p, bytes, cudaMemAttachGlobal));
  }
  error free_device(void* p) override {
    return as_error(cudaFree(p));
  }
  error memcpy_async(void* dst, const void* src, std::size_t bytes, memcpy_kind kind, stream_t s,
                     site) override {
    return as_error(cudaMemcpyAsync(dst, src, bytes, as_kind(kind), as_stream(s)));
  }
  error pointer_get_attributes(pointer_attributes* a, const void* p) override {
    cudaPointerAttributes attr{};
    const cudaError_t e = cudaPointerGetAttributes(&attr, p);
    if (e != cudaSuccess) return as_error(e);
    switch (attr.type) {
      case cudaMemoryTypeHost: a->type = memory_type::host; break;
      case cudaMemoryTypeDevice: a->type = memory_type::device; break;
      case cudaMemoryTypeManaged: a->type = memory_type::managed; break;
      default: a->type = memory_type::unregistered; break;
    }
    a->device = attr.device;
    return error::success;
  }
  error launch_host_func(stream_t s, std::function<void()> fn, site) override {
    auto* call = new std::function<void()>(std::move(fn));
    const cudaError_t e = cudaLaunchHostFunc(
        as_stream(s),
        [](void* arg) {
          std::unique_ptr<std::function<void()>> f(static_cast<std::function<void()>*>(arg));
          (*f)();
        },
        call);
    if (e != cudaSuccess) delete call;  // never enqueued
    return as_error(e);
  }
  error launch_kernel(std::shared_ptr<const device_kernel> kernel, stream_t s, site) override {
    // The launch copies the kernel's parameters: the object may go after.
    return kernel->launch(s);
  }
  error get_last_error() override {
    return as_error(cudaGetLastError());
  }
  error peek_at_last_error() override {
    return as_error(cudaPeekAtLastError());
  }

 private:
  driver_calls driver_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<api>> make_real_api() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    return absl::UnavailableError(
        absl::StrCat("no usable CUDA device in this process (cudaGetDeviceCount: ",
                     e != cudaSuccess ? cudaGetErrorName(e) : "0 devices",
                     "); use DLASYNC_CUDA=sim:N for simulated GPUs"));
  }
  return std::unique_ptr<api>(std::make_unique<real_api>());
}

}  // namespace dlasync::cuda
