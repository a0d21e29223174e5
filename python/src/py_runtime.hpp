// python/src/py_runtime.hpp
//
// `dlasync.Runtime` underneath: a dlasync runtime and the imports Python
// starts on it.
//
// The runtime is shut down with the GIL released (its deleters may need
// the GIL on the releaser), by shutdown(), by the destructor, or for every
// live runtime at interpreter exit (at_exit()). For a producer on a CUDA
// GPU, the runtime keeps one stream per GPU that it passes to
// `__dlpack__(stream=...)`, so that the producer orders its work before it,
// and that the import then follows (import_options::stream).
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "absl/status/statusor.h"
#include "dlasync/gpu_stream.hpp"
#include "dlasync/import_options.hpp"
#include "dlasync/runtime.hpp"
#include "py_async.hpp"
#include "py_source.hpp"

namespace dlasync::python {

// The keyword arguments every import takes.
struct import_args {
  pybind11::object device = pybind11::none();
  pybind11::object copy = pybind11::none();
  pybind11::object stream = pybind11::none();
  pybind11::object require_contiguous = pybind11::bool_(false);
  pybind11::object require_writable = pybind11::bool_(false);
};

class py_runtime {
 public:
  explicit py_runtime(runtime_options options);
  ~py_runtime();
  py_runtime(const py_runtime&) = delete;
  py_runtime& operator=(const py_runtime&) = delete;

  // Raises RuntimeError once shut down.
  runtime& get();
  bool closed() const noexcept { return rt_ == nullptr || !rt_->accepting(); }
  // Idempotent; the GIL is released while it waits.
  void shutdown();

  // `self` is the Python object of this runtime (the tensors' owner).
  // Synchronous: waits (GIL released) and returns a Tensor, or raises.
  pybind11::object from_dlpack(const pybind11::object& self, pybind11::handle x,
                               const import_args& a);
  // Asyncio: starts the import on `loop`. A view is made at once and
  // returned (a Tensor); else the result is a tuple (import_call, future),
  // the future resolved on the loop through its bridge (dlasync._bridge).
  // Raises at once what is wrong before the import starts, and a view's
  // refusal.
  pybind11::object start_import(const pybind11::object& self, pybind11::handle x,
                                const import_args& a, pybind11::handle loop);
  std::shared_ptr<import_call> start_batch(pybind11::object self, const pybind11::sequence& xs,
                                           const import_args& a,
                                           std::shared_ptr<loop_bridge> bridge,
                                           pybind11::handle future, bool return_exceptions);

  // Imports `source` (dlasync's own export) synchronously: the copies
  // Tensor.__dlpack__ makes for copy=True and dl_device.
  pybind11::object import_managed(const pybind11::object& self, managed_tensor source,
                                  const import_options& options);

  // Shuts down every live runtime (the GIL released meanwhile), then
  // closes the releaser: called once, from `atexit`.
  static void at_exit();

 private:
  // The synchronous import of a taken source: planned once, by begin_import.
  pybind11::object import_taken(const pybind11::object& self, taken_source& taken,
                                const import_options& options);
  // The asyncio loop's completion bridge (dlasync._bridge), made at the
  // loop's first import; the last loop's is remembered.
  static std::shared_ptr<loop_bridge> bridge_of(pybind11::handle loop);
  // A Tensor of this runtime, or the status raised as Python's exception.
  static pybind11::object tensor_or_raise(const pybind11::object& self, absl::StatusOr<tensor> t);
  import_options options_of(const import_args& a) const;
  // Takes `x`'s tensor (through its type's exchange API when it has one and
  // the caller named no stream) and sets options.stream to what it follows;
  // `batch` refuses a member that repeats another.
  taken_source take(pybind11::handle x, const import_args& a, import_options& options,
                    batch_members* batch = nullptr);
  // The stream to pass to `x.__dlpack__`, and to follow. A caller's stream
  // is checked against where `x` says its memory is (ValueError) before
  // anything calls `x.__dlpack__`.
  std::optional<std::int64_t> producer_stream(pybind11::handle x, const import_args& a);

  std::unique_ptr<runtime> rt_;
  std::mutex streams_mutex_;
  std::map<int, gpu_stream> streams_;
};

// "cpu", "cuda:1", (2, 1), a dlasync.Device: ValueError or TypeError when
// it is none of these.
device parse_device(pybind11::handle d);

}  // namespace dlasync::python
